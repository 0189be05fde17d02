"""Forward+backward time of `posenc.rotary` against two references and a memory-bound floor.

    python benchmarks/rope_bench.py [--batch 8 --heads 8 --seq 512 --dim 64 --threads 1 --repeats 30] [--save]

`--save` also writes the table to results/11_rope_bench.json (shown by notebooks/11_rope).

All candidates rotate the same q and k [batch, heads, seq, dim] (float32, requiring
grad) and are timed in one process, round-robin, as the best (minimum) of `repeats`
runs of forward + backward, the statistic least disturbed by other processes. By default
the clock is the process's CPU time (`--clock cpu`), which on a shared machine is far
less disturbed than wall time by other jobs; with one thread the two agree on an idle
machine (`--clock wall` to check). The cos/sin tables are built once beforehand, as every
model does per forward pass. Candidates:

* ours, layout="half"          vs transformers' LLaMA `apply_rotary_pos_emb` (same pairing);
* ours, layout="interleaved"   vs rotary-embedding-torch's `apply_rotary_emb` (same pairing);
* floor: one elementwise op over the same tensors, y = x * c with c a [seq, dim] table
  (forward reads x and writes y, backward reads dy and writes dx: the least any
  rotation must move).
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
from rotary_embedding_torch import apply_rotary_emb
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from posenc.rotary import rope_frequencies, rope_table, rotate


def candidates(seq: int, dim: int) -> dict:
    """name -> fn(q, k) returning the rotated pair; tables precomputed once."""
    pos = torch.arange(seq)
    cos, sin = rope_table(pos, dim)                                      # (T, d/2) float32
    freqs = pos[:, None].float() * rope_frequencies(dim).float()         # (T, d/2)
    llama_cos = torch.cat([freqs, freqs], -1).cos()[None]                # (1, T, d) as LlamaRotaryEmbedding
    llama_sin = torch.cat([freqs, freqs], -1).sin()[None]
    ret_freqs = freqs.repeat_interleave(2, -1)                           # (T, d) as RotaryEmbedding.forward
    floor_c = torch.randn(seq, dim)
    return {
        "ours half": lambda q, k: (rotate(q, cos, sin, "half"), rotate(k, cos, sin, "half")),
        "transformers LLaMA (half)": lambda q, k: apply_rotary_pos_emb(q, k, llama_cos, llama_sin),
        "ours interleaved": lambda q, k: (rotate(q, cos, sin, "interleaved"), rotate(k, cos, sin, "interleaved")),
        "rotary-embedding-torch (interleaved)": lambda q, k: (apply_rotary_emb(ret_freqs, q), apply_rotary_emb(ret_freqs, k)),
        "floor: x * c": lambda q, k: (q * floor_c, k * floor_c),
    }


def time_all(fns: dict, shape, repeats: int, warmup: int = 3, clock=time.process_time) -> dict:
    """Best (minimum) seconds of forward+backward per candidate, measured round-robin."""
    q = torch.randn(shape, requires_grad=True)
    k = torch.randn(shape, requires_grad=True)
    gq, gk = torch.randn(shape), torch.randn(shape)
    times = {name: [] for name in fns}
    for r in range(warmup + repeats):
        for name, fn in fns.items():
            q.grad = k.grad = None
            t0 = clock()
            yq, yk = fn(q, k)
            torch.autograd.backward([yq, yk], [gq, gk])
            dt = clock() - t0
            if r >= warmup:
                times[name].append(dt)
    return {name: min(ts) for name, ts in times.items()}


def report(t: dict) -> str:
    """The table of times and ratios printed by `main`."""
    floor = t["floor: x * c"]
    ref_of = {"ours half": "transformers LLaMA (half)", "ours interleaved": "rotary-embedding-torch (interleaved)"}
    lines = [f"{'candidate':40s} {'ms':>8s} {'/ floor':>8s} {'/ reference':>12s}"]
    for name, s in t.items():
        ref = f"{s / t[ref_of[name]]:12.2f}" if name in ref_of else f"{'':12s}"
        lines.append(f"{name:40s} {s * 1e3:8.2f} {s / floor:8.2f} {ref}")
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--clock", choices=["cpu", "wall"], default="cpu")
    p.add_argument("--save", action="store_true", help="write results/11_rope_bench.json")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    shape = (a.batch, a.heads, a.seq, a.dim)
    clock = time.process_time if a.clock == "cpu" else time.perf_counter
    t = time_all(candidates(a.seq, a.dim), shape, a.repeats, clock=clock)
    setup = (f"q, k: {list(shape)} float32, forward + backward, {a.threads} thread(s), best of {a.repeats} ({a.clock} time), "
             f"torch {torch.__version__}, {platform.processor() or platform.machine()}")
    print(setup)
    print(report(t))
    if a.save:
        save(t, setup)
    return t


def save(t: dict, setup: str) -> None:
    refs = {"ours half": "transformers LLaMA (half)", "ours interleaved": "rotary-embedding-torch (interleaved)"}
    rows = [{"candidate": n, "ms": round(s * 1e3, 3), "vs_floor": round(s / t["floor: x * c"], 3),
             "vs_reference": round(s / t[refs[n]], 3) if n in refs else None} for n, s in t.items()]
    path = Path(__file__).resolve().parent.parent / "results" / "11_rope_bench.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"setup": setup, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
