"""Peak memory of DeBERTa's c2p + p2c: the gather algorithm vs the naive [N, N, d] gather.

    python benchmarks/deberta_memory.py                 # N = 512, 1024, 2048 on CPU (or CUDA if present)
    python benchmarks/deberta_memory.py --heads 12 --k 256 --device cuda
    python benchmarks/deberta_memory.py --save          # the defaults, written to results/bench/09_deberta.json

Each measurement runs in a fresh process; how the peak is read is described in
`posenc.bench.memory` (also section `memory` of `python -m posenc.bench`). Runs whose
naive tensors alone would exceed --max-gib are skipped. Never part of the tests: it
allocates gigabytes at N = 2048.
"""
import argparse
import json
from pathlib import Path

import torch

from posenc.bench import machine
from posenc.bench.memory import deberta_memory
from posenc.runs.store import atomic_write

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048])
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--k", type=int, default=256, help="relative span k (DeBERTa-base: 256 buckets per side)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--max-gib", type=float, default=4.0, help="skip naive runs needing more than this")
    p.add_argument("--save", action="store_true", help="write results/bench/09_deberta.json (chapter 09 shows it)")
    a = p.parse_args()
    setup = f"{machine(a.device)}; heads={a.heads} head_dim={a.head_dim} k={a.k} (batch 1, float32)"
    table = deberta_memory(a.lengths, heads=a.heads, head_dim=a.head_dim, k=a.k, device=a.device,
                           max_gib=a.max_gib).round(3)
    print(setup)
    print(table)
    if a.save:
        path = Path(__file__).resolve().parent.parent / "results" / "bench" / "09_deberta.json"
        atomic_write(path, json.dumps({"setup": setup, "rows": list(table)}, indent=1) + "\n")
        print(f"saved {path}")
