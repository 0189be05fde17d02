"""Peak memory of DeBERTa's c2p + p2c: the gather algorithm vs the naive [N, N, d] gather.

    python benchmarks/deberta_memory.py                 # N = 512, 1024, 2048 on CPU (or CUDA if present)
    python benchmarks/deberta_memory.py --heads 12 --k 256 --device cuda

Each measurement runs in a fresh process; how the peak is read is described in
`posenc.bench.memory` (also section `memory` of `python -m posenc.bench`). Runs whose
naive tensors alone would exceed --max-gib are skipped. Never part of the tests: it
allocates gigabytes at N = 2048.
"""
import argparse

import torch

from posenc.bench import machine
from posenc.bench.memory import deberta_memory

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048])
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--k", type=int, default=256, help="relative span k (DeBERTa-base: 256 buckets per side)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--max-gib", type=float, default=4.0, help="skip naive runs needing more than this")
    a = p.parse_args()
    print(f"{machine(a.device)}; heads={a.heads} head_dim={a.head_dim} k={a.k} (batch 1, float32)")
    print(deberta_memory(a.lengths, heads=a.heads, head_dim=a.head_dim, k=a.k, device=a.device,
                         max_gib=a.max_gib).round(3))
