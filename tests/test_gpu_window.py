"""The prepared GPU job (scripts/gpu_window.sh), rehearsed on the CPU in a throwaway copy of the repository.

A device is lent rarely and for 15 minutes: the job must end inside its call with the store packed, whether
the deadline stops the runner or the tier is done, and the copy's store must come back whole. The
rehearsal runs the real script with `--device cpu` and one chapter; only the training itself differs.
"""
import os
import shutil
import subprocess
import tarfile
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STORE = Path("results") / "full" / "runs"


@pytest.fixture
def repo(tmp_path):
    """posenc, scripts and the `full` store copied to a folder of their own (the store is the copy's)."""
    copy = tmp_path / "repo"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("posenc", "scripts"):
        shutil.copytree(ROOT / name, copy / name, ignore=ignore)
    shutil.copytree(ROOT / STORE, copy / STORE)
    return copy


def window(repo: Path, **env) -> tuple[subprocess.CompletedProcess, float, Path]:
    out = repo / "out"
    environ = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    environ.update({"OUT": str(out), "DEVICE": "cpu", "STACK": "0", "WORKERS": "1"}, **env)
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "scripts/gpu_window.sh"], cwd=repo, env=environ, capture_output=True, text=True,
                          timeout=300)
    return proc, time.monotonic() - t0, out


def probe_wheel(folder: Path) -> str:
    """A minimal pure-Python wheel (module posenc_probe) in `folder`, standing in for scripts/device_wheels.sh's."""
    name = "posenc_probe-0.1-py3-none-any.whl"
    info = "posenc_probe-0.1.dist-info"
    files = {"posenc_probe.py": "VALUE = 1\n",
             f"{info}/METADATA": "Metadata-Version: 2.1\nName: posenc-probe\nVersion: 0.1\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    folder.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(folder / name, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
        z.writestr(f"{info}/RECORD", "".join(f"{path},,\n" for path in [*files, f"{info}/RECORD"]))
    return name


def packed(archive: Path) -> set[str]:
    with tarfile.open(archive) as tar:
        return {Path(m.name).name for m in tar.getmembers() if m.isfile()}


def test_a_window_that_reaches_its_deadline_stops_the_runner_and_brings_the_store_back(repo):
    stored = {p.name for p in (repo / STORE).glob("*.json")}
    proc, seconds, out = window(repo, CHAPTERS="01_learned", DEADLINE="15")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert seconds < 15 + 60, f"the job took {seconds:.0f} s, past its budget (DEADLINE + 60 s)"
    log = (out / "runner.log").read_text()
    assert "left for the next call" in log and "steps/s in all" in log, log
    listing = (out / "dry_run.txt").read_text()
    assert "== before" in listing and "== after" in listing and "cost model refitted" in listing, listing
    assert listing.count("01_learned") == 4, listing            # cpu and cuda lines, before and after
    assert str(repo / STORE) in listing, listing                # the copy's posenc and store, never the checkout's
    assert packed(out / "full_store.tgz") == stored             # nothing was finished: the store comes back as it was
    assert len(list(out.iterdir())) <= 7                        # the device tool brings back 8 files at most
    assert "cuda.json" not in {p.name for p in out.iterdir()}   # the cost table waits for a finished tier


def test_a_window_with_the_tier_done_packs_the_store_before_it_starts_the_cost_table(repo, tmp_path):
    wheel = probe_wheel(repo / ".whl")                           # carried reference libraries are installed first
    proc, seconds, out = window(repo, CHAPTERS="12_cnn_zero_padding", DEADLINE="15", BUDGET="200",
                                SITE=str(tmp_path / "site"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"carried wheels installed: {wheel}" in proc.stdout, proc.stdout[-2000:]
    assert (tmp_path / "site" / "posenc_probe.py").exists()
    assert "nothing to run" in (out / "runner.log").read_text()
    assert "the full tier is done" in proc.stdout, proc.stdout[-2000:]
    # On this CPU the cost table's benchmark refuses `--device cuda` by name; on a GPU it fills cuda.json.
    assert "no CUDA device" in (out / "bench.log").read_text()
    assert packed(out / "full_store.tgz") == {p.name for p in (ROOT / STORE).glob("*.json")}
    assert seconds < 200
