"""Forward+backward time of `posenc.rotary` against two references and a memory-bound floor.

    python benchmarks/rope_bench.py [--shape 8 8 512 64] [--threads 1] [--repeats 30] [--save]

The measurement is `posenc.bench.kernels.rope_times` (also section `rope` of
`python -m posenc.bench`): both layouts of ours (and the half layout's compiled kernel) against transformers' LLaMA
`apply_rotary_pos_emb` (half) and rotary-embedding-torch (interleaved), and the floor
y = x * c over the same tensors; best of `repeats` round-robin runs, process CPU time
by default (steadier on a shared machine; equal to wall time with one idle thread).
`--save` writes results/bench/11_rope.json, which notebooks/11_rope shows.
"""
import argparse
import json
from pathlib import Path

import torch

from posenc.bench import machine
from posenc.bench.kernels import rope_times
from posenc.runs.store import atomic_write

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", type=int, nargs=4, default=[8, 8, 512, 64], metavar=("B", "H", "T", "D"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    p.add_argument("--save", action="store_true", help="write results/bench/11_rope.json")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    table = rope_times(tuple(a.shape), repeats=a.repeats, clock=a.clock)
    setup = f"q, k: {a.shape} float32, forward + backward, best of {a.repeats} ({a.clock} time); {machine()}"
    print(setup)
    print(table.round(3))
    if a.save:
        path = Path(__file__).resolve().parent.parent / "results" / "bench" / "11_rope.json"
        atomic_write(path, json.dumps({"setup": setup, "rows": list(table.round(3))}, indent=1) + "\n")
