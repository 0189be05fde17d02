"""Rotary position embedding, RoPE (Su et al., RoFormer, 2021), on hook `transform_qk`.

Each pair of a query (or key) at position m is rotated by the angle m * theta_i
(RoFormer Eq. 13-15):

    (q'_{2i}, q'_{2i+1}) = R(m theta_i) (q_{2i}, q_{2i+1}),   theta_i = base^(-2i/d),

i.e. in complex form q'_i = q_i e^{i m theta_i}, so that (RoFormer Eq. 16)

    <R_m q, R_n k> = Re sum_i q_i conj(k_i) e^{i (m - n) theta_i}

depends on m - n only. Two pairings of the d coordinates are in use:

    layout="interleaved": pairs (x_0, x_1), (x_2, x_3), ...          (RoFormer, GPT-J)
    layout="half":        pairs (x_i, x_{i + d/2}), i < d/2           (GPT-NeoX, LLaMA)

They differ by a fixed permutation of the coordinates only. Angles and their cos/sin
are computed in float64 (float32 where float64 is unavailable) and the rotation runs in
float32 at least, whatever the input dtype: bf16 holds integers exactly only up to 256.

The rotation is a custom autograd `Function` whose backward is the inverse rotation
R(-m theta) (R is orthogonal, so the vector-Jacobian product is R^T g): it saves the
small [seq, d/2] tables, never the activations. No d x d matrix is ever built.

Context extension (scheme options, applied at evaluation or fine-tuning time):
    * position interpolation (Chen et al., 2023, Eq. 4): m -> m / s;
    * NTK-aware scaling (bloc97, 2023; Peng et al., 2024, YaRN Eq. 14-16):
      base -> base * s^(d / (d - 2)), which leaves theta_0 = 1 unchanged and divides the
      lowest frequency theta_{d/2-1} by exactly s.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..scheme import register
from ..scheme import PositionContext, Scheme

LAYOUTS = ("interleaved", "half")
SCALINGS = (None, "pi", "ntk")


# -- functional core ------------------------------------------------------------------
def rope_frequencies(dim: int, base: float = 10000.0, dtype=torch.float64, device=None) -> Tensor:
    """theta_i = base^(-2i/dim), i = 0 .. dim/2 - 1 (RoFormer Eq. 15): [dim/2]."""
    _check_dim(dim)
    if not (isinstance(base, (int, float)) and base > 1):
        raise ValueError(f"base must be a number > 1; got {base!r}")
    return base ** (-torch.arange(0, dim, 2, dtype=dtype, device=device) / dim)


def ntk_base(base: float, factor: float, dim: int) -> float:
    """NTK-aware base for extending the context `factor` times: base * factor^(dim/(dim-2))."""
    _check_dim(dim)
    if dim < 4:
        raise ValueError(f"NTK-aware scaling needs dim >= 4; got dim={dim}")
    return float(base) * float(factor) ** (dim / (dim - 2))


def rope_table(positions: Tensor, dim: int, base: float = 10000.0, dtype=torch.float32) -> tuple[Tensor, Tensor]:
    """cos(m theta_i), sin(m theta_i) for every position m: two [seq, dim/2] tensors of `dtype`.

    The angles m * theta_i are formed in float64 (float32 on devices without float64),
    so a position like 60,000 keeps its exact value; only the cos/sin are rounded.
    """
    positions = _check_positions(positions)
    wide = torch.float32 if positions.device.type == "mps" else torch.float64
    angles = positions.to(wide)[:, None] * rope_frequencies(dim, base, wide, positions.device)  # (T, dim/2)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: Tensor, cos: Tensor, sin: Tensor, layout: str = "interleaved") -> Tensor:
    """R_m x for x [..., seq, dim] with tables cos, sin [seq, dim/2]; autograd via the inverse rotation."""
    _check_layout(layout)
    _check_dim(x.shape[-1], "x.shape[-1] (dim)")
    if cos.shape != sin.shape or cos.shape[-1] * 2 != x.shape[-1] or cos.shape[0] != x.shape[-2]:
        raise ValueError(f"cos/sin must be [seq={x.shape[-2]}, dim/2={x.shape[-1] // 2}]; "
                         f"got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor; got {x.dtype}")
    return _Rotate.apply(x, cos, sin, layout)


def apply_rope(x: Tensor, positions: Tensor, base: float = 10000.0, layout: str = "interleaved") -> Tensor:
    """Rotate x [..., seq, dim] by the angles positions[t] * theta_i (contract).

    positions: [seq], long or float (fractional positions are fine, e.g. for interpolation).
    layout: "interleaved" (RoFormer) or "half" (GPT-NeoX/LLaMA). Returns x's dtype and shape.
    """
    _check_layout(layout)
    if not isinstance(x, Tensor) or x.dim() < 2:
        raise ValueError(f"x must be a tensor [..., seq, dim]; got {getattr(x, 'shape', type(x).__name__)}")
    _check_dim(x.shape[-1], "x.shape[-1] (dim)")
    positions = _check_positions(positions)
    if positions.shape[0] != x.shape[-2]:
        raise ValueError(f"positions must have length seq={x.shape[-2]} (x.shape[-2]); got {positions.shape[0]}")
    cos, sin = rope_table(positions.to(x.device), x.shape[-1], base, _compute_dtype(x.dtype))
    return rotate(x, cos, sin, layout)


# -- the rotation and its autograd ----------------------------------------------------
class _Rotate(torch.autograd.Function):
    """y = R(m theta) x;  dL/dx = R(m theta)^T g = R(-m theta) g (no activation saved)."""

    @staticmethod
    def forward(ctx, x, cos, sin, layout):
        ctx.save_for_backward(cos, sin)
        ctx.layout = layout
        return _rotate(x, cos, sin, layout, inverse=False)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return _rotate(grad, cos, sin, ctx.layout, inverse=True), None, None, None


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, layout: str, inverse: bool) -> Tensor:
    """The rotation itself, computed in float32 at least, returned in x's dtype."""
    wide = _compute_dtype(x.dtype)
    cos, sin = cos.to(wide), sin.to(wide)
    if layout == "interleaved":  # one complex multiply: (x_{2i} + i x_{2i+1}) e^{+-i m theta_i}
        z = _as_complex(x.to(wide))                                    # (..., T, d/2) complex
        rot = torch.complex(cos, -sin if inverse else sin)             # (T, d/2)
        return torch.view_as_real(z * rot).flatten(-2).to(x.dtype)     # (..., T, d)
    h = x.shape[-1] // 2                                               # half: pairs (x_i, x_{i+h})
    s = -sin if inverse else sin
    xv = x.to(wide).unflatten(-1, (2, h))                              # (..., T, 2, h): x1 = xv[..., 0, :]
    out = torch.mul(xv, torch.stack([cos, cos], -2))                   # (x1 cos, x2 cos)
    out[..., 0, :].addcmul_(xv[..., 1, :], s, value=-1)                # x1 cos - x2 sin
    out[..., 1, :].addcmul_(xv[..., 0, :], s)                          # x2 cos + x1 sin
    out = out.flatten(-2)                                              # (..., T, d)
    return out.to(x.dtype)


