"""Sweeps over (scheme, task, seed) cells that resume and spread over processes.

Each cell trains one model with `posenc.run` and writes `<out>/cells/<cell>.json`;
a cell whose file exists is never recomputed, so a sweep that dies resumes where it
stopped. Under `torchrun` (or any launcher that sets RANK and WORLD_SIZE) rank r runs
the cells i with i % world_size == r over a shared results folder, meets the other
ranks at a gloo barrier, and rank 0 merges every cell into `<out>/merged.json`:

    torchrun --nproc_per_node 4 -m posenc.sweep --profile full --out results/15_comparison_full
    python -m posenc.sweep --profile ci --out results/15_comparison_ci      # one process

The same command on several machines sharing the folder works too (one launcher each,
with --nnodes/--node_rank).
"""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .evaluate import run
from .registry import SCHEMES
from .table import Table
from .tasks import CharCorpus, SyntheticTask
from .train import TrainConfig

#: Model size, budget and evaluation lengths of each profile (identical for every scheme).
PROFILES = {
    "ci": dict(d_model=64, n_heads=4, n_layers=2, steps=300, batch_size=32, lr=2e-3, L_lm=64, L_syn=12,
               max_tokens=8192, n_samples=128, seeds=(0, 1, 2)),
    "full": dict(d_model=256, n_heads=8, n_layers=4, steps=4000, batch_size=64, lr=1e-3, L_lm=256, L_syn=16,
                 max_tokens=None, n_samples=512, seeds=(0, 1, 2)),
}
TASKS = ("lm", "copy", "reverse", "kback", "recall")
FACTORS_LM, FACTORS_SYN = (1, 2, 4, 8), (1, 2, 3, 4)


@dataclass(frozen=True)
class Cell:
    scheme: str
    task: str
    seed: int

    @property
    def key(self) -> str:
        return f"{self.scheme}__{self.task}__{self.seed}"


def grid(schemes, tasks, seeds) -> list[Cell]:
    unknown = [s for s in schemes if s not in SCHEMES]
    if unknown:
        raise ValueError(f"unknown schemes {unknown}; known schemes: {', '.join(sorted(SCHEMES))}")
    bad = [t for t in tasks if t not in TASKS]
    if bad:
        raise ValueError(f"unknown tasks {bad}; known tasks: {', '.join(TASKS)}")
    return [Cell(s, t, seed) for s in schemes for t in tasks for seed in seeds]


def make_task(name: str, size: dict):
    """The task object and its evaluation lengths and keyword arguments."""
    if name == "lm":
        corpus = CharCorpus.stdlib(train_length=size["L_lm"])
        return corpus, [f * size["L_lm"] for f in FACTORS_LM], {"max_tokens": size["max_tokens"]}
    task = SyntheticTask(name, train_length=size["L_syn"], k=2)
    return task, [f * size["L_syn"] for f in FACTORS_SYN], {"n_samples": size["n_samples"]}


def run_cell(cell: Cell, size: dict, device: str = "auto") -> Table:
    task, lengths, eval_kwargs = make_task(cell.task, size)
    cfg = TrainConfig(steps=size["steps"], batch_size=size["batch_size"], lr=size["lr"],
                      warmup=max(1, size["steps"] // 10), seed=cell.seed, device=device, progress=False)
    out = run(cell.scheme, task, cfg, causal=True, lengths=lengths, eval_kwargs=eval_kwargs,
              model_kwargs={k: size[k] for k in ("d_model", "n_heads", "n_layers")},
              label={"scheme": cell.scheme, "task": cell.task, "seed": cell.seed})
    return out["table"]


def run_sweep(cells, out: str | Path, size: dict, rank: int = 0, world_size: int = 1, device: str = "auto") -> list[str]:
    """Run this rank's share of the cells that have no result yet; returns the keys it ran."""
    folder = Path(out) / "cells"
    folder.mkdir(parents=True, exist_ok=True)
    ran = []
    for i, cell in enumerate(cells):
        path = folder / f"{cell.key}.json"
        if i % world_size != rank or path.exists():
            continue
        rows = run_cell(cell, size, device)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"cell": asdict(cell), "rank": rank, "rows": list(rows)}))
        os.replace(tmp, path)
        ran.append(cell.key)
    return ran


def merge(out: str | Path, cells) -> Table:
    """All cells' rows in grid order, written to `<out>/merged.json`; raises if one is missing."""
    folder = Path(out) / "cells"
    missing = [c.key for c in cells if not (folder / f"{c.key}.json").exists()]
    if missing:
        raise RuntimeError(f"{len(missing)} cells have no result yet, e.g. {missing[:3]}")
    rows = Table(r for c in cells for r in json.loads((folder / f"{c.key}.json").read_text())["rows"])
    rows.to_json(Path(out) / "merged.json")
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", choices=tuple(PROFILES), default="ci")
    parser.add_argument("--out", required=True, help="results folder shared by all ranks")
    parser.add_argument("--schemes", nargs="+", default=None, help="default: every registered scheme")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--seeds", nargs="+", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None, help="override the profile's training steps")
    parser.add_argument("--device", default="auto")
    args = parser.parse_args(argv)
    size = dict(PROFILES[args.profile])
    if args.steps is not None:
        size["steps"] = args.steps
    cells = grid(args.schemes or sorted(SCHEMES), args.tasks, args.seeds or size["seeds"])
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if world > 1:
        torch.distributed.init_process_group("gloo")
    device = args.device
    if device == "auto" and torch.cuda.is_available() and world > 1:
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0)) % torch.cuda.device_count()}"
    ran = run_sweep(cells, args.out, size, rank, world, device)
    print(f"rank {rank}/{world}: ran {len(ran)} cells")
    if world > 1:
        torch.distributed.barrier()
    if rank == 0:
        print(f"merged {len(merge(args.out, cells))} rows into {Path(args.out) / 'merged.json'}")
    if world > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
