"""Contextual Position Encoding, CoPE (Golovneva, Wang, Weston and Sukhbaatar 2024), hook 4.

Positions are counts of the keys the query chooses to count, not of tokens. For query i
and key j <= i (section 3 of the paper, eqs. (3)-(6)):

    g_ij = sigmoid(q_i . k_j / sqrt(d_h))                              (3)  gate: does key j count?
    p_ij = sum_{t=j}^{i} g_it                                          (4)  contextual position, in (0, i-j+1]
    e(p) = (p - floor p) e[ceil p] + (1 - p + floor p) e[floor p]      (5)  interpolated embedding
    a_ij = q_i . (k_j + e(min(p_ij, P - 1))) / sqrt(d_h)               (6)  the logit, softmax over j <= i

with e[0..P-1] learned per layer (P = `npos_max`; the paper's eq. (6) writes the softmax
of q_i . (k_j + e[p_ij]) and leaves the 1/sqrt(d_h) to the code). With every gate 1,
p_ij = i - j + 1 and (6) is Shaw et al.'s relative logit q_i . (k_j + w_{i-j}) on token
counts. `extra_logits` returns the position term q_i . e(p_ij) / sqrt(d_h).

Causal only. p_ij sums gates over the keys between j and i, a prefix sum read from the
query backwards; it is defined because every key a query sees lies at or before it.
With keys after the query there is no "between" that stays on one side of i, and
nothing in the paper says how to count it.

Computation (the paper's code, Appendix): z_i[p] = q_i . e[p] for every integer p
once, [batch, heads, seq, P], then the two neighbours of each p_ij are gathered from it
and mixed by eq. (5) -- a [batch, heads, seq, seq, d_h] tensor is never built. The
prefix sum of eq. (4) is a flipped cumsum over keys; gates of keys after the query are
zero, so the sum over t >= j is the sum over j <= t <= i. Cost per layer: one more
q k^T (the attention's own stays inside the fused kernel or the explicit softmax) and a
few [batch, heads, seq, seq] tensors (gates, positions, two gather indices), as Shaw's.

Choices:
    * scale: the gates use the scaled logit q . k / sqrt(d_h) (the paper's code, and
      x-transformers); the position term q . e(p) is scaled by 1/sqrt(d_h) as well, so the
      scale applies to k_j + e(p) as a whole, as in the authors' repository by default
      (facebookresearch/RAM, projects/cope) and in Shaw's scheme here. The paper's Appendix
      B listing and x-transformers add q . e(p) unscaled: the same model with e multiplied
      by sqrt(d_h) (the same function, another parametrisation for the optimiser).
    * sharing: one table e per layer, shared by the heads (`per_head=False`, as in the
      paper's code and x-transformers: each head still counts with its own gates); with
      `per_head=True` every head has its own table.
    * q and k are the ones the attention uses, after the q/k transform hook
      (`transform_qk`): CoPE rotates nothing, so they are the plain projections
      (x-transformers, combined with RoPE, gates with rotated ones).
    * the table starts at zero (the paper's code): a fresh CoPE model computes what
      causal NoPE with the same weights computes, and training moves e first.
    * `ctx.positions` is never read: the order of the keys is the sequence order, so the
      scheme is shift-invariant; gates, positions and the interpolation are computed in at
      least float32 (bf16 keeps 8 significant bits: a count past 128 would lose its fraction).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..scheme import register
from ..scheme import PositionContext, Scheme


# -- functional core ------------------------------------------------------------------
def _wide(x: Tensor) -> torch.dtype:
    """float32, or x's dtype when wider (float64): the precision of gates, positions and interpolation."""
    return torch.promote_types(x.dtype, torch.float32)


