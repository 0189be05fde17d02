"""TUPE: Transformer with Untied Positional Encoding (Ke, He, Liu, ICLR 2021).

BERT adds p_i to the word x_i, so the first layer's logit expands into four terms
(paper Eq. 6): word-word, word-position, position-word and position-position, all
through the same W_Q, W_K. TUPE keeps only the first and the last, each with its own
projections, and no position at the input (paper Eq. 7, one head, d = head size):

    a_ij = (x_i W_Q)(x_j W_K)^T / sqrt(2d)  +  (p_i U_Q)(p_j U_K)^T / sqrt(2d)   [+ b_{j-i}]
           \\___ per layer (fused on CUDA) _/    \\_______ positions only _______/   \\ TUPE-R

The position term depends on positions only: `prepare` computes it once per
forward, [H, N, N], and every layer adds it as its `logit_bias` (p, U_Q, U_K shared
by all layers, as in the paper). TUPE-R adds T5's bucketed relative bias b_{j-i}
(`posenc.bias.t5_bucket`, one table shared by all layers).

[CLS] reset (paper Eq. 9): the positional part from [CLS] (row 0, the [CLS]-[CLS]
entry included) becomes a learned scalar theta_1, and to [CLS] (column 0, other rows)
theta_2, so [CLS] is not drawn to its neighbours by positional locality. Each head has
its own pair, as in the paper (the reference code reads them off two extra position
embeddings, p_0 U_Q (p_0 U_K)^T and p_1 U_Q (p_1 U_K)^T per head; ours are free scalars).
The reference code also layer-normalises p before U_Q, U_K; the paper's equations, and
`posenc`, do not.

Options also give the paper's ablations: `cls_reset=False` (TUPE^tie-cls) and
`cross_terms=True, cls_reset=False`: BERT with separate projections for words and
positions (BERT-A^d), q_i = x_i W_Q + p_i U_Q, k_j = x_j W_K + p_j U_K, all four
terms kept, scaled by 1/sqrt(4d) as in the paper (four terms of variance d each).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .absolute import integer_positions
from ..scheme import register
from ..scheme import PositionContext, Scheme, whole_distances


def cls_reset(v: Tensor, theta1: Tensor, theta2: Tensor) -> Tensor:
    """Paper Eq. 9: v[..., h, 0, :] -> theta1[h],
    v[..., h, 1:, 0] -> theta2[h]; the rest unchanged.

    v: [..., H, N, N]; theta1, theta2: one value per head, [H], or scalars
    shared by the heads.
    """
    if theta1.shape != theta2.shape or theta1.dim() > 1:
        raise ValueError(f"theta1 and theta2 must be scalars or [H] vectors "
                         f"of one shape; got {tuple(theta1.shape)} and "
                         f"{tuple(theta2.shape)}")
    if theta1.dim() == 1 and (v.dim() < 3 or v.shape[-3] != theta1.shape[0]):
        raise ValueError(
            f"v must be [..., H, N, N] with H = {theta1.shape[0]} "
            f"(one theta per head); got {tuple(v.shape)}")
    n = v.shape[-1]
    row = torch.arange(n, device=v.device)[:, None] == 0  # (N, 1): from [CLS]
    col = torch.arange(n, device=v.device)[None, :] == 0  # (1, N): to [CLS]
    # (H, 1, 1) or ()
    t1, t2 = (t.to(v.dtype).reshape(t.shape + (1, 1))
              for t in (theta1, theta2))
    return torch.where(row, t1, torch.where(col, t2, v))


def four_terms(x: Tensor, p: Tensor, w_q: Tensor, w_k: Tensor, scale: float) -> dict[str, Tensor]:
    """The four terms of BERT's first-layer logits (paper Eq. 6, Figure 2), for one head.

    x, p: [N, d_model] word and position embeddings; w_q, w_k: [d_model, d_h].
    Returns {"word-word", "word-position", "position-word", "position-position"}: [N, N] each,
    which sum to ((x + p) W_Q)((x + p) W_K)^T * scale.
    """
    qx, kx, qp, kp = x @ w_q, x @ w_k, p @ w_q, p @ w_k                         # (N, d_h) each
    return {"word-word": qx @ kx.T * scale, "word-position": qx @ kp.T * scale,
            "position-word": qp @ kx.T * scale, "position-position": qp @ kp.T * scale}


def bert_first_layer_terms(model, ids: Tensor, head: int = 0, *, layer_norm: bool = True) -> dict[str, Tensor]:
    """`four_terms` of one head of the first layer of a trained BERT-A (`learned` scheme with [CLS]).

    ids: [N] token ids at positions 1..N ([CLS] at 0 is left out). The paper's Eq. 6 expands
    (x_i + p_i) W_Q ((x_j + p_j) W_K)^T, with no layer norm in it. This model's first layer
    reads LN(x + p) = gamma * (x - mean x + p - mean p) / sigma + beta, with sigma the standard
    deviation of x + p (per token, with the norm's eps). The centring is linear, so with
    `layer_norm` (the default) the terms are those of x' = gamma * (x - mean x) / sigma and
    p' = gamma * (p - mean p) / sigma, and a fifth, "layer-norm shift", holds every product with
    beta: the five sum to the layer's logits, in nats. Without it the four are the raw
    embeddings' terms, which the norm scales by orders of magnitude. Returns [N, N] terms.
    """
    if not hasattr(model.scheme, "table") or model.cls is None:
        raise ValueError("bert_first_layer_terms needs a model built with scheme 'learned' and cls_token=True")
    if not isinstance(layer_norm, bool):
        raise TypeError(f"layer_norm must be True or False; got {layer_norm!r}")
    d_model = model.tok.weight.shape[1]
    dh = d_model // model.scheme.n_heads
    if not isinstance(head, int) or not 0 <= head < model.scheme.n_heads:
        raise ValueError(f"head must be an int in [0, {model.scheme.n_heads}); got {head!r}")
    w = model.blocks[0].attn.qkv.weight.detach()                                # (3D, D): q, k, v rows
    rows = slice(head * dh, (head + 1) * dh)
    w_q, w_k, scale = w[:d_model][rows].T, w[d_model:2 * d_model][rows].T, 1 / math.sqrt(dh)
    with torch.no_grad():
        x, p = model.tok(ids), model.scheme.table[1:len(ids) + 1]                # (N, D) each
        if not layer_norm:
            return four_terms(x, p, w_q, w_k, scale)
        ln = model.blocks[0].ln1
        sigma = torch.sqrt((x + p).var(-1, unbiased=False, keepdim=True) + ln.eps)   # (N, 1)
        xn = ln.weight * (x - x.mean(-1, keepdim=True)) / sigma                  # (N, D)
        pn = ln.weight * (p - p.mean(-1, keepdim=True)) / sigma
        terms = four_terms(xn, pn, w_q, w_k, scale)
        qb, kb = ln.bias @ w_q, ln.bias @ w_k                                    # (d_h,) each
        q, k = (xn + pn) @ w_q, (xn + pn) @ w_k                                  # (N, d_h) each
        terms["layer-norm shift"] = (q @ kb[:, None] + (qb @ k.T)[None, :] + qb @ kb) * scale
        return terms


@register("tupe")
class TUPE(Scheme):
    """Untied positional attention; TUPE-A by default, TUPE-R with `relative=True`::

        a_ij = (x_i W^Q)(x_j W^K)^T / sqrt(2d)
               + reset_theta((p_i U^Q)(p_j U^K)^T / sqrt(2d) + b_{j-i})_ij,

    the position term computed once per forward and shared by the layers; b_{j-i} only in TUPE-R;
    reset_theta puts theta_1 on the row from [CLS] and theta_2 on the column to it.

    Args:
        relative: add T5's relative bias b_{j-i} (TUPE-R).
        cls_reset: replace the [CLS] row/column of the positional term by theta_1, theta_2
            (only when the model has a [CLS] token).
        cross_terms: keep the word-position terms (BERT-A^d ablation; scale 1/sqrt(4d)).
        num_buckets: T5 bucketing for TUPE-R: the number of buckets.
        max_distance: T5 bucketing for TUPE-R: where the log buckets end.
    """

    def __init__(self, *, d_model, n_heads, n_layers, max_len, causal, relative: bool = False,
                 cls_reset: bool = True, cross_terms: bool = False, num_buckets: int = 32,
                 max_distance: int = 128):
        super().__init__(d_model=d_model, n_heads=n_heads, n_layers=n_layers, max_len=max_len, causal=causal)
        for name, value in (("relative", relative), ("cls_reset", cls_reset), ("cross_terms", cross_terms)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be True or False; got {value!r}")
        self.relative, self.reset, self.cross_terms = relative, cls_reset, cross_terms
        self.pos = nn.Embedding(max_len, d_model)                                # p_i, shared by all layers
        self.u_q = nn.Linear(d_model, d_model, bias=False)                       # U_Q (all heads)
        self.u_k = nn.Linear(d_model, d_model, bias=False)                       # U_K
        self.theta = nn.Parameter(torch.zeros(2, n_heads))                       # theta_1, theta_2 of each head
        if relative:
            from .bias import t5_bucket  # the relative-encodings chapter's T5 buckets
            t5_bucket(torch.zeros(1, dtype=torch.long), bidirectional=not causal, num_buckets=num_buckets,
                      max_distance=max_distance)                                 # validates both now, by name
            self._bucket = lambda rel: t5_bucket(rel, bidirectional=not causal, num_buckets=num_buckets,
                                                 max_distance=max_distance)
            self.rel_bias = nn.Embedding(num_buckets, n_heads)                   # b: one scalar per bucket and head

    def logit_scale(self) -> float:
        """1/sqrt(2 d_h) for TUPE's two terms; 1/sqrt(4 d_h) for BERT-A^d's
        four, as in the paper."""
        return 1.0 / math.sqrt((4 if self.cross_terms else 2) * self.head_dim)

    def heads(self, t: Tensor) -> Tensor:
        return t.view(t.shape[0], self.n_heads, self.head_dim).transpose(0, 1)   # (N, D) -> (H, N, d_h)

    def position_term(
            self, ctx: PositionContext) -> tuple[Tensor, Tensor, Tensor]:
        """(p_i U_Q)(p_j U_K)^T * scale: [H, N, N],
        and p U_Q, p U_K: [H, N, d_h]."""
        minmax = ctx.minmax()
        pos = integer_positions(ctx.positions, minmax=minmax)
        if minmax is not None and minmax[1] >= self.max_len:
            raise ValueError(f"positions must be < max_len={self.max_len}; "
                             f"got {int(minmax[1])}")
        p = self.pos(pos)  # (N, D)
        # (H, N, d_h)
        pq, pk = self.heads(self.u_q(p)), self.heads(self.u_k(p))
        return pq @ pk.transpose(-2, -1) * self.logit_scale(), pq, pk

    def prepare(self, ctx: PositionContext) -> dict:
        """Once per forward: the positional logits shared by every layer."""
        term, pq, pk = self.position_term(ctx)                    # (H, N, N)
        if self.relative:
            # (N, N): j - i
            rel = ctx.positions[None, :] - ctx.positions[:, None]
            term = term + self.rel_bias(
                self._bucket(whole_distances(rel, "TUPE-R's buckets"))
            ).permute(2, 0, 1)
        if self.reset and ctx.has_cls:
            term = cls_reset(term, self.theta[0], self.theta[1])
        else:
            # no reset: theta stays in the graph with a zero gradient
            # (no unused parameters)
            term = term + 0.0 * self.theta.sum()
        return {"tupe_bias": term, "pq": pq, "pk": pk}

    def logit_bias(self, ctx: PositionContext) -> Tensor:
        return ctx.tables["tupe_bias"]  # (H, N, N)

    def extra_logits(self, q: Tensor, k: Tensor, ctx: PositionContext, layer: int) -> Tensor | None:
        """BERT-A^d only: the word-position terms (x_i W_Q)(p_j U_K)^T + (p_i U_Q)(x_j W_K)^T, scaled."""
        if not self.cross_terms:
            return None
        pq, pk = ctx.tables["pq"].to(q.dtype), ctx.tables["pk"].to(q.dtype)    # (H, N, d_h)
        return (q @ pk.transpose(-2, -1) + pq @ k.transpose(-2, -1)) * self.logit_scale()
