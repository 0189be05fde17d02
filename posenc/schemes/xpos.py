"""xPos (Sun et al., 2023, "A Length-Extrapolatable Transformer"): RoPE with a decaying scale.

On top of RoPE's rotation R_m (`posenc.rotary`), pair i of a query at position m is scaled
by zeta_i^(m/gamma) and pair i of a key at n by zeta_i^(-n/gamma), with a per-pair zeta_i < 1
(the paper's Eq. for f_q, f_k): queries down, keys up, by more the further from position 0:

    q_m -> zeta^(m/gamma) R_m q_m,   k_n -> zeta^(-n/gamma) R_n k_n,
    zeta_i = (i/(d/2) + gamma_hat) / (1 + gamma_hat),   i = 0 .. d/2 - 1,

gamma_hat = 0.4 and the scale base gamma = 512 as in the paper (and in rotary-embedding-torch
and x-transformers). Pair i of the score is then

    <zeta^(m/gamma) R_m q, zeta^(-n/gamma) R_n k>_i = zeta_i^((m - n)/gamma) <R_{m-n} q, k>_i,

a function of m - n only (shift-invariant in exact arithmetic) that decays with the
distance m - n >= 0: the high-frequency pairs (small i, zeta_i near gamma_hat/(1+gamma_hat))
decay fastest, the low-frequency ones (zeta_i near 1) hardly at all.

Causal only: for a future key, j > i, the factor zeta^((i - j)/gamma) > 1 *grows* with the
distance, so a bidirectional model would amplify far future keys exponentially; the paper
uses xPos in causal language models only, and x-transformers refuses it bidirectionally.
Constructing the scheme with causal=False raises.

Numerical range: the factors zeta^(+-m/gamma) themselves are not shift-invariant; at m =
30,000 the factor zeta_0^(-m/512) = 3.5^58.6 ~ 1e32 is near float32's limit. Every
exponent is therefore taken relative to a centre c of the positions (as the references do,
with c = seq_len // 2):

    q_m -> zeta^((m - c)/gamma) R_m q_m,   k_n -> zeta^(-(n - c)/gamma) R_n k_n,
    c = min(m) + floor((max(m) - min(m) + 1) / 2)     (= n // 2 for positions 0 .. n-1),

which leaves every score unchanged (the zeta^(c/gamma) cancel) and shifts with the
positions, so |m - c| <= (max - min)/2 + 1 whatever the offset. The cancellation needs one c
for the queries and the keys of a score: `apply_xpos` called again on new tokens (decoding
with a cache of keys) must be given the same `centre` as the call that made the cached keys. With gamma = 512 the
factors then stay within float32 (and bf16) up to ~70,000 tokens, within float16 (whose q,
k the rotation returns) up to ~9,000; past that `check_xpos_span` refuses the positions (the
scheme checks them once per forward, `apply_xpos` whenever its positions are on the CPU), where the tables
would hold inf. The scale is formed in float64 and folded into the
cos/sin tables (q: zeta^a cos, zeta^a sin; k: the same divided), so the rotation kernel of
`posenc.rotary` does the whole transform and its backward, the transpose, stays exact.

With scaling="pi" the scale is taken at the interpolated positions m/s too, so the decay per
token is zeta^(1/(s gamma)), as in rotary-embedding-torch (x-transformers scales only the
rotation's positions; with its scale_base set to s gamma the two agree).

The scheme takes every RoPE option (layout, scaling, rotary_fraction, p, nope_layers):
with partial rotation only the r rotated dims are scaled, with zeta over their r/2 pairs
(as x-transformers does); NoPE layers are neither rotated nor scaled. The paper's
blockwise causal attention (for extrapolation) is not part of this scheme.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ..scheme import register
from ..scheme import PositionContext
from .rotary import (RoPE, _check_dim, _check_finite, _check_layout, _check_positions, _compute_dtype, rope_table,
                     rotate_leading, rotated_dims)


# -- functional core ------------------------------------------------------------------
def xpos_zeta(dim: int, gamma_hat: float = 0.4, dtype=torch.float64, device=None) -> Tensor:
    """zeta_i = (i/(dim/2) + gamma_hat) / (1 + gamma_hat), i = 0 .. dim/2 - 1: [dim/2], in (0, 1)."""
    _check_dim(dim)
    _check_gamma_hat(gamma_hat)
    i = torch.arange(0, dim // 2, dtype=dtype, device=device)
    return (i / (dim / 2) + gamma_hat) / (1 + gamma_hat)


def xpos_centre(positions: Tensor) -> Tensor:
    """c = min + floor((max - min + 1) / 2): n // 2 for 0..n-1, and c + s when every position moves by s."""
    positions = _check_positions(positions)
    if positions.numel() == 0:
        return positions.new_zeros(())
    lo, hi = positions.min(), positions.max()
    return lo + torch.div(hi - lo + 1, 2, rounding_mode="floor")


