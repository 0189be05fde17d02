"""DeBERTa's disentangled attention (He, Liu, Gao, Chen, ICLR 2021).

Token i carries a content vector H_i and, towards token j, a relative position
vector P_{delta(i,j)} taken from ONE table P in R^{2k x d} shared by all layers. With
Q_c = H W_q, K_c = H W_k (the usual per-layer projections) and Q_r = P W_{q,r},
K_r = P W_{k,r} (per-layer projections of the shared table), the logits are
(paper Eq. 4, one head):

    A_ij = [ Q_c_i . K_c_j                      content-to-content  (c2c)
           + Q_c_i . K_r_{delta(i,j)}           content-to-position (c2p)
           + K_c_j . Q_r_{delta(j,i)} ] / sqrt(3d)   position-to-content (p2c)

the position-to-position term dropped. The relative distance (paper Eq. 3) is

    delta(i, j) = 0           if i - j <= -k
                = 2k - 1      if i - j >= k
                = i - j + k   otherwise,

note the sign: query minus key, the opposite of the package's key - query.

Memory-efficient algorithm (paper section 3.1 / Algorithm 1): never build the
[N, N, d] tensor K_r[delta(i, j)]; multiply Q_c by the 2k rows of K_r once
(an [N, 2k] matrix) and gather column delta(i, j) for each (i, j). Same for p2c with
K_c against Q_r. Cost O(N k d) time and O(N k + N^2) memory instead of O(N^2 d).

DeBERTa v2 replaces the clipped distance by log buckets (`log_bucket_position`):
exact within +-bucket_size/2, logarithmic out to `max_position`.

Enhanced Mask Decoder (paper section 3.2): absolute positions enter only before
the last `emd_layers` layers (`absolute="emd"`), not at the input (`absolute="input"`
is BERT's way, the "-EMD" ablation) or never (`absolute="none"`: purely relative).
That is the book's simple form, a residual injection. The paper's form
(`emd_passes=n`, n = 2 in DeBERTa's code) is a decoder that shares the last layer's
weights: with h the last layer's input and P the absolute embeddings,

    I_0 = h + P,    I_{t+1} = Layer_L(queries I_t; keys and values h),   t < n,

and the masked-token head reads I_n. P enters the queries only; keys and values
stay relative-only. Fine-tuning would keep the plain stack (Layer_L(h)), so the
decoder costs no parameters, only n - 1 extra passes of one layer.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..scheme import register
from ..scheme import PositionContext, Scheme, whole_distances

TERMS = ("c2p", "p2c")
ABSOLUTE = ("emd", "input", "none")


# -- pure functions -----------------------------------------------------------
def log_bucket_position(relative_pos: Tensor, bucket_size: int, max_position: int) -> Tensor:
    """DeBERTa v2's log buckets of a (query - key) distance: exact for |r| <= bucket_size/2.

        b(r) = r                                                    if |r| <= m
             = sign(r) (m + ceil(log(|r|/m) / log((max_position-1)/m) * (m-1)))   otherwise,

    with m = bucket_size // 2; long tensor of the shape of `relative_pos`.
    """
    if not isinstance(bucket_size, int) or bucket_size < 4:
        raise ValueError(f"bucket_size must be an int >= 4; got {bucket_size!r}")
    if not isinstance(max_position, int) or max_position <= bucket_size // 2 + 1:
        raise ValueError(f"max_position must be an int > bucket_size // 2 + 1; got {max_position!r}")
    mid = bucket_size // 2
    r = relative_pos.to(torch.float64)
    far = r.abs().clamp(min=mid)                                                    # avoid log(0)
    log_pos = torch.ceil(torch.log(far / mid) / math.log((max_position - 1) / mid) * (mid - 1)) + mid
    return torch.where(r.abs() <= mid, r, log_pos * torch.sign(r)).long()


def relative_index(query_pos: Tensor, key_pos: Tensor, k: int, bucket_size: int | None = None,
                   max_position: int | None = None) -> Tensor:
    """delta(i, j) of paper Eq. 3 for arbitrary positions: long [len(query_pos), len(key_pos)] in [0, 2k).

    With `bucket_size` (v2), the distance is log-bucketed first and k = bucket_size.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int; got {k!r}")
    if (bucket_size is None) != (max_position is None):
        raise ValueError("bucket_size and max_position must be given together (v2 log buckets) or not at all")
    rel = whole_distances(query_pos[:, None] - key_pos[None, :], "DeBERTa's table")   # (Nq, Nk): i - j
    if bucket_size is not None and max_position is not None:
        rel = log_bucket_position(rel, bucket_size, max_position)
        k = bucket_size
    return (rel + k).clamp(0, 2 * k - 1)