def cope_gates(q: Tensor, k: Tensor, scale: float) -> Tensor:
    """g_ij = sigmoid(scale * q_i . k_j) for key j at or before query i,
    else 0, eq. (3).

    q [..., Q, d], k [..., K, d] -> [..., Q, K] in at least float32; queries
    are the last Q keys (right-aligned, as `posenc.attention.causal_mask`).
    """
    if not (isinstance(q, Tensor) and isinstance(k, Tensor)):
        raise TypeError(f"q and k must be tensors; "
                        f"got {_describe(q)} and {_describe(k)}")
    if q.dim() < 2 or k.dim() < 2 or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must be [..., seq, d] with the same d; "
                         f"got {tuple(q.shape)} and {tuple(k.shape)}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float, Tensor)):
        raise TypeError(f"scale must be a number (1/sqrt(d) in CoPE); "
                        f"got {scale!r}")
    if not isinstance(scale, Tensor) and not math.isfinite(scale):
        raise ValueError(f"scale must be finite; got {scale!r}")
    q_len, k_len = q.shape[-2], k.shape[-2]
    if q_len > k_len:
        raise ValueError(f"q must not have more positions than k; "
                         f"got {q_len} queries and {k_len} keys")
    logits = (q @ k.transpose(-2, -1)).to(_wide(q)) * scale  # (.., Q, K)
    after = (torch.ones(q_len, k_len, dtype=torch.bool, device=q.device)
             .triu(k_len - q_len + 1))
    # (.., Q, K) zero after the query
    return logits.sigmoid().masked_fill(after, 0.0)


def contextual_positions(gates: Tensor) -> Tensor:
    """p_ij = sum_{t >= j} g_it (eq. 4 when gates after the query are 0):
    the flipped cumsum over keys.

    gates [..., Q, K] (`cope_gates`) -> [..., Q, K]."""
    if (not isinstance(gates, Tensor) or gates.dim() < 2
            or not gates.is_floating_point()):
        raise ValueError(
            f"gates must be a float tensor [..., Q, K] (cope_gates' output); "
            f"got {_describe(gates)}"
            + (f" of {gates.dtype}" if isinstance(gates, Tensor) else ""))
    return gates.flip(-1).cumsum(-1).flip(-1)  # (.., Q, K)


def interpolate_logits(z: Tensor, positions: Tensor) -> Tensor:
    """q_i . e(p_ij) from z_i[p] = q_i . e[p]: eq. (5) applied to z, p clamped
    to [0, P - 1].

    z [..., Q, P], positions [..., Q, K] (non-negative) -> [..., Q, K]. A NaN
    position (q or k held a NaN or an inf, a diverging run) gives a NaN logit,
    as every other attention does, not an index error.
    """
    npos = z.shape[-1]
    p = positions.clamp(0, npos - 1)
    lost = p.isnan()  # NaN.long() indexes nowhere
    p = p.masked_fill(lost, 0.0)
    floor, ceil = p.floor(), p.ceil()
    w = p - floor  # differentiable in p
    z_ceil = z.gather(-1, ceil.long().expand(*z.shape[:-2], *p.shape[-2:]))
    z_floor = z.gather(-1, floor.long().expand(*z.shape[:-2], *p.shape[-2:]))
    # (.., Q, K)
    return (z_ceil * w + z_floor * (1 - w)).masked_fill(lost, float("nan"))


def _describe(value) -> str:
    return f"shape {tuple(value.shape)}" if isinstance(value, Tensor) else type(value).__name__