def xpos_scale(positions: Tensor, dim: int, scale_base: float = 512.0, gamma_hat: float = 0.4,
               dtype=torch.float32, centre: float | None = None) -> Tensor:
    """zeta_i^((m - c) / scale_base) for every position m: [seq, dim/2] (the query's; the key's is 1 / it);
    c = `centre`, or `xpos_centre(positions)` when None."""
    positions = _check_positions(positions)
    _check_scale_base(scale_base)
    wide = torch.float32 if positions.device.type == "mps" else torch.float64
    c = xpos_centre(positions) if centre is None else _checked_centre(centre)
    power = (positions - c).to(wide) / scale_base                                         # (T,)
    return (xpos_zeta(dim, gamma_hat, wide, positions.device) ** power[:, None]).to(dtype)  # (T, dim/2)


def check_xpos_span(low: float, high: float, scale_base: float = 512.0, gamma_hat: float = 0.4,
                    dtype=torch.float32, centre: float | None = None) -> None:
    """ValueError unless the factors zeta^(+-(m - c)/gamma) of positions low..high fit in `dtype`.

    The largest is zeta_0^(-a) with a = (|m - c|)_max / gamma, which is at most ((high - low) // 2 + 1) / gamma
    for the middle c (`xpos_centre`) and max(high - c, c - low) / gamma for a given `centre`; it fits
    when a ln(1/zeta_0) <= ln(finfo(dtype).max): a span of about 70,000 in float32 and bf16, 9,000
    in float16, at gamma = 512 and the middle c. Past it the tables hold inf and the scores NaN."""
    zeta_0 = gamma_hat / (1 + gamma_hat)
    reach = (high - low) // 2 + 1 if centre is None else max(high - centre, centre - low)
    exponent = reach / scale_base * math.log(1 / zeta_0)
    limit = math.log(torch.finfo(dtype).max)
    if exponent > limit:
        longest = int(2 * (limit / math.log(1 / zeta_0) * scale_base - 1))
        if centre is not None:
            raise ValueError(f"positions {low:g} to {high:g} lie up to {reach:g} from centre={centre:g}, but xPos's "
                             f"scale zeta^((m - c)/scale_base) overflows {dtype} past about {longest // 2} from it at "
                             f"scale_base={scale_base:g}: choose a centre nearer the positions or raise scale_base")
        raise ValueError(f"positions span {high - low + 1:g} (from {low:g} to {high:g}), but xPos's scale "
                         f"zeta^((m - c)/scale_base) overflows {dtype} past a span of about {longest} at "
                         f"scale_base={scale_base:g}: raise scale_base or shorten the span")


