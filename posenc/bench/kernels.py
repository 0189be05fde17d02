"""The hand-written kernels against independent implementations, forward + backward where trained.

* RoPE: `posenc.rotary.rotate` in both layouts (and the half layout's compiled kernel) against transformers' LLaMA
  `apply_rotary_pos_emb` (half layout) and rotary-embedding-torch (interleaved), and a
  memory-bound floor: y = x * c over the same tensors (forward reads x, writes y;
  backward reads dy, writes dx: the least any rotation must move);
* bias construction: T5's bucketed bias (ours vs transformers' `T5Attention.compute_bias`)
  and ALiBi's (ours vs x-transformers' `AlibiPositionalBias` and BLOOM's `build_alibi_tensor`).
"""
from __future__ import annotations

import statistics
import warnings
from typing import Any

import torch

from ..scheme import PositionContext
from ..table import Table
from .timing import interleaved_times

FLOOR = "floor: x * c"
ROPE_REFERENCE = {"ours half": "transformers LLaMA (half)", "ours half, compiled": "transformers LLaMA (half)",
                  "ours interleaved": "rotary-embedding-torch (interleaved)"}


def rope_candidates(seq: int, dim: int, *, device="cpu", dtype=torch.float32) -> dict:
    """name -> fn(q, k) returning the rotated pair; cos/sin tables built once, as a model does per forward.

    Each reference gets its tables as its library builds them: LLaMA's cos/sin in the inputs' dtype
    (`LlamaRotaryEmbedding` casts them), ours in float32 (the rotation runs in float32 at least).
    Where rotary-embedding-torch is not installed (the GPU image lacks it) its row is left out with a
    warning naming it, and "ours interleaved" is timed against the floor alone.
    """
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    apply_rotary_emb = _rotary_embedding_torch()

    from ..schemes.rotary import rope_frequencies, rope_table, rotate
    pos = torch.arange(seq, device=device)
    cos, sin = rope_table(pos, dim)                                      # (T, d/2) float32
    freqs = pos[:, None].float() * rope_frequencies(dim, device=device).float()   # (T, d/2)
    llama_cos = torch.cat([freqs, freqs], -1).cos()[None].to(dtype)      # (1, T, d) as LlamaRotaryEmbedding
    llama_sin = torch.cat([freqs, freqs], -1).sin()[None].to(dtype)
    ret_freqs = freqs.repeat_interleave(2, -1)                           # (T, d) as RotaryEmbedding.forward
    floor_c = torch.randn(seq, dim, device=device, dtype=dtype)
    fns = {
        "ours half": lambda q, k: (rotate(q, cos, sin, "half"), rotate(k, cos, sin, "half")),
        "ours half, compiled": lambda q, k: (rotate(q, cos, sin, "half", kernel="compiled"),
                                             rotate(k, cos, sin, "half", kernel="compiled")),
        "transformers LLaMA (half)": lambda q, k: apply_rotary_pos_emb(q, k, llama_cos, llama_sin),
        "ours interleaved": lambda q, k: (rotate(q, cos, sin, "interleaved"), rotate(k, cos, sin, "interleaved")),
        "rotary-embedding-torch (interleaved)": lambda q, k: (apply_rotary_emb(ret_freqs, q), apply_rotary_emb(ret_freqs, k)),
        FLOOR: lambda q, k: (q * floor_c, k * floor_c),
    }
    if apply_rotary_emb is None:
        del fns["rotary-embedding-torch (interleaved)"]
    return fns


def _rotary_embedding_torch():
    """rotary-embedding-torch's `apply_rotary_emb`, or None (with a warning naming it) where it is not installed."""
    try:
        from rotary_embedding_torch import apply_rotary_emb
    except ImportError:
        warnings.warn("rotary-embedding-torch is not installed, so the RoPE table has no row for it and the "
                      "interleaved layout is compared with the floor only (pip install rotary-embedding-torch)",
                      stacklevel=3)
        return None
    return apply_rotary_emb


