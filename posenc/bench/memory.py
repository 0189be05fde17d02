"""Peak memory of DeBERTa's c2p + p2c: the gather algorithm vs the naive [N, N, d] gather.

Each measurement runs in a fresh process (`python -m posenc.bench.memory IMPL N ...`):
on CPU the peak is the peak resident set size (Linux VmHWM, reset through
/proc/self/clear_refs just before the call) minus the resident size with the inputs in
place, with glibc told to mmap every allocation of 64 KiB or more
(MALLOC_MMAP_THRESHOLD_) so that freed memory is returned, not reused unseen; on CUDA
it is torch.cuda.max_memory_allocated over the inputs. The naive path builds
K_r[delta(i, j)] and Q_r[delta(j, i)], two [H, N, N, d_h] tensors; the gather path
(posenc.deberta.c2p_p2c) only [B, H, N, 2k] products and the [B, H, N, N] result.
(Shaw's terms are counted by `posenc.bench.costs.shaw_memory_table`, from the bytes autograd saves.)
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

    from ..schemes.deberta import c2p_p2c, c2p_p2c_naive, relative_distance
    torch.manual_seed(0)
    q, kc = (torch.randn(1, heads, n, head_dim, device=device) for _ in range(2))
    q_r, k_r = (torch.randn(heads, 2 * k, head_dim, device=device) for _ in range(2))
    index = relative_distance(n, n, k).to(device)
    fn = c2p_p2c if impl == "gather" else c2p_p2c_naive
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")                                                 # reset VmHWM to the current RSS
        base = _status("VmRSS")
    t0 = time.perf_counter()
    out = fn(q, kc, q_r, k_r, index)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = _status("VmHWM") - base
    return {"peak_bytes": int(peak), "seconds": time.perf_counter() - t0, "out_bytes": out.numel() * out.element_size()}


def _status(field: str) -> int:
    """A size field of /proc/self/status, in bytes."""
    with open("/proc/self/status") as f:
        found = re.search(rf"{field}:\s+(\d+) kB", f.read())
    if found is None:
        raise RuntimeError(f"/proc/self/status has no {field} line: peak memory is measured on Linux only")
    return int(found.group(1)) * 1024


def _child(impl: str, n: int, heads: int, head_dim: int, k: int, device: str) -> dict:
    cmd = [sys.executable, "-m", "posenc.bench.memory", impl, str(n), str(heads), str(head_dim), str(k), device]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def deberta_memory(lengths=(512, 1024, 2048), *, heads: int = 1, head_dim: int = 64, k: int = 256,
                   device: str = "cpu", max_gib: float = 4.0):
    """Rows {N, one_NNd_GiB, naive_GiB, gather_GiB, naive/gather, naive_s, gather_s} (peaks in GiB, one call's
    seconds); naive runs needing > max_gib are skipped (None)."""
    from ..table import Table
    rows = Table()
    for n in lengths:
        nnd = heads * n * n * head_dim * 4                               # one [H, N, N, d_h] float32 tensor
        gather = _child("gather", n, heads, head_dim, k, device)
        naive = None if nnd / GIB > max_gib else _child("naive", n, heads, head_dim, k, device)
        rows.append({"N": n, "one_NNd_GiB": nnd / GIB, "naive_GiB": naive and naive["peak_bytes"] / GIB,
                     "gather_GiB": gather["peak_bytes"] / GIB,
                     "naive/gather": naive and naive["peak_bytes"] / max(gather["peak_bytes"], 1),
                     "naive_s": naive and naive["seconds"], "gather_s": gather["seconds"]})
    return rows


if __name__ == "__main__":                                               # one measurement, in a fresh process
    p = argparse.ArgumentParser(description="one DeBERTa memory measurement (used by deberta_memory)")
    for name, kind in (("impl", str), ("n", int), ("heads", int), ("head_dim", int), ("k", int), ("device", str)):
        p.add_argument(name, type=kind)
    a = p.parse_args()
    print(json.dumps(measure(a.impl, a.n, a.heads, a.head_dim, a.k, a.device)))