def xpos_table(positions: Tensor, dim: int, base: float = 10000.0, scale_base: float = 512.0,
               gamma_hat: float = 0.4, dtype=torch.float32, p: float = 1.0,
               centre: float | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(cos, sin) scaled for queries and for keys: zeta^a cos(m theta), zeta^a sin(m theta), and the same
    divided by zeta^a, a = (m - c)/scale_base (c: `xpos_scale`'s); four [seq, dim/2] tensors of `dtype`."""
    positions = _check_positions(positions)
    wide = torch.float32 if positions.device.type == "mps" else torch.float64
    cos, sin = rope_table(positions, dim, base, wide, p)
    s = xpos_scale(positions, dim, scale_base, gamma_hat, wide, centre)
    return (cos * s).to(dtype), (sin * s).to(dtype), (cos / s).to(dtype), (sin / s).to(dtype)


def apply_xpos(q: Tensor, k: Tensor, positions: Tensor, base: float = 10000.0, layout: str = "interleaved", *,
               scale_base: float = 512.0, gamma_hat: float = 0.4, rotary_fraction: float = 1.0,
               p: float = 1.0, centre: float | None = None) -> tuple[Tensor, Tensor]:
    """(zeta^((m-c)/gamma) R_m q_m, zeta^(-(n-c)/gamma) R_n k_n) for q, k [..., seq, dim] (contract).

    Returns q's and k's dtypes and shapes.

    Args:
        q, k: [..., seq, dim].
        positions: [seq], both the queries' and the keys'.
        scale_base: gamma; over a distance gamma pair i's score is scaled by zeta_i.
        gamma_hat: zeta_i = (i/(d/2) + gamma_hat) / (1 + gamma_hat).
        centre: c; None takes the middle of `positions` (`xpos_centre`), which cancels only within
            this call. Decoding with cached keys needs one c for every call, e.g. centre=0 (fine up
            to about 35,000 positions at scale_base 512 in float32) or the middle of the longest
            context.
        base, layout, rotary_fraction, p: as in `apply_rope`.
    """
    _check_layout(layout)
    for name, x in (("q", q), ("k", k)):
        if not isinstance(x, Tensor) or x.dim() < 2:
            raise ValueError(f"{name} must be a tensor [..., seq, dim]; got {getattr(x, 'shape', type(x).__name__)}")
        _check_dim(x.shape[-1], f"{name}.shape[-1] (dim)")
    if q.shape[-2:] != k.shape[-2:]:
        raise ValueError(f"q and k must have the same [seq, dim]; got {tuple(q.shape[-2:])} and {tuple(k.shape[-2:])}")
    positions = _check_positions(positions)
    _check_finite(positions)
    if positions.shape[0] != q.shape[-2]:
        raise ValueError(f"positions must have length seq={q.shape[-2]} (q.shape[-2]); got {positions.shape[0]}")
    r = rotated_dims(q.shape[-1], rotary_fraction)
    _check_scale_base(scale_base)
    _check_gamma_hat(gamma_hat)
    if centre is not None:
        _checked_centre(centre)
    if positions.numel() and positions.device.type == "cpu":       # read where reading is free (no device wait)
        check_xpos_span(float(positions.min()), float(positions.max()), scale_base, gamma_hat,
                        q.dtype if q.is_floating_point() else torch.float32, centre)
    qc, qs, kc, ks = xpos_table(positions.to(q.device), r, base, scale_base, gamma_hat, _compute_dtype(q.dtype), p,
                                centre)
    return rotate_leading(q, qc, qs, layout), rotate_leading(k, kc, ks, layout)


# -- validation -----------------------------------------------------------------------
def _checked_centre(centre) -> float:
    if isinstance(centre, bool) or not isinstance(centre, (int, float)) or not math.isfinite(centre):
        raise ValueError(f"centre must be a finite number (the c of zeta^((m - c)/scale_base)) or None; "
                         f"got {centre!r}")
    return centre


def _check_gamma_hat(gamma_hat) -> None:
    if isinstance(gamma_hat, bool) or not isinstance(gamma_hat, (int, float)) or not 0 < gamma_hat < float("inf"):
        raise ValueError(f"gamma_hat must be a finite number > 0 (zeta_0 = gamma_hat / (1 + gamma_hat)); "
                         f"got {gamma_hat!r}")


def _check_scale_base(scale_base) -> None:
    if isinstance(scale_base, bool) or not isinstance(scale_base, (int, float)) or not 0 < scale_base < float("inf"):
        raise ValueError(f"scale_base must be a finite number > 0 (gamma in zeta^(m/gamma)); got {scale_base!r}")


# -- the scheme -----------------------------------------------------------------------
@register("xpos")
class XPos(RoPE):
    """RoPE whose query pairs are scaled by zeta^((m-c)/gamma) and key pairs by its inverse; causal only.

    Args:
        scale_base: gamma; over a distance gamma pair i's score is scaled by zeta_i (512).
        gamma_hat: zeta_i = (i/(d/2) + gamma_hat) / (1 + gamma_hat) (0.4).

    and all of RoPE's.
    """

    causal_only = True
    shift_invariant = True

    def __init__(self, *, d_model: int, n_heads: int, n_layers: int, max_len: int, causal: bool,
                 scale_base: float = 512.0, gamma_hat: float = 0.4, **rope_options):
        if causal is not True:
            raise ValueError(f"xpos is causal only (causal_only): for a future key its scale grows with the distance; "
                             f"got causal={causal!r}")
        _check_scale_base(scale_base)
        _check_gamma_hat(gamma_hat)
        super().__init__(d_model=d_model, n_heads=n_heads, n_layers=n_layers, max_len=max_len, causal=causal,
                         **rope_options)
        self.scale_base, self.gamma_hat = float(scale_base), float(gamma_hat)

    def prepare(self, ctx: PositionContext) -> dict:
        extent = ctx.minmax()                                           # on the host: no wait on the device
        if extent is not None:
            low, high = (v / self.factor for v in extent) if self.scaling == "pi" else extent
            check_xpos_span(low, high, self.scale_base, self.gamma_hat)
        return super().prepare(ctx)

    def table_settings(self) -> tuple:
        return super().table_settings() + (self.scale_base, self.gamma_hat)

    def table(self, positions: Tensor, highest: float | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(q cos, q sin, k cos, k sin) [seq, r/2]: RoPE's tables times zeta^((m-c)/gamma) and divided by it."""
        return xpos_table(self.scaled_positions(positions), self.rot_dim, self.effective_base, self.scale_base,
                          self.gamma_hat, p=self.p)

    def transform_qk(self, q: Tensor, k: Tensor, ctx: PositionContext) -> tuple[Tensor, Tensor]:
        qc, qs, kc, ks = ctx.tables["rope"]                             # (T, r/2) each
        return rotate_leading(q, qc, qs, self.layout), rotate_leading(k, kc, ks, self.layout)  # (B, H, T, d_h)
