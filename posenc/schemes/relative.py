"""Relative encodings that need q/k content in the position terms (hook 4).

Shaw et al. (2018), eqs. (3)-(5), distances clipped at k (section 3.2):

    e_ij = q_i . (k_j + a^K_ij) / sqrt(d_h),      z_i = sum_j alpha_ij (v_j + a^V_ij),
    a^K_ij = w^K_{clip(j - i, -k, k)},            a^V_ij = w^V_{clip(j - i, -k, k)}.

Transformer-XL (Dai et al. 2019), eq. in section 3.3 (terms a-d), with R_{i-j} the
sinusoid of the distance i - j, W_{k,R} a separate key projection and u, v global biases:

    A_ij = q_i . k_j  +  q_i . W_{k,R} R_{i-j}  +  u . k_j  +  v . W_{k,R} R_{i-j}
            (a)              (b)                    (c)          (d)

Neither ever builds a [q_len, k_len, d] tensor: queries are projected onto the small
table of distances, [.., q_len, n_distances], then gathered (Shaw) or shifted (XL).
Convention (package-wide): relative position = key_pos - query_pos = j - i; XL's R is
indexed by the opposite sign, i - j, as in the paper.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .absolute import sinusoidal_at
from ..host import to_device
from ..scheme import register
from ..scheme import PositionContext, Scheme, whole_distances


# -- functional core ------------------------------------------------------------------
def key_positions(ctx: PositionContext) -> Tensor:
    """Positions of the keys: the memory's and the segment's (Transformer-XL), else the queries'."""
    kpos = getattr(ctx, "key_positions", None)
    return ctx.positions if kpos is None else kpos