def cope_logits(q: Tensor, k: Tensor, table: Tensor, scale: float,
                gates: Tensor | None = None) -> Tensor:
    """The position term q_i . e(p_ij) * scale of eq. (6),
    [batch, heads, Q, K].

    q [B, H, Q, d], k [B, H, K, d];
    table e [P, d] (shared by the heads) or [H, P, d];
    `gates` replaces eq. (3) when given ([.., Q, K], zero after the query).
    """
    for name, x in (("q", q), ("k", k), ("table", table)):
        # integer logits would be truncated
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise TypeError(
                f"{name} must be a floating-point tensor; got "
                f"{x.dtype if isinstance(x, Tensor) else type(x).__name__}")
    if (table.dim() not in (2, 3) or table.shape[-1] != q.shape[-1]
            or table.shape[-2] < 1):
        d = q.shape[-1]
        raise ValueError(f"table must be [npos >= 1, {d}] or "
                         f"[heads, npos >= 1, {d}]; "
                         f"got {tuple(table.shape)}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float, Tensor)):
        raise TypeError(f"scale must be a number (1/sqrt(d) in the model); "
                        f"got {scale!r}")
    if gates is not None and (
            not isinstance(gates, Tensor) or gates.dim() < 2
            or tuple(gates.shape[-2:]) != (q.shape[-2], k.shape[-2])):
        raise ValueError(f"gates must be a tensor "
                         f"[..., Q={q.shape[-2]}, K={k.shape[-2]}] "
                         f"(one gate per query and key); "
                         f"got {_describe(gates)}")
    g = cope_gates(q, k, scale) if gates is None else gates
    p = contextual_positions(g.to(_wide(q)))  # (B, H, Q, K) eq. (4)
    # (B, H, Q, P) z_i[p] = q_i . e[p]
    z = (q @ table.to(q.dtype).transpose(-2, -1)).to(_wide(q))
    # (B, H, Q, K) eqs. (5), (6)
    return (interpolate_logits(z, p) * scale).to(q.dtype)


# -- the scheme -----------------------------------------------------------------------
@register("cope")
class CoPE(Scheme):
    """Contextual positions counted by sigmoid gates, one embedding table per layer; causal only::

        g_ij = sigmoid(q_i . k_j / sqrt(d_h)),   p_ij = sum_{t=j..i} g_it,
        a_ij = q_i . (k_j + e(p_ij)) / sqrt(d_h),
        e(p) = (p - floor p) e[ceil p] + (1 - p + floor p) e[floor p].

    Args:
        npos_max: P, the number of integer positions 0..P-1 with an embedding; larger
            counts share e[P - 1] (the paper's p_max; x-transformers' `cope_max_pos`).
        per_head: one table per head instead of one shared by the heads of a layer.
    """

    shift_invariant = True     # positions are counted from the content; ctx.positions is never read
    causal_only = True         # p_ij counts the keys between j and i, a prefix sum from the query back

    def __init__(self, *, npos_max: int = 16, per_head: bool = False, **kw):
        super().__init__(**kw)
        if not isinstance(npos_max, int) or isinstance(npos_max, bool) or npos_max < 2:
            raise ValueError(f"npos_max must be an int >= 2 (positions 0 and 1 at least); got {npos_max!r}")
        if not isinstance(per_head, bool):
            raise TypeError(f"per_head must be True or False; got {per_head!r}")
        if not self.causal:
            raise ValueError("cope needs causal=True: p_ij counts the keys between j and the query i, "
                             "which only exists for keys at or before the query; got causal=False")
        self.npos_max, self.per_head = npos_max, per_head
        heads = self.n_heads if per_head else 1
        self.table = nn.Parameter(torch.zeros(self.n_layers, heads, npos_max, self.head_dim))  # e[p], per layer

    def gates(self, q: Tensor, k: Tensor) -> Tensor:
        """Eq. (3) for one layer: [B, H, Q, K], at least float32 (a subclass may fix them, e.g. to count tokens)."""
        return cope_gates(q, k, self.logit_scale())

    def positions(self, q: Tensor, k: Tensor) -> Tensor:
        """The contextual positions p_ij of eq. (4), [B, H, Q, K], unclamped (0 after the query)."""
        return contextual_positions(self.gates(q, k))

    def extra_logits(self, q: Tensor, k: Tensor, ctx: PositionContext,
                     layer: int) -> Tensor:
        # (H, P, Dh) or (P, Dh)
        table = self.table[layer] if self.per_head else self.table[layer, 0]
        # (B, H, T, T)
        return cope_logits(q, k, table, self.logit_scale(),
                           gates=self.gates(q, k))
