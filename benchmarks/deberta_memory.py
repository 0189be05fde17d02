"""Peak memory of DeBERTa's c2p + p2c: the gather algorithm vs the naive [N, N, d] gather.

    python benchmarks/deberta_memory.py                 # N = 512, 1024, 2048 on CPU (or CUDA if present)
    python benchmarks/deberta_memory.py --heads 12 --k 256 --device cuda

Each measurement runs in a fresh process: on CPU the peak is the peak resident set
size (Linux VmHWM, reset through /proc/self/clear_refs just before the call) minus the
resident size with the inputs in place, with glibc told to mmap every allocation of
64 KiB or more (MALLOC_MMAP_THRESHOLD_) so that freed memory is returned, not reused
unseen; on CUDA it is torch.cuda.max_memory_allocated over the inputs. The naive path builds
K_r[delta(i, j)] and Q_r[delta(j, i)], two [H, N, N, d_h] tensors; the gather path
(posenc.deberta.c2p_p2c) only [B, H, N, 2k] products and the [B, H, N, N] result.
Runs whose naive tensors alone would exceed --max-gib are skipped (size printed).
Never part of the tests: it allocates gigabytes at N = 2048.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

GIB = 2 ** 30


def measure(impl: str, n: int, heads: int, head_dim: int, k: int, device: str) -> dict:
    """Peak extra bytes and seconds of one call of `impl` ("gather" or "naive"), in this process."""
    import torch

    from posenc.deberta import c2p_p2c, c2p_p2c_naive, relative_distance
    torch.manual_seed(0)
    q, kc = (torch.randn(1, heads, n, head_dim, device=device) for _ in range(2))
    q_r, k_r = (torch.randn(heads, 2 * k, head_dim, device=device) for _ in range(2))
    index = relative_distance(n, n, k).to(device)
    fn = c2p_p2c if impl == "gather" else c2p_p2c_naive
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")                                                 # reset VmHWM to the current RSS
        base = _status("VmRSS")
    t0 = time.perf_counter()
    out = fn(q, kc, q_r, k_r, index)
    if device == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = _status("VmHWM") - base
    return {"peak_bytes": int(peak), "seconds": time.perf_counter() - t0, "out_bytes": out.numel() * out.element_size()}


def _status(field: str) -> int:
    """A size field of /proc/self/status, in bytes."""
    with open("/proc/self/status") as f:
        return int(re.search(rf"{field}:\s+(\d+) kB", f.read()).group(1)) * 1024


def run_child(impl, n, args) -> dict:
    cmd = [sys.executable, __file__, "--child", impl, str(n), "--heads", str(args.heads), "--head-dim",
           str(args.head_dim), "--k", str(args.k), "--device", args.device]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048])
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--k", type=int, default=256, help="relative span k (DeBERTa-base: 256 buckets per side)")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--max-gib", type=float, default=4.0, help="skip naive runs needing more than this")
    parser.add_argument("--child", nargs=2, metavar=("IMPL", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.device == "auto":
        import torch
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.child:
        print(json.dumps(measure(args.child[0], int(args.child[1]), args.heads, args.head_dim, args.k, args.device)))
        return
    print(f"device={args.device} heads={args.heads} head_dim={args.head_dim} k={args.k} (batch 1, float32)")
    print(f"{'N':>6} {'one [N,N,d]':>16} {'naive peak':>12} {'gather peak':>12} {'ratio':>7} "
          f"{'naive s':>8} {'gather s':>9}")
    for n in args.lengths:
        nnd = args.heads * n * n * args.head_dim * 4                     # one [H, N, N, d_h] float32 tensor
        gather = run_child("gather", n, args)
        if nnd / GIB > args.max_gib:
            naive, ratio = None, float("nan")
        else:
            naive = run_child("naive", n, args)
            ratio = naive["peak_bytes"] / max(gather["peak_bytes"], 1)
        print(f"{n:>6} {nnd / GIB:>14.2f} G {_gib(naive):>12} {_gib(gather):>12} {ratio:>7.1f} "
              f"{naive['seconds'] if naive else float('nan'):>8.2f} {gather['seconds']:>9.3f}")


def _gib(m) -> str:
    return "skipped" if m is None else f"{m['peak_bytes'] / GIB:.3f} G"


if __name__ == "__main__":
    main()
