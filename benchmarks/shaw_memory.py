"""Shaw et al.'s two position terms: activation memory of the naive [N, N, d] version vs the gather.

    python benchmarks/shaw_memory.py [--lengths 128 256 512 1024] [--k 16]

Counts the bytes autograd saves for the backward pass (one layer, one process). The
naive version stores a^K and a^V as [N, N, d_h] tensors; the gather stores [B, H, N, 2k+1]
projections and the [B, H, N, N] weights that every attention keeps anyway.
"""
import argparse

import posenc  # noqa: F401
from posenc.bench.costs import shaw_memory_table

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512, 1024])
    ap.add_argument("--k", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    a = ap.parse_args()
    print(shaw_memory_table(a.lengths, batch_size=a.batch_size, n_heads=a.heads, head_dim=a.head_dim, k=a.k).round(2))
