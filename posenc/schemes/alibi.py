"""ALiBi: attention with linear biases (Press, Smith and Lewis, ICLR 2022).

No position vectors at all: each head h adds a penalty proportional to distance,

    a_ij = q_i . k_j / sqrt(d_h) - m_h |j - i|,

with head slopes m_h a geometric sequence (section 3 of the paper). The bias depends on
j - i only, so the scheme is exactly shift-invariant; it is one [heads, seq, seq] float
mask per forward pass, shared by all layers, and attention stays fused.
`posenc.bias` re-exports `alibi_slopes` (the contract's home for logit biases).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ..scheme import register
from ..scheme import PositionContext, Scheme, cacheable, caching, check_positions, stamp

def alibi_slopes(num_heads: int) -> Tensor:
    """The head slopes m_h of ALiBi: for n heads a power of two, a geometric
    sequence from 2^(-8/n), ratio 2^(-8/n).

    For n heads a power of two, m_h = 2^(-8h/n), h = 1..n. Otherwise, with p
    the largest power of two below n, the first p slopes are those of p heads
    and the remaining n - p are every other slope of 2p heads (the paper's
    code; BLOOM's too).
    """
    if (isinstance(num_heads, bool) or not isinstance(num_heads, int)
            or num_heads < 1):
        raise ValueError(
            f"num_heads must be a positive int; got {num_heads!r}")
    p = 2 ** math.floor(math.log2(num_heads))
    slopes = _geometric_slopes(p)
    if p < num_heads:
        slopes = torch.cat([slopes,
                            _geometric_slopes(2 * p)[0::2][: num_heads - p]])
    return slopes.float()


def _geometric_slopes(n: int) -> Tensor:
    start = 2.0 ** (-8.0 / n)
    return start ** torch.arange(1, n + 1, dtype=torch.float64)


def alibi_bias(positions: Tensor, slopes: Tensor) -> Tensor:
    """`b_hij = -m_h |j - i|`  (ALiBi eq. in section 3):
    [heads, seq, seq] float32.

    In a causal model only j <= i is ever used, where this equals m_h (j - i),
    the paper's form; the symmetric `|j - i|` extends it to bidirectional
    attention.
    """
    # 1-D, numbers, finite, not half precision
    check_positions(positions, finite="on cpu")
    if not isinstance(slopes, Tensor) or slopes.dim() != 1:
        raise ValueError(
            f"slopes must be a 1-D float tensor [heads] "
            f"(e.g. alibi_slopes(heads)); "
            f"got {getattr(slopes, 'shape', type(slopes).__name__)}")
    if not slopes.is_floating_point():
        raise TypeError(
            f"slopes must be a float tensor (e.g. alibi_slopes(heads)); "
            f"got {slopes.dtype}")
    pos = (positions if not positions.is_floating_point()
           else positions.to(torch.float64))
    # (T, T): |j - i|, exact < 2^24
    dist = (pos[None, :] - pos[:, None]).abs().float()
    return dist * -slopes.float()[:, None, None]  # (H, T, T)


@register("alibi")
class ALiBi(Scheme):
    """Linear biases on the logits, one slope per head, no position vectors
    at all::

        a_hij = q_i . k_j / sqrt(d_h) - m_h |i - j|,
        m_h = 2^(-8h/H), h = 1..H

    (H a power of two; `alibi_slopes` gives the paper's slopes for any
    H)."""

    shift_invariant = True
    slopes: Tensor                          # m_h [heads], a buffer

    def __init__(self, **kw):
        super().__init__(**kw)
        self.register_buffer("slopes", alibi_slopes(self.n_heads).float(),
                             persistent=False)
        # (key, bias) of the last run of consecutive positions
        self._last: tuple | None = None

    def clear_cache(self) -> None:
        self._last = None

    def score_mod(self, ctx: PositionContext):
        """-m_h |p_j - p_i| from the positions and the slopes (FlexAttention;
        no [H, T, T] bias)."""
        # on the host (the model's extent): no device reduction
        low = (ctx.minmax() or (0, 0))[0]
        # offsets: exact below 2^24 at any start
        pos, slopes = (ctx.positions - low).to(torch.float32), self.slopes

        def alibi(score, b, h, q_idx, kv_idx):
            return score - slopes[h] * (pos[kv_idx] - pos[q_idx]).abs()
        return alibi

    def logit_bias(self, ctx: PositionContext) -> Tensor:
        """-m_h |j - i| (H, T, T); for consecutive integer positions (any
        offset) the bias depends on T only and the last one is reused, as long
        as it was built with autograd on."""
        pos, n = ctx.positions, ctx.seq_len
        if not caching():
            return alibi_bias(pos, self.slopes)
        consecutive = ctx.consecutive_start() is not None
        # slopes edited in place: rebuilt; under vmap: never kept
        key = (n, pos.device, stamp(self.slopes))
        if consecutive and self._last is not None and self._last[0] == key:
            return self._last[1]
        bias = alibi_bias(pos, self.slopes)
        if consecutive and cacheable(bias):
            self._last = (key, bias)
        return bias