def relative_distance(q_len: int, k_len: int, k: int) -> Tensor:
    """DeBERTa's delta(i, j) for i < q_len, j < k_len (contract): long [q_len, k_len] in [0, 2k)::

        delta(i, j) = clamp(i - j + k, 0, 2k - 1)

    (0 for i - j <= -k, 2k - 1 for i - j >= k; paper Eq. 3)."""
    for name, value in (("q_len", q_len), ("k_len", k_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int; got {value!r}")
    return relative_index(torch.arange(q_len), torch.arange(k_len), k)


def c2p_p2c(q: Tensor, k: Tensor, q_r: Tensor | None, k_r: Tensor | None,
            index: Tensor, p2c_index: Tensor | None = None) -> Tensor:
    """c2p + p2c logits (unscaled) by the memory-efficient gather
    (paper Algorithm 1).

    q, k: [B, H, N, dh] content queries/keys; q_r, k_r: [H, 2k, dh] projected
    relative embeddings (None drops that term); index: [N, N] long,
    delta(i, j). p2c reads row p2c_index[j, i] of Q_r for the pair (i, j): by
    default delta(j, i) (paper Eq. 4); pass index.T for delta(i, j), which is
    what DeBERTa's released code (and transformers) computes. Returns
    [B, H, N, N]; no [N, N, dh] tensor is built.
    """
    B, H, N, _ = q.shape
    p2c_index = index if p2c_index is None else p2c_index
    out = q.new_zeros(B, H, N, N)
    if k_r is not None:  # c2p: Q_c_i . K_r_{delta(i,j)}
        c2p = q @ k_r.transpose(-2, -1)                       # (B, H, N, 2k)
        out = out + c2p.gather(-1, index.expand(B, H, N, N))  # (B, H, Ni, Nj)
    if q_r is not None:  # p2c: K_c_j . Q_r_{delta(j,i)}
        p2c = k @ q_r.transpose(-2, -1)                       # (B, H, Nj, 2k)
        # at [j, i] -> (Ni, Nj)
        out = out + (p2c.gather(-1, p2c_index.expand(B, H, N, N))
                     .transpose(-2, -1))
    return out


def c2p_p2c_naive(q: Tensor, k: Tensor, q_r: Tensor | None, k_r: Tensor | None, index: Tensor) -> Tensor:
    """Paper Eq. 4's c2p + p2c through the [N, N, dh] tensors K_r[delta(i, j)] (reference; O(N^2 d) memory)."""
    out = q.new_zeros(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    if k_r is not None:
        out = out + torch.einsum("bhid,hijd->bhij", q, k_r[:, index])                # k_r[:, index]: (H, Ni, Nj, dh)
    if q_r is not None:
        out = out + torch.einsum("bhjd,hijd->bhij", k, q_r[:, index.T])              # at [i, j]: Q_r[delta(j, i)]
    return out


# -- the scheme ----------------------------------------------------------------
@register("deberta")
class DeBERTa(Scheme):
    """Disentangled attention with a layer-shared relative table and the EMD::

        A_ij = Q^c_i . K^c_j + Q^c_i . K^r_delta(i,j) + K^c_j . Q^r_delta(j,i),
        H_o = softmax(A / sqrt(3 d_h)) V^c,

    with Q^r, K^r the shared table P projected per layer and delta = `relative_distance`.

    Args:
        k: relative distances are clipped to [-k, k) (paper's k; table of 2k rows).
        terms: which position terms to keep, a subset of ("c2p", "p2c"); the scale is
            1/sqrt((1 + len(terms)) d_h), i.e. 1/sqrt(3 d_h) with both (as DeBERTa's code).
        absolute: "emd" (absolute positions before the last `emd_layers` layers),
            "input" (added to the input, as BERT: the -EMD ablation) or "none".
        emd_layers: how many final layers see absolute positions when `absolute="emd"`.
        bucket_size: DeBERTa v2's log buckets: the bucket count (with `max_position`, or neither).
        max_position: DeBERTa v2's log buckets: the largest distance bucketed (with `bucket_size`).
        p2c_delta: "paper" reads Q_r at delta(j, i) (Eq. 4); "code" at delta(i, j), as
            DeBERTa's released code and transformers do.
        emd_passes: None (default) for the residual EMD above; an int n >= 1 for the paper's
            decoder: the last layer run n times with queries h + P, keys and values h
            (needs `absolute="emd"` and `emd_layers=1`).
    """

    def __init__(self, *, d_model, n_heads, n_layers, max_len, causal, k: int = 32, terms=TERMS,
                 absolute: str = "emd", emd_layers: int = 1, bucket_size: int | None = None,
                 max_position: int | None = None, p2c_delta: str = "paper", emd_passes: int | None = None):
        super().__init__(d_model=d_model, n_heads=n_heads, n_layers=n_layers, max_len=max_len, causal=causal)
        if isinstance(terms, str) or not isinstance(terms, (tuple, list, set, frozenset)):
            raise TypeError(f"terms must be a tuple of position terms, a subset of {TERMS}; got {terms!r}")
        terms = tuple(terms)
        if not set(terms) <= set(TERMS):
            raise ValueError(f"terms must be a subset of {TERMS}; got {terms!r}")
        if absolute not in ABSOLUTE:
            raise ValueError(f"absolute must be one of {ABSOLUTE}; got {absolute!r}")
        if absolute == "emd" and not (isinstance(emd_layers, int) and 1 <= emd_layers <= n_layers):
            raise ValueError(f"emd_layers must be an int in [1, n_layers={n_layers}]; got {emd_layers!r}")
        if (bucket_size is None) != (max_position is None):
            raise ValueError("bucket_size and max_position must be given together (v2 log buckets) or not at all")
        if bucket_size is not None and max_position is not None:
            log_bucket_position(torch.zeros(1), bucket_size, max_position)        # validates both now, by name
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive int; got {k!r}")
        if p2c_delta not in ("paper", "code"):
            raise ValueError(f"p2c_delta must be 'paper' or 'code'; got {p2c_delta!r}")
        if emd_passes is not None:
            if isinstance(emd_passes, bool) or not isinstance(emd_passes, int) or emd_passes < 1:
                raise ValueError(f"emd_passes must be None or a positive int; got {emd_passes!r}")
            if absolute != "emd" or emd_layers != 1:
                raise ValueError(f"emd_passes needs absolute='emd' and emd_layers=1 (the decoder reuses the last "
                                 f"layer); got absolute={absolute!r}, emd_layers={emd_layers!r}")
            self.decoder_passes = emd_passes
        self.p2c_delta, self.emd_passes = p2c_delta, emd_passes
        self.k = bucket_size if bucket_size is not None else k
        self.bucket_size, self.max_position = bucket_size, max_position
        self.terms, self.absolute, self.emd_layers = terms, absolute, emd_layers
        self.rel = nn.Embedding(2 * self.k, d_model)                                # P, shared by all layers
        self.w_kr = nn.ModuleList(nn.Linear(d_model, d_model, bias=False) for _ in range(n_layers))
        self.w_qr = nn.ModuleList(nn.Linear(d_model, d_model, bias=False) for _ in range(n_layers))
        self.abs_pos = nn.Embedding(max_len, d_model) if absolute != "none" else None

    def prepare(self, ctx: PositionContext) -> dict:
        pos = ctx.positions
        return {"delta": relative_index(pos, pos, self.k, self.bucket_size, self.max_position)}  # (N, N)

    def _absolute(self, x: Tensor, ctx: PositionContext) -> Tensor:
        pos, (low, high) = ctx.positions, ctx.minmax() or (0, 0)
        if pos.is_floating_point() or low < 0 or high >= self.max_len:
            raise ValueError(f"absolute positions must be integers in [0, max_len={self.max_len}); got {low}..{high}")
        assert self.abs_pos is not None, "absolute='none' has no table"              # callers check `absolute`
        return x + self.abs_pos(pos)                                                 # (B, N, D)

    def embed(self, x: Tensor, ctx: PositionContext) -> Tensor:
        return self._absolute(x, ctx) if self.absolute == "input" else x

    def layer_input(self, x: Tensor, ctx: PositionContext,
                    layer: int) -> Tensor:
        """Residual EMD: H + P_abs enters before layer n_layers - emd_layers
        (layers counted from 0), and only there."""
        if (self.absolute == "emd" and self.emd_passes is None
                and layer == self.n_layers - self.emd_layers):
            return self._absolute(x, ctx)
        return x

    def decoder_queries(self, h: Tensor, ctx: PositionContext) -> Tensor:
        """The paper's EMD: the decoder's first queries I_0 = h + P_abs (keys and values stay h)."""
        return self._absolute(h, ctx)

    def logit_scale(self) -> float:
        return 1.0 / math.sqrt((1 + len(self.terms)) * self.head_dim)

    def projected(self, layer: int) -> tuple[Tensor | None, Tensor | None]:
        """Q_r, K_r of one layer: each [H, 2k, dh] (None for a dropped term)."""
        split = lambda t: t.view(2 * self.k, self.n_heads, self.head_dim).transpose(0, 1)  # noqa: E731
        q_r = split(self.w_qr[layer](self.rel.weight)) if "p2c" in self.terms else None
        k_r = split(self.w_kr[layer](self.rel.weight)) if "c2p" in self.terms else None
        return q_r, k_r

    def extra_logits(self, q: Tensor, k: Tensor, ctx: PositionContext,
                     layer: int) -> Tensor | None:
        """(c2p + p2c) / sqrt(3 d_h): [B, H, N, N], added to the scaled c2c
        logits."""
        if not self.terms:
            return None
        q_r, k_r = self.projected(layer)
        delta = ctx.tables["delta"]  # (N, N)
        p2c_index = delta if self.p2c_delta == "paper" else delta.T
        return (c2p_p2c(q, k, _like(q_r, q), _like(k_r, q), delta, p2c_index)
                * self.logit_scale())


def _like(t: Tensor | None, ref: Tensor) -> Tensor | None:
    return None if t is None else t.to(ref.dtype)