def distinct_distances(q_pos: Tensor, k_pos: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(the distinct i - j [U] sorted, the index of each (i, j) in them [Q, K]); keys default to the queries."""
    k_pos = q_pos if k_pos is None else k_pos
    return (q_pos[:, None] - k_pos[None, :]).unique(return_inverse=True)


def relative_ids(q_pos: Tensor, k_pos: Tensor, max_distance: int) -> Tensor:
    """clip(k_pos[j] - q_pos[i], -k, k) + k as long [q_len, k_len], for any
    1-D positions."""
    if (isinstance(max_distance, bool) or not isinstance(max_distance, int)
            or max_distance < 0):
        raise ValueError(f"max_distance must be a non-negative int; "
                         f"got {max_distance!r}")
    rel = k_pos[None, :] - q_pos[:, None]                   # (Q, K) j - i
    # (Q, K) in [0, 2k]
    return (whole_distances(rel, "Shaw's table")
            .clamp(-max_distance, max_distance) + max_distance)


def clipped_relative_positions(q_len: int, k_len: int, max_distance: int) -> Tensor:
    """Shaw et al.'s ids clip(j - i, -k, k) + k, long [q_len, k_len] (contract), i, j from 0."""
    for arg, value in (("q_len", q_len), ("k_len", k_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{arg} must be a non-negative int; got {value!r}")
    return relative_ids(torch.arange(q_len), torch.arange(k_len), max_distance)


def rel_shift(x: Tensor, k_len: int | None = None) -> Tensor:
    """Transformer-XL's relative shift:
    out[..., i, j] = x[..., i, j + q_len - 1 - i] (contract).

    `x` [..., q_len, r_len] holds scores against relative distances in
    *decreasing* order: column c is the distance i_abs - j = k_len - 1 - c,
    where query i sits at key index i_abs = i + k_len - q_len (queries are
    the last q_len keys). Pad one zero column, read the buffer as
    [r_len + 1, q_len], drop the first row, read it back: row i moves left
    by q_len - 1 - i. Returns [..., q_len, k_len] (k_len defaults to r_len).
    Entries with j - i >= r_len - q_len + 1 are garbage: with r_len = k_len
    that is exactly the causally masked future; with
    r_len = k_len + q_len - 1 (distances down to -(q_len - 1)) there are
    none, which serves bidirectional attention.
    """
    if not isinstance(x, Tensor) or x.dim() < 2:
        raise ValueError(
            f"x must be a tensor [..., q_len, r_len] (2 or more dims); got "
            f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
    *lead, q_len, r_len = x.shape
    if k_len is not None and (isinstance(k_len, bool)
                              or not isinstance(k_len, int)):
        raise TypeError(f"k_len must be an int or None; got {k_len!r}")
    k_len = r_len if k_len is None else k_len
    if not q_len <= k_len <= r_len:
        raise ValueError(
            f"k_len must be in [q_len={q_len}, x.shape[-1]={r_len}] "
            f"(queries are the last q_len keys); got {k_len}")
    padded = F.pad(x, (1, 0))                                   # (.., Q, R+1)
    shifted = padded.reshape(*lead, r_len + 1, q_len)[..., 1:, :]  # (.., R, Q)
    return shifted.reshape(*lead, q_len, r_len)[..., :k_len]    # (.., Q, K)


def gather_relative(scores: Tensor, ids: Tensor) -> Tensor:
    """out[..., i, j] = scores[..., i, ids[i, j]]:
    [..., Q, n_ids] -> [..., Q, K] (the direct gather)."""
    return scores.gather(-1, ids.expand(*scores.shape[:-2], *ids.shape))


def spread_relative(probs: Tensor, ids: Tensor, n_ids: int) -> Tensor:
    """w[..., i, r] = sum_{j: ids[i, j] = r} probs[..., i, j]:
    [..., Q, K] -> [..., Q, n_ids]."""
    out = probs.new_zeros(*probs.shape[:-1], n_ids)
    return out.scatter_add_(-1, ids.expand_as(probs), probs)


# -- Shaw et al. ----------------------------------------------------------------------
@register("shaw")
class Shaw(Scheme):
    """Learned relative embeddings on keys and values, clipped at
    `max_distance` (k)::

        e_ij = q_i (k_j + a^K_ij)^T / sqrt(d_h),
        z_i = sum_j softmax_j(e_ij) (v_j + a^V_ij),
        a^K_ij = w^K[clip(j - i, -k, k)],  a^V_ij = w^V[clip(j - i, -k, k)].

    Args:
        max_distance: k; distances beyond +-k share the edge embedding
            (2k+1 rows).
        keys: use a^K, the relative embedding in the logits
            (Table 3's ablation).
        values: use a^V, the relative embedding in the outputs
            (Table 3's ablation).
    Tables are per layer and shared by the heads, as in the paper's
    section 3.3, which shares them across heads and sequences to cut their
    memory from O(h n^2 d_a) to O(n^2 d_a).
    """

    shift_invariant = True
    # works with Transformer-XL's memory (keys longer than queries)
    supports_memory = True

    def __init__(self, *, max_distance: int = 16, keys: bool = True,
                 values: bool = True, **kw):
        super().__init__(**kw)
        if (isinstance(max_distance, bool) or not isinstance(max_distance, int)
                or max_distance < 0):
            raise ValueError(f"max_distance must be a non-negative int; "
                             f"got {max_distance!r}")
        for arg, value in (("keys", keys), ("values", values)):
            if not isinstance(value, bool):
                raise TypeError(f"{arg} must be True or False; got {value!r}")
        self.max_distance, self.keys, self.values = max_distance, keys, values
        self.uses_extra_values = values
        n = 2 * max_distance + 1
        self.table_k = (
            nn.Parameter(torch.randn(self.n_layers, n, self.head_dim) * 0.02)
            if keys else None)
        self.table_v = (
            nn.Parameter(torch.randn(self.n_layers, n, self.head_dim) * 0.02)
            if values else None)

    def prepare(self, ctx: PositionContext) -> dict:
        return {"shaw_ids": relative_ids(ctx.positions, key_positions(ctx),
                                         self.max_distance)}  # (Q, K)

    def extra_logits(self, q, k, ctx, layer):
        if self.table_k is None:
            return None
        # (B, H, Q, 2k+1): q_i . w^K_r
        scores = q @ self.table_k[layer].to(q.dtype).T
        # (B, H, Q, K) paper eq. (5)
        return (gather_relative(scores, ctx.tables["shaw_ids"])
                * self.logit_scale())

    def extra_values(self, probs, ctx, layer):
        if self.table_v is None:
            return None
        n = 2 * self.max_distance + 1
        # (B, H, Q, 2k+1)
        weight = spread_relative(probs, ctx.tables["shaw_ids"], n)
        # (B, H, Q, Dh) paper eq. (3)
        return weight @ self.table_v[layer].to(probs.dtype)


# -- Transformer-XL ---------------------------------------------------------------------
@register("xl")
class TransformerXL(Scheme):
    """Transformer-XL's relative attention: sinusoidal R_{i-j}, W_{k,R} per
    layer, global u, v::

        A_ij = q_i W_{k,E} x_j + q_i W_{k,R} R_{i-j}
               + u W_{k,E} x_j + v W_{k,R} R_{i-j}

    (terms (a) to (d) of Dai et al.'s A^rel, scaled by 1/sqrt(d_h) before
    the softmax).

    Args:
        untie_uv: one (u, v) per layer (XLNet) instead of one for all layers
            (Transformer-XL).
        base: the sinusoid's base.
    Contiguous positions use `rel_shift`; any other positions the direct
    gather.
    """

    shift_invariant = True
    supports_memory = True

    def __init__(self, *, untie_uv: bool = False, base: float = 10000.0, **kw):
        super().__init__(**kw)
        # R's sinusoidal table pairs its columns (sin, cos)
        if self.d_model % 2:
            raise ValueError(
                f"d_model must be even for Transformer-XL's sinusoidal R; "
                f"got d_model={self.d_model}")
        if not isinstance(untie_uv, bool):
            raise TypeError(f"untie_uv must be True or False; "
                            f"got {untie_uv!r}")
        if (isinstance(base, bool) or not isinstance(base, (int, float))
                or not 1 < base < math.inf):
            raise ValueError(f"base must be a finite number > 1; got {base!r}")
        self.base = base
        self.w_r = nn.ModuleList(
            nn.Linear(self.d_model, self.d_model, bias=False)
            for _ in range(self.n_layers))
        n_uv = self.n_layers if untie_uv else 1
        self.u = nn.Parameter(torch.zeros(n_uv, self.n_heads, self.head_dim))
        self.v = nn.Parameter(torch.zeros(n_uv, self.n_heads, self.head_dim))

    def prepare(self, ctx: PositionContext) -> dict:
        q_pos, k_pos = ctx.positions, key_positions(ctx)
        # the model's context:
        # keys are the integers just before and at the queries
        if ctx.extent is not None:
            contiguous = ctx.start is not None
        else:
            step = k_pos.diff()
            contiguous = (
                bool(len(k_pos) < 2 or (step == 1).all())
                and bool((q_pos == k_pos[len(k_pos) - len(q_pos):]).all()))
        # distances k_len-1 .. 0 (causal)
        # or .. -(q_len-1) (bidirectional), decreasing
        if contiguous:
            low = 0 if self.causal else -(len(q_pos) - 1)
            distances = torch.arange(len(k_pos) - 1, low - 1, -1,
                                     device=q_pos.device)
            ids = None
        elif k_pos is q_pos and (host := ctx.positions_on_host()) is not None:
            # found on the host: no wait
            distances, ids = (to_device(t, q_pos.device)
                              for t in distinct_distances(host))
        else:
            distances, ids = distinct_distances(q_pos, k_pos)  # (U,), (Q, K)
        # (U, D)
        R = sinusoidal_at(distances, self.d_model, self.base).to(q_pos.device)
        return {"xl_R": R, "xl_ids": ids, "xl_k_len": len(k_pos)}

    def extra_logits(self, q, k, ctx, layer):
        B, H, Q, Dh = q.shape
        t, uv = ctx.tables, 0 if self.u.shape[0] == 1 else layer
        # (U, H, Dh): W_{k,R} R
        r = self.w_r[layer](t["xl_R"].to(q.dtype)).view(-1, H, Dh)
        # (B, H, 1, K) term (c)
        c = torch.einsum("hd,bhkd->bhk", self.u[uv].to(q.dtype), k)[:, :, None]
        # (B, H, Q, U) terms (b)+(d)
        bd = torch.einsum("bhqd,uhd->bhqu",
                          q + self.v[uv, :, None].to(q.dtype), r)
        bd = (rel_shift(bd, t["xl_k_len"]) if t["xl_ids"] is None
              else gather_relative(bd, t["xl_ids"]))
        return (bd + c) * self.logit_scale()                  # (B, H, Q, K)
