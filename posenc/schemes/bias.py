"""Relative position as a bias on the attention logits (hook 3): T5.

T5 (Raffel et al. 2020, section 2.1) adds one learned scalar per head and bucket,

    a_ij = q_i . k_j / sqrt(d_h) + b_h[bucket(j - i)],

the same table for every layer, computed once per forward. The bucket map (Mesh
TensorFlow's `_relative_position_bucket`) for n = |j - i| (bidirectional, with the sign
in a separate half of the buckets) or n = max(i - j, 0) (causal), with D = max_distance and
B buckets for each sign (B = num_buckets when causal, num_buckets/2 when bidirectional, the
keys after the query taking ids B .. 2B - 1), of which m = B/2 are exact:

    bucket(n) = n                                                    if n < m
              = min(B - 1, m + floor(log(n / m) / log(D / m) * (B - m)))  otherwise.

So 32 bidirectional buckets give the keys before the query (and the query itself) 8 exact
distances (0..7), the keys after it 7 (1..7; bucket 16, distance 0 on that side, is never
used), and each side 8 logarithmic ones.

Convention: relative_position = key_pos - query_pos (T5's memory_position -
query_position). T5 itself never divides by sqrt(d_h) (it folds the factor into the
initialisation of W_q); here the logits are scaled by 1/sqrt(d_h) as everywhere in
`posenc`, and the bias is added after the scaling, unscaled.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..scheme import register
from .relative import key_positions
from ..scheme import PositionContext, Scheme, whole_distances

from .alibi import alibi_slopes  # noqa: F401  (contract: `posenc.bias.alibi_slopes`; ALiBi lives in posenc.alibi)


def t5_bucket(relative_position: Tensor, bidirectional: bool = True,
              num_buckets: int = 32, max_distance: int = 128) -> Tensor:
    """T5's bucket id (long, same shape) of each
    relative_position = key_pos - query_pos (contract).

    With N' = num_buckets / 2 per sign (bidirectional; ids of keys after the
    query offset by N') or N' = num_buckets (causal, n = query - key >= 0),
    m = N' / 2 and D = max_distance, distance n goes to::

        n                                                  if n < m,
        min(N' - 1, m + floor(ln(n/m) / ln(D/m) (N' - m)))  otherwise."""
    if (not isinstance(relative_position, Tensor)
            or relative_position.is_floating_point()
            or relative_position.is_complex()
            or relative_position.dtype == torch.bool):
        raise TypeError("relative_position must be an integer tensor "
                        "(key_pos - query_pos)")
    if not isinstance(bidirectional, bool):
        raise TypeError(
            f"bidirectional must be True or False; got {bidirectional!r}")
    if isinstance(num_buckets, bool) or not isinstance(num_buckets, int):
        raise ValueError(
            f"num_buckets must be an int >= {4 if bidirectional else 2}; "
            f"got {num_buckets!r}")
    # buckets per sign
    half = num_buckets // 2 if bidirectional else num_buckets
    if half < 2:
        raise ValueError(
            f"num_buckets must be an int >= {4 if bidirectional else 2}; "
            f"got {num_buckets!r}")
    exact = half // 2  # m: one bucket per distance below m
    if not isinstance(max_distance, int) or max_distance <= exact:
        raise ValueError(
            f"max_distance must be an int > {exact} (num_buckets/4 or /2); "
            f"got {max_distance!r}")
    rel = relative_position.long()
    if bidirectional:
        # keys after the query: upper half
        offset, n = (rel > 0).long() * half, rel.abs()
    else:
        # future keys -> bucket 0
        offset, n = torch.zeros_like(rel), (-rel).clamp(min=0)
    # float32, as in T5
    log_ratio = torch.log(n.float() / exact) / math.log(max_distance / exact)
    large = (exact + (log_ratio * (half - exact)).long()).clamp(max=half - 1)
    return offset + torch.where(n < exact, n, large)


@register("t5")
class T5Bias(Scheme):
    """One learned scalar per (head, bucket), shared by all layers, added to
    the scaled logits::

        a_hij = q_i . k_j / sqrt(d_h) + b_h[bucket(j - i)]

    with `t5_bucket`'s map (exact distances below N'/2, log-spaced ones
    up to D).

    Args:
        num_buckets: the bucket map's N (T5: 32).
        max_distance: the bucket map's D, where the log buckets end (T5: 128).
        bidirectional: two-sided buckets; defaults to `not causal`.
    """

    shift_invariant = True

    # works with Transformer-XL's memory (keys longer than queries)
    supports_memory = True

    def __init__(self, *, num_buckets: int = 32, max_distance: int = 128,
                 bidirectional: bool | None = None, **kw):
        super().__init__(**kw)
        self.bidirectional = ((not self.causal) if bidirectional is None
                              else bidirectional)
        # validate
        t5_bucket(torch.zeros(1, dtype=torch.long), self.bidirectional,
                  num_buckets, max_distance)
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.bias = nn.Embedding(num_buckets, self.n_heads)  # b_h[bucket]

    def prepare(self, ctx: PositionContext) -> dict:
        q_pos, k_pos = ctx.positions, key_positions(ctx)
        n = len(q_pos)
        # one bucket per distance j - i
        if k_pos is q_pos and ctx.consecutive_start() is not None:
            rel = torch.arange(1 - n, n, device=q_pos.device)  # (2n - 1,)
            return {"t5_distance_buckets": t5_bucket(
                rel, self.bidirectional, self.num_buckets, self.max_distance)}
        rel = k_pos[None, :] - q_pos[:, None]  # (Q, K) j - i
        rel = whole_distances(rel, "T5's buckets")
        return {"t5_buckets": t5_bucket(
            rel, self.bidirectional, self.num_buckets, self.max_distance)}

    def score_mod(self, ctx: PositionContext):
        """b_h[bucket(j - i)] read from the (2n - 1, H) table of distances
        (FlexAttention); None for positions that are not consecutive integers
        (then the model builds the [H, Q, K] bias)."""
        if "t5_distance_buckets" not in ctx.tables:
            return None
        # (2n - 1, H)
        table, n = self.bias(ctx.tables["t5_distance_buckets"]), ctx.seq_len

        def t5(score, b, h, q_idx, kv_idx):
            return score + table[kv_idx - q_idx + n - 1, h]
        return t5

    def logit_bias(self, ctx: PositionContext) -> Tensor:
        # Toeplitz: b[h, i, j] = v[h, j - i + n - 1]
        if "t5_distance_buckets" in ctx.tables:
            v = self.bias(ctx.tables["t5_distance_buckets"]).T  # (H, 2n - 1)
            n = ctx.seq_len
            # [h, a, j] = v[h, a + j], a = n - 1 - i
            return v.unfold(1, n, 1).flip(1)
        # (H, Q, K)
        return self.bias(ctx.tables["t5_buckets"]).permute(2, 0, 1)