def _as_complex(x: Tensor) -> Tensor:
    """View [..., d] real as [..., d/2] complex without a copy when the strides allow it."""
    pairs = x.unflatten(-1, (-1, 2))
    try:
        return torch.view_as_complex(pairs)
    except RuntimeError:  # odd strides or storage offset
        return torch.view_as_complex(pairs.contiguous())


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# -- validation -----------------------------------------------------------------------
def _check_dim(dim, name: str = "dim") -> None:
    if not isinstance(dim, int) or dim < 2 or dim % 2:
        raise ValueError(f"{name} must be a positive even int (RoPE rotates pairs); got {dim!r}")


def _check_layout(layout) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}; got {layout!r}")


def _check_positions(positions) -> Tensor:
    if not isinstance(positions, Tensor) or positions.dim() != 1:
        got = getattr(positions, "shape", type(positions).__name__)
        raise ValueError(f"positions must be a 1-D tensor [seq]; got {got}")
    if positions.dtype == torch.bool or positions.is_complex():
        raise TypeError(f"positions must be long or float; got {positions.dtype}")
    return positions


# -- the scheme -----------------------------------------------------------------------
@register("rope")
class RoPE(Scheme):
    """q_m -> R_m q_m, k_n -> R_n k_n in every layer; attention stays fused SDPA.

    Args (besides the `Scheme` ones):
        base: theta_i = base^(-2i/d_h).
        layout: "interleaved" (RoFormer) or "half" (GPT-NeoX/LLaMA).
        scaling: None, "pi" (position interpolation, m -> m / factor) or "ntk"
            (NTK-aware, base -> base * factor^(d_h / (d_h - 2))).
        factor: the context-extension factor s >= 1 used by `scaling`.
    The tables are computed once per forward in `prepare` and cached per sequence
    length for the default positions 0..n-1; `set_scaling` changes the extension
    after training (it clears the cache).
    """

    shift_invariant = True

    def __init__(self, *, d_model: int, n_heads: int, n_layers: int, max_len: int, causal: bool,
                 base: float = 10000.0, layout: str = "interleaved", scaling: str | None = None,
                 factor: float = 1.0):
        super().__init__(d_model=d_model, n_heads=n_heads, n_layers=n_layers, max_len=max_len, causal=causal)
        _check_dim(self.head_dim, "head_dim (d_model / n_heads)")
        _check_layout(layout)
        rope_frequencies(self.head_dim, base)  # validates base
        self.base, self.layout = float(base), layout
        self._cache: dict = {}
        self.set_scaling(scaling, factor)

    def set_scaling(self, scaling: str | None, factor: float = 1.0) -> None:
        """Choose the context extension: None, "pi" or "ntk", by `factor` >= 1."""
        if scaling not in SCALINGS:
            raise ValueError(f"scaling must be one of {SCALINGS}; got {scaling!r}")
        if not (isinstance(factor, (int, float)) and factor >= 1):
            raise ValueError(f"factor must be a number >= 1; got {factor!r}")
        self.scaling, self.factor = scaling, float(factor)
        self._cache.clear()

    @property
    def effective_base(self) -> float:
        return ntk_base(self.base, self.factor, self.head_dim) if self.scaling == "ntk" else self.base

    def table(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """(cos, sin) [seq, d_h/2] for these positions, with the scaling applied."""
        if self.scaling == "pi":
            positions = positions.to(torch.float64 if positions.device.type != "mps" else torch.float32) / self.factor
        return rope_table(positions, self.head_dim, self.effective_base)

    def prepare(self, ctx: PositionContext) -> dict:
        pos, n = ctx.positions, ctx.seq_len
        key = (n, pos.device)
        if key in self._cache and torch.equal(pos, self._cache[key][0]):
            return {"rope": self._cache[key][1]}
        tables = self.table(pos)
        default = torch.arange(n, device=pos.device)
        if torch.equal(pos, default) and not torch.is_inference_mode_enabled():  # cache positions 0..n-1 only
            if len(self._cache) >= 16:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = (default, tables)
        return {"rope": tables}

    def transform_qk(self, q: Tensor, k: Tensor, ctx: PositionContext) -> tuple[Tensor, Tensor]:
        cos, sin = ctx.tables["rope"]                                   # (T, d_h/2) each
        return rotate(q, cos, sin, self.layout), rotate(k, cos, sin, self.layout)  # (B, H, T, d_h)
