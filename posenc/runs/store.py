"""The store: one JSON record per finished run, `results/<profile>/runs/<key>.json`.

Records are written atomically (a temporary file in the same folder, then a rename), so
a killed process leaves either the old file or the new one, never half of one. A record
that cannot be read is reported with its path and treated as missing: the run is done
again and the file replaced, never merged.
"""
from __future__ import annotations

import glob
import json
import os
import io
import tempfile
import warnings
from pathlib import Path

import torch

from ..table import Table
from .spec import RunSpec

PROFILES = ("ci", "paper", "full")
#: The environment variable that moves the `ci` store (the test run points it at an empty folder).
CI_STORE_ENV = "POSENC_CI_STORE"


def results_root() -> Path:
    """`results/` of the repository holding this package (an editable install or a checkout);
    `./results` when the package is installed elsewhere."""
    repo = Path(__file__).resolve().parents[2]
    if (repo / "results").is_dir() and (repo / "posenc").is_dir():
        return repo / "results"
    return Path.cwd() / "results"


def _umask() -> int:
    """The process's umask (read by setting it, then restoring it at once: done once, at import, before any
    thread of ours writes)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: Files the store writes get the mode a plain open() would give them.
FILE_MODE = 0o666 & ~_umask()


def atomic_write(path: Path, data: bytes | str) -> Path:
    """Write `data` to `path` through a temporary file in the same folder and a rename.

    The temporary file is `.<name>.<pid>-<random>.tmp`. A process killed between the two (SIGKILL, a GPU
    window's deadline) leaves it behind; a later write of the same path removes it once its writer's pid is
    gone. One whose writer still runs stays: it may be writing now (two ranks, or two sessions, on one
    store)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        writer = stale.name[len(path.name) + 2:-len(".tmp")]            # "<pid>-<random>": no dot in it
        if "." not in writer and not _running(writer.partition("-")[0]):
            stale.unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.chmod(tmp, FILE_MODE)                 # mkstemp's 0600 would make the store private to one user
        except OSError:                              # a mount that refuses chmod: the file is still written
            pass
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _running(pid: str) -> bool:
    """Whether the process `pid` (digits; anything else: not a writer's pid) runs on this machine."""
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:                          # another user's process: it runs
        return True
    return True


def atomic_torch_save(path: Path, obj) -> Path:
    """`torch.save(obj)` written to `path` by `atomic_write`: a killed process leaves the old file or the new
    one, and no fixed-name temporary file for two writers to share."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return atomic_write(path, buffer.getvalue())


def inside(folder: Path, name: str) -> Path:
    """`folder / name`, refusing names that would leave the folder (`../x`, absolute paths)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty str; got {name!r}")
    path = (Path(folder) / name).resolve()
    if Path(folder).resolve() not in path.parents:
        raise ValueError(f"name {name!r} would write outside {folder}")
    return path


class Record(dict):
    """A stored run: spec, table, history, machine, version, seconds (a dict, plus helpers)."""

    @property
    def spec(self) -> RunSpec:
        return RunSpec.from_dict(self["spec"])

    @property
    def table(self) -> Table:
        return Table(self["table"])

    @property
    def history(self) -> list:
        return self.get("history") or []

    def rows(self, **label) -> Table:
        """The evaluation table with `label` columns put first (e.g. scheme=..., seed=...)."""
        return Table({**label, **r} for r in self["table"])

    def state_dict(self) -> dict:
        """The trained weights (records made with keep_weights=True), loaded with weights_only=True."""
        path = self.get("_weights_path")
        if not path or not Path(path).exists():
            raise FileNotFoundError(f"run {self['key']} has no stored weights (declare it with keep_weights=True)")
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as err:
            raise ValueError(f"weights file {path} is corrupt ({err}); delete it and its record to rerun") from err


class Store:
    """The records of one profile under `root/<profile>/runs/`."""

    def __init__(self, profile: str, root: str | Path | None = None):
        if profile not in PROFILES:
            raise ValueError(f"profile must be one of {PROFILES}; got {profile!r}")
        if root is not None and not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"root must be a folder (str or path) or None; got {type(root).__name__}")
        if root is None:
            env = os.environ.get(CI_STORE_ENV)
            root = Path(env) if profile == "ci" and env else results_root()
        self.profile, self.root = profile, Path(root)
        self.folder = self.root / profile / "runs"

    def __repr__(self) -> str:
        return f"Store({self.profile!r}, {str(self.root)!r})"

    def path(self, spec: RunSpec) -> Path:
        return self.folder / f"{spec.key}.json"

    def weights_path(self, spec: RunSpec) -> Path:
        return self.folder / f"{spec.key}.pt"

    def get(self, spec: RunSpec) -> Record | None:
        """The record of `spec`, or None when it is missing or unreadable (reported, then rerun)."""
        if not isinstance(spec, RunSpec):
            raise TypeError(f"spec must be a RunSpec; got {type(spec).__name__} (RunSpec.from_dict reads a dict)")
        path = self.path(spec)
        if not path.exists():
            return None
        try:
            data = json.loads(path.read_text())
            if data.get("key") != spec.key or RunSpec.from_dict(data["spec"]).key != spec.key:
                raise ValueError("its spec does not hash to its file name")
            if spec.keep_weights and not self.weights_path(spec).exists():
                raise ValueError("its weights file is missing")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError, AttributeError) as err:
            warnings.warn(f"corrupt run record {path} ({err}); it will be rerun and replaced", stacklevel=2)
            return None
        record = Record(data)
        if spec.keep_weights:
            record["_weights_path"] = str(self.weights_path(spec))
        return record

    def put(self, spec: RunSpec, record: dict, state_dict: dict | None = None) -> Record:
        """Write the record (and the weights first, if any) atomically; returns it as stored."""
        if spec.keep_weights:
            if state_dict is None:
                raise ValueError(f"spec {spec.key} keeps weights but none were given")
            atomic_torch_save(self.weights_path(spec), state_dict)
        record = {**record, "key": spec.key, "spec": spec.to_dict(), "profile": self.profile}
        atomic_write(self.path(spec), json.dumps(record, indent=1, allow_nan=True) + "\n")
        stored = self.get(spec)
        if stored is None:
            raise RuntimeError(f"the record of spec {spec.key} was written to {self.path(spec)} but does not read back")
        return stored

    def keys(self) -> set[str]:
        return {p.stem for p in self.folder.glob("*.json")} if self.folder.is_dir() else set()
