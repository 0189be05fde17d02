"""The runs a device call brought back, put into this checkout's store (scripts/device_unpack.sh calls it).

    python scripts/unpack_runs.py FILES_AT [STORE]        STORE: results/full/runs by default

FILES_AT holds what the call left under $OUT: the final archive, split into parts store.tgz.0, .1, ...
(scripts/pack_new.sh), and an interim archive, interim.tgz, that the window re-packs while the runner runs
(so that a call killed at its time limit still brings back what had finished). Each is read as a gzip'd tar
stream, interim first, then the parts joined in numeric order: a member is written only once it has been
read whole, through posenc.runs.store.atomic_write, so an archive cut short (a part missing, a call killed
while it split) gives every whole member before the cut and never half a file. Only plain files named
<key>.json or <key>.pt (16 hex digits) are taken, and only into STORE. Prints what it took, what it
skipped and where a read stopped; it exits 0 even then, so that the caller goes on to copy cuda.json and
set the weights aside.
"""
from __future__ import annotations

import re
import sys
import tarfile
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from posenc.runs.store import atomic_write  # noqa: E402

NAME = re.compile(r"^[0-9a-f]{16}\.(json|pt)$")


class _Joined:
    """The files as one read-only stream, in order, each closed once read."""

    def __init__(self, paths):
        self.files = [open(p, "rb") for p in paths]

    def read(self, n=-1):
        out = b""
        while self.files and (n < 0 or len(out) < n):
            chunk = self.files[0].read(-1 if n < 0 else n - len(out))
            if not chunk:
                self.files.pop(0).close()
                continue
            out += chunk
        return out


def members(stream, label: str):
    """(name, bytes) of each regular member read whole from the tar.gz `stream`; stops at the first error."""
    try:
        with tarfile.open(fileobj=stream, mode="r|gz") as tar:
            for m in tar:
                if not m.isfile():
                    continue
                member = tar.extractfile(m)            # a regular member: never None
                assert member is not None
                data = member.read()
                if len(data) != m.size:
                    raise EOFError(f"{m.name}: {len(data)} of {m.size} bytes")
                yield m.name, data
    except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
        print(f"{label}: read stopped ({type(err).__name__}: {err}); the members before it are kept")


def unpack(files_at: Path, store: Path) -> int:
    parts = sorted((p for p in files_at.glob("store.tgz.*") if p.suffix[1:].isdigit()), key=lambda p: int(p.suffix[1:]))
    sources = [("interim.tgz", _Joined([files_at / "interim.tgz"]))] if (files_at / "interim.tgz").exists() else []
    if parts:
        sources.append((f"{len(parts)} part(s)", _Joined(parts)))
    if not sources:
        print(f"no archive in {files_at}: no runs came back")
        return 0
    for label, stream in sources:
        taken, skipped = 0, []
        for name, data in members(stream, label):
            path = Path(name)
            if path.parent.as_posix() != store.as_posix() or not NAME.match(path.name):
                skipped.append(name)
                continue
            atomic_write(store / path.name, data)
            taken += 1
        print(f"{label}: {taken} file(s) written into {store}" + (f"; skipped {skipped}" if skipped else ""))
    return 0


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    sys.exit(unpack(Path(sys.argv[1]), Path(sys.argv[2] if len(sys.argv) == 3 else "results/full/runs")))