def rope_times(shape=(8, 8, 512, 64), *, repeats: int = 30, clock: str = "cpu") -> Table:
    """Best (minimum) ms of forward + backward of each candidate on q, k of `shape`, with ratios.

    Runs on one thread (restored after), so that the CPU-time clock equals the work done.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return time_rope_candidates(shape, repeats, clock)
    finally:
        torch.set_num_threads(threads)


def time_rope_candidates(shape, repeats, clock, device="cpu", dtype=torch.float32):
    """The candidates on q, k of `shape` (`device`, `dtype`): rows {candidate, ms, vs_floor, vs_reference}."""
    q, k = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(2))
    gq, gk = (torch.randn(shape, device=device, dtype=dtype) for _ in range(2))

    def fwd_bwd(fn):
        def call():
            q.grad = k.grad = None
            torch.autograd.backward(list(fn(q, k)), [gq, gk])
        return call
    fns = rope_candidates(shape[-2], shape[-1], device=device, dtype=dtype)
    best = {n: min(t) for n, t in interleaved_times({n: fwd_bwd(f) for n, f in fns.items()},
                                                    rounds=repeats, warmup=3, clock=clock, device=device).items()}
    return Table({"candidate": n, "ms": 1e3 * s, "vs_floor": s / best[FLOOR],
                  "vs_reference": s / best[ROPE_REFERENCE[n]] if ROPE_REFERENCE.get(n) in best else None}
                 for n, s in best.items())


def bias_times(seq: int = 1024, heads: int = 8, *, rounds: int = 20) -> Table:
    """Median ms to build a [heads, seq, seq] bias: T5 and ALiBi, ours against the references."""
    from transformers import T5Config
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor
    from transformers.models.t5.modeling_t5 import T5Attention
    from x_transformers.x_transformers import AlibiPositionalBias

    from ..schemes.alibi import ALiBi, alibi_bias
    from ..schemes.bias import T5Bias
    sizes: dict[str, Any] = dict(d_model=64 * heads, n_heads=heads, n_layers=1, max_len=seq)
    t5, alibi = T5Bias(causal=False, **sizes), ALiBi(causal=True, **sizes)
    hf_t5 = T5Attention(T5Config(d_model=64 * heads, num_heads=heads, d_kv=64), has_relative_attention_bias=True)
    xt_alibi = AlibiPositionalBias(heads=heads, total_heads=heads)
    ones = torch.ones(1, seq, dtype=torch.long)

    def ours(scheme, causal):
        def build():
            ctx = PositionContext(torch.arange(seq), causal)
            ctx.tables = scheme.prepare(ctx)
            return scheme.logit_bias(ctx)
        return build
    def xt_cold():
        xt_alibi.bias = None                                   # x-transformers keeps its last bias as a buffer
        return xt_alibi(seq, seq)
    fns = {"ours t5": ours(t5, False), "transformers T5 compute_bias": lambda: hf_t5.compute_bias(seq, seq),
           "ours alibi, built": lambda: alibi_bias(torch.arange(seq), alibi.slopes),
           "x-transformers AlibiPositionalBias, built": xt_cold,
           "ours alibi, reused": ours(alibi, True), "x-transformers AlibiPositionalBias, reused": lambda: xt_alibi(seq, seq),
           "BLOOM build_alibi_tensor (key-only [H, 1, N])": lambda: build_alibi_tensor(ones, heads, torch.float32)}
    with torch.no_grad():
        med = {n: statistics.median(t) for n, t in interleaved_times(fns, rounds=rounds).items()}
    ref = {"ours t5": "transformers T5 compute_bias", "ours alibi, built": "x-transformers AlibiPositionalBias, built",
           "ours alibi, reused": "x-transformers AlibiPositionalBias, reused"}
    return Table({"candidate": n, "ms": 1e3 * s, "vs_reference": s / med[ref[n]] if n in ref else None}
                 for n, s in med.items())
