"""Run a notebook's code cells as one plain Python program: no Jupyter needed.

Usage:
    python scripts/run_as_script.py notebooks/11_rope.ipynb --profile full
    python scripts/run_as_script.py notebooks/11_rope.ipynb --profile full --smoke --workdir /tmp/w

For a GPU machine that has PyTorch but no Jupyter (a cloud VM, a cluster node): the
cells run in order in one namespace, with cwd ``<workdir>/notebooks`` so the notebook
writes ``<workdir>/results/`` (default workdir: the repository), exactly what the
notebook would write under papermill. Figures go to the Agg backend (not shown);
the wall time of each cell is printed.

``--smoke`` checks the code path of a profile in seconds: after the cell that defines
``SIZE`` the step counts become 3, batches 4, one seed is kept, evaluation is capped at 2048
tokens, and on a CPU the training loop runs under bf16 autocast, as it would on a
GPU. Use it with a scratch ``--workdir``: its numbers mean nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMOKE_STEPS = ("steps", "ft_steps", "sweep_steps")


def code_cells(path: Path) -> list[tuple[list[str], str]]:
    """(tags, source) of each code cell, IPython magics and shell lines dropped."""
    nb = json.loads(path.read_text())
    cells = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"])
        src = "\n".join(line for line in src.splitlines() if not line.lstrip().startswith(("%", "!")))
        cells.append((cell.get("metadata", {}).get("tags", []), src))
    return cells


def shrink(size: dict) -> None:
    """The --smoke sizes: a few steps, one seed, short evaluation."""
    for key in SMOKE_STEPS:
        if key in size:
            size[key] = 3
    if "seeds" in size:
        size["seeds"] = list(size["seeds"])[:1]
    for key in ("batch_size", "ft_batch"):
        if key in size:
            size[key] = 4
    if "max_tokens" in size:
        size["max_tokens"] = 2048


def emulate_gpu_precision() -> None:
    """On a CPU, train under bf16 autocast as the loop does on a GPU (catches dtype bugs)."""
    import torch

    import posenc.train  # noqa: F401  (the module; posenc.train is also the function)
    if not torch.cuda.is_available():
        sys.modules["posenc.train"].amp_dtype = lambda amp, device: None if amp == "off" else torch.bfloat16


def run(path: Path, profile: str, smoke: bool, workdir: Path) -> int:
    """Execute the code cells of `path` in one namespace with cwd <workdir>/notebooks; 0 or 1."""
    cwd = workdir / "notebooks"
    cwd.mkdir(parents=True, exist_ok=True)
    os.chdir(cwd)
    if smoke:
        emulate_gpu_precision()
    ns = {"__name__": "__main__", "display": print}
    shrunk = False
    for i, (tags, src) in enumerate(code_cells(path)):
        if "injected-parameters" in tags:
            continue
        t0 = time.perf_counter()
        try:
            exec(compile(src, f"{path.name}[cell {i}]", "exec"), ns)
            if "parameters" in tags:
                ns["profile"] = profile
        except Exception:
            traceback.print_exc()
            print(f"FAILED {path.name} at cell {i}", flush=True)
            return 1
        if smoke and not shrunk and isinstance(ns.get("SIZE"), dict):
            shrink(ns["SIZE"])
            shrunk = True
        print(f"[{path.name} cell {i}] {time.perf_counter() - t0:.1f} s", flush=True)
        import matplotlib.pyplot as plt
        plt.close("all")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("notebook", type=Path)
    p.add_argument("--profile", default="auto", choices=["auto", "ci", "full"])
    p.add_argument("--smoke", action="store_true", help="a few steps only, to check the code path")
    p.add_argument("--workdir", type=Path, default=ROOT,
                   help="folder holding notebooks/ (cwd) and results/ (written); default: the repository")
    a = p.parse_args(argv)
    os.environ.setdefault("MPLBACKEND", "Agg")  # set here, not in run(): child processes inherit it
    sys.path.insert(0, str(ROOT))
    path = a.notebook.resolve()
    if not path.exists():
        p.error(f"notebook {a.notebook} does not exist")
    if a.workdir.resolve() != ROOT and (ROOT / "results").exists() and not (a.workdir / "results").exists():
        shutil.copytree(ROOT / "results", a.workdir / "results")  # chapters read stored results too
    return run(path, a.profile, a.smoke, a.workdir.resolve())


if __name__ == "__main__":
    sys.exit(main())
