"""The sweep: a 2-process CPU run under torchrun (gloo) splits cells, merges, resumes."""
import json
import os
import subprocess
import sys

import pytest

from posenc import sweep


def launch(out, *extra):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517",
           "-m", "posenc.sweep", "--out", str(out), "--schemes", "nope", "alibi", "--tasks", "kback",
           "--seeds", "0", "1", "--steps", "3", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


def test_two_process_sweep_splits_merges_and_resumes(tmp_path):
    done = launch(tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    cells = sweep.grid(["nope", "alibi"], ["kback"], [0, 1])
    files = {c.key: json.loads((tmp_path / "cells" / f"{c.key}.json").read_text()) for c in cells}
    assert sorted(f["rank"] for f in files.values()) == [0, 0, 1, 1]        # both ranks worked
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert len(merged) == 4 * len(sweep.FACTORS_SYN)
    assert {(r["scheme"], r["seed"]) for r in merged} == {("nope", 0), ("nope", 1), ("alibi", 0), ("alibi", 1)}
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "cells").iterdir()}
    again = launch(tmp_path)                                                # resume: nothing left to run
    assert again.returncode == 0 and "ran 0 cells" in again.stdout
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "cells").iterdir()} == stamps


def test_merge_refuses_a_missing_cell(tmp_path):
    (tmp_path / "cells").mkdir()
    with pytest.raises(RuntimeError, match="1 cells have no result"):
        sweep.merge(tmp_path, sweep.grid(["nope"], ["kback"], [0]))


def test_grid_rejects_unknown_names():
    with pytest.raises(ValueError, match="unknown schemes"):
        sweep.grid(["nope", "bogus"], ["kback"], [0])
    with pytest.raises(ValueError, match="unknown tasks"):
        sweep.grid(["nope"], ["sorting"], [0])
