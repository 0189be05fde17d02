"""Rotary position embedding, RoPE (Su et al., RoFormer, 2021), on hook `transform_qk`.

Each pair of a query (or key) at position m is rotated by the angle m * theta_i
(RoFormer Eq. 13-15):

    (q'_{2i}, q'_{2i+1}) = R(m theta_i) (q_{2i}, q_{2i+1}),   theta_i = base^(-2i/d),

i.e. in complex form q'_i = q_i e^{i m theta_i}, so that (RoFormer Eq. 16)

    <R_m q, R_n k> = Re sum_i q_i conj(k_i) e^{i (m - n) theta_i}

depends on m - n only. Two pairings of the d coordinates are in use:

    layout="interleaved": pairs (x_0, x_1), (x_2, x_3), ...          (RoFormer, GPT-J, Meta's LLaMA)
    layout="half":        pairs (x_i, x_{i + d/2}), i < d/2           (GPT-NeoX, transformers' LLaMA)

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
      lowest frequency theta_{d/2-1} by exactly s;
    * every scaling of transformers' `rope_parameters` ("default", "linear", "dynamic", "yarn",
      "llama3", "longrope"): the frequencies and attention factor a of
      `posenc.functional.rope_inv_freq` over the r rotated dims,

          (cos, sin)(m omega'_i) * a,   so that   <a R'_m q, a R'_n k> = a^2 <R'_m q, R'_n k>:

      cos and sin are multiplied by a as transformers does, so q and k are each scaled by a and
      every rotated logit by a^2 (YaRN's temperature sqrt(1/t) = a). "linear" is position
      interpolation written on the frequencies (omega_i / s). "dynamic" (and "longrope", which
      switches from its short to its long factors) read the current length, n = max(m) + 1, at
      every forward: the frequencies of a sequence depend on its longest position. Every key of a
      forward is rotated with the same frequencies here; a decoder that caches rotated keys mixes
      keys rotated at earlier, shorter lengths with queries rotated at the current one, and the
      score is then no longer a function of m - n (transformers issue #25104).

Which dimensions rotate, and in which layers (scheme options, composable):
    * partial rotation (GPT-NeoX's `rotary_pct`, Phi's `partial_rotary_factor`):
      `rotary_fraction` f in (0, 1]; only the first r = round(f d_h) dims of a head rotate
      (r must be even), as a RoPE of dimension r (theta_i = base^(-2i/r), pairs laid out
      within those r dims), and the last d_h - r pass through:
          q' = [R_m q_{:r} ; q_{r:}];
    * p-RoPE (Barbero et al., 2025, "Round and Round We Go!"): `p` in [0, 1]; of the d/2
      pairs (d = r with partial rotation) the floor(p d/2) of highest frequency keep theta_i,
      the others get theta_i = 0 (angle 0: unrotated, semantic channels), as Gemma's
      `rope_proportion`:
          theta_i = base^(-2i/d) if i < floor(p d/2) else 0;
      p = 1 is RoPE, p = 0 is NoPE;
    * NoPE layers (Llama 4 interleaves them): `nope_layers` (0-based block indices) or
      `nope_every=k` (every k-th block counting from 1: blocks k-1, 2k-1, ...) leave q and k
      unrotated, through the per-layer hook `layer_transform_qk`. The model stays
      shift-invariant: a NoPE layer sees no position at all.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ..host import to_device
from ..compiled import CompiledOrEager
from ..scheme import register
from ..scheme import PositionContext, Scheme, cacheable, caching, check_positions
from .rope_scaling import ROPE_TYPES, rope_inv_freq

LAYOUTS = ("interleaved", "half")
#: How `rotate` runs: PyTorch's eager ops, or the half layout fused by torch.compile.
KERNELS = ("eager", "compiled")
#: Scalings that change the positions or the base only (chapter 11), and those of `rope_inv_freq`.
POSITION_SCALINGS = (None, "pi", "ntk")
SCALINGS = POSITION_SCALINGS + ROPE_TYPES
#: Scalings whose frequencies depend on the current sequence length n = max(position) + 1.
LENGTH_DEPENDENT = ("dynamic", "longrope")


# -- functional core ------------------------------------------------------------------
def rope_frequencies(dim: int, base: float = 10000.0, dtype=torch.float64, device=None) -> Tensor:
    """theta_i = base^(-2i/dim), i = 0 .. dim/2 - 1 (RoFormer Eq. 15): [dim/2]."""
    _check_dim(dim)
    if isinstance(base, bool) or not (isinstance(base, (int, float)) and 1 < base < math.inf):
        raise ValueError(f"base must be a finite number > 1; got {base!r}")
    return base ** (-torch.arange(0, dim, 2, dtype=dtype, device=device) / dim)


def ntk_base(base: float, factor: float, dim: int) -> float:
    """NTK-aware base for extending the context `factor` times: base * factor^(dim/(dim-2))."""
    _check_dim(dim)
    if dim < 4:
        raise ValueError(f"NTK-aware scaling needs dim >= 4; got dim={dim}")
    _check_factor(factor)
    return float(base) * float(factor) ** (dim / (dim - 2))


def _check_factor(factor) -> None:
    """An infinite factor would turn every angle into 0 (a RoPE that no longer encodes position)."""
    if isinstance(factor, bool) or not (isinstance(factor, (int, float)) and 1 <= factor < math.inf):
        raise ValueError(f"factor must be a finite number >= 1; got {factor!r}")


def rotated_dims(head_dim: int, rotary_fraction: float = 1.0) -> int:
    """Partial rotation: the r = round(rotary_fraction * head_dim) leading dims that rotate (even, >= 2).

    Rounded, not floored: transformers (GPT-NeoX's rotary_pct, `rope_inv_freq`'s partial_rotary_factor)
    takes int(), which differs where the float product falls just below an integer (0.29 * 100 gives 28
    dims there, 29 here; 29 is odd and refused). Give a fraction whose product is exact to match it."""
    f = rotary_fraction
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1:
        raise ValueError(f"rotary_fraction must be a number in (0, 1]; got {rotary_fraction!r}")
    r = round(rotary_fraction * head_dim)
    if r < 2 or r % 2:
        raise ValueError(f"rotary_fraction * head_dim must round to an even number >= 2 (RoPE rotates pairs); "
                         f"got round({rotary_fraction!r} * {head_dim}) = {r}")
    return r


def rotated_pairs(pairs: int, p: float = 1.0) -> int:
    """p-RoPE: how many of `pairs` frequency pairs, highest first, keep rotating: floor(p * pairs).

    The 1e-9 keeps a product that is an integer in exact arithmetic (0.58 * 50 = 28.999...)
    from being floored below it. transformers' "proportional" rope_type (Gemma) floors the float
    product itself, so at such a product it rotates one pair fewer (head_dim 100, p = 0.58: 28 pairs
    there, 29 here); where p * pairs is not within 1e-9 below an integer the two agree.
    """
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
        raise ValueError(f"p must be a number in [0, 1] (the fraction of rotating frequency pairs); got {p!r}")
    return math.floor(p * pairs + 1e-9)


def rope_table(positions: Tensor, dim: int, base: float = 10000.0, dtype=torch.float32,
               p: float = 1.0) -> tuple[Tensor, Tensor]:
    """cos(m theta_i), sin(m theta_i) for every position m: two [seq, dim/2] tensors of `dtype`.

    The angles m * theta_i are formed in float64 (float32 on devices without float64),
    so a position like 60,000 keeps its exact value; only the cos/sin are rounded.
    p < 1 (p-RoPE) sets theta_i = 0 for the lowest-frequency pairs i >= floor(p dim/2):
    their cos is exactly 1 and sin exactly 0.
    """
    positions = _check_positions(positions)
    wide = torch.float32 if positions.device.type == "mps" else torch.float64
    theta = rope_frequencies(dim, base, wide, positions.device)                              # (dim/2,)
    theta[rotated_pairs(dim // 2, p):] = 0                                                   # p-RoPE: no rotation
    return frequency_table(positions, theta, dtype)


def frequency_table(positions: Tensor, theta: Tensor, dtype=torch.float32,
                    attention_factor: float = 1.0) -> tuple[Tensor, Tensor]:
    """a cos(m theta_i), a sin(m theta_i) for given frequencies theta [dim/2]:
    two [seq, dim/2] tensors of `dtype`.

    The angles are formed in float64 (float32 on devices without float64)
    whatever theta's dtype; a = attention_factor (1: plain RoPE) scales q and
    k alike, so the logit by a^2.
    """
    positions = _check_positions(positions)
    if not isinstance(theta, Tensor) or theta.dim() != 1:
        raise ValueError(f"theta must be a 1-D tensor [dim/2]; got "
                         f"{getattr(theta, 'shape', type(theta).__name__)}")
    wide = torch.float32 if positions.device.type == "mps" else torch.float64
    angles = (positions.to(wide)[:, None]
              * to_device(theta, positions.device).to(wide))  # (T, dim/2)
    cos, sin = angles.cos(), angles.sin()
    if attention_factor != 1.0:
        cos, sin = cos * attention_factor, sin * attention_factor
    return cos.to(dtype), sin.to(dtype)


def rotate(x: Tensor, cos: Tensor, sin: Tensor, layout: str = "interleaved", *, kernel: str = "eager") -> Tensor:
    """R_m x for x [..., seq, dim] with tables cos, sin [seq, dim/2].

    Autograd: dL/dx = R_m^T g by the inverse rotation, with no activation saved, when only x needs a
    gradient; when cos or sin need one too (learned frequencies, learned or interpolated positions),
    the rotation is written in plain PyTorch ops and autograd also gives dL/dcos and dL/dsin.

    kernel: "eager" (PyTorch ops; the half layout costs about three passes over x) or
    "compiled" (the half layout's rotation fused by `torch.compile` into one pass that reads
    x once and writes y once, forward and backward; compiled once per shape and dtype, with
    a warning and the eager kernel where it cannot be compiled). The interleaved layout is one
    complex multiply already and is eager under both.
    """
    _check_layout(layout)
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}; got {kernel!r}")
    _check_dim(x.shape[-1], "x.shape[-1] (dim)")
    if (cos.shape != sin.shape or cos.dim() != 2 or cos.shape[-1] * 2 != x.shape[-1]
            or cos.shape[0] != x.shape[-2]):                 # a 1-D row would rotate every position alike
        raise ValueError(f"cos/sin must be [seq={x.shape[-2]}, dim/2={x.shape[-1] // 2}]; "
                         f"got {tuple(cos.shape)} and {tuple(sin.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor; got {x.dtype}")
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):   # the angles learn too
        return _half_rotation(x, cos, sin) if layout == "half" else _rotate(x, cos, sin, layout, inverse=False)
    return _Rotate.apply(x, cos, sin, layout, kernel == "compiled" and layout == "half")


def rotate_leading(x: Tensor, cos: Tensor, sin: Tensor, layout: str = "interleaved", *,
                   kernel: str = "eager") -> Tensor:
    """Partial rotation: R_m on the first r = 2 * cos.shape[-1] dims of x [..., seq, dim], the rest unchanged."""
    r = 2 * cos.shape[-1]
    if r == x.shape[-1]:
        return rotate(x, cos, sin, layout, kernel=kernel)
    if r > x.shape[-1]:
        raise ValueError(f"cos/sin rotate {r} dims but x has only x.shape[-1]={x.shape[-1]}")
    return torch.cat([rotate(x[..., :r], cos, sin, layout, kernel=kernel), x[..., r:]], -1)


def apply_rope(x: Tensor, positions: Tensor, base: float = 10000.0, layout: str = "interleaved", *,
               rotary_fraction: float = 1.0, p: float = 1.0, kernel: str = "eager") -> Tensor:
    """Rotate x [..., seq, dim] by the angles positions[t] * theta_i (contract); x's dtype and shape.

    Args:
        x: queries or keys [..., seq, dim], dim even.
        positions: [seq], long or float (fractional positions are fine, e.g. for interpolation).
        base: theta_i = base^(-2i/r), r the rotated dims (dim, or round(rotary_fraction * dim)).
        layout: "interleaved" (RoFormer, Meta's LLaMA) or "half" (GPT-NeoX, transformers' LLaMA).
        rotary_fraction: rotate only the first round(rotary_fraction * dim) dims (GPT-NeoX, Phi).
        p: p-RoPE, the fraction of frequency pairs (highest first) that rotate; the others do not.
        kernel: "eager" or "compiled" (the half layout fused by `torch.compile`; see `rotate`).
    """
    _check_finite(_check_positions(positions))
    return rotate_at_positions(x, positions, base, layout, rotary_fraction=rotary_fraction, p=p, kernel=kernel)


def rotate_at_positions(x: Tensor, positions: Tensor, base: float = 10000.0, layout: str = "interleaved", *,
                        rotary_fraction: float = 1.0, p: float = 1.0, kernel: str = "eager") -> Tensor:
    """`apply_rope` without reading the positions' values (no NaN check, so no host read of a device tensor):
    for the package's own training steps, whose positions are checked where they are made."""
    _check_layout(layout)
    if not isinstance(x, Tensor) or x.dim() < 2:
        raise ValueError(f"x must be a tensor [..., seq, dim]; got {getattr(x, 'shape', type(x).__name__)}")
    _check_dim(x.shape[-1], "x.shape[-1] (dim)")
    positions = _check_positions(positions)
    if positions.shape[0] != x.shape[-2]:
        raise ValueError(f"positions must have length seq={x.shape[-2]} (x.shape[-2]); got {positions.shape[0]}")
    r = rotated_dims(x.shape[-1], rotary_fraction)
    cos, sin = rope_table(positions.to(x.device), r, base, _compute_dtype(x.dtype), p)
    return rotate_leading(x, cos, sin, layout, kernel=kernel)


# -- the rotation and its autograd ----------------------------------------------------
class _Rotate(torch.autograd.Function):
    """y = R(m theta) x;  dL/dx = R(m theta)^T g = R(-m theta) g
    (no activation saved).

    The backward is the transpose whatever the tables: with cos, sin scaled
    by s (xPos, `posenc.xpos`) the map is s R and its vector-Jacobian product
    s R^T g.
    """

    # torch.func.vmap runs forward and backward on the batched tensors
    generate_vmap_rule = True

    @staticmethod
    def forward(x, cos, sin, layout, fused):
        return (_rotate_half_fused(x, cos, sin) if fused
                else _rotate(x, cos, sin, layout, inverse=False))

    @staticmethod
    def setup_context(ctx, inputs, output):
        _, cos, sin, ctx.layout, ctx.fused = inputs
        ctx.save_for_backward(cos, sin)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        if ctx.fused:
            return (_rotate_half_fused(grad.contiguous(), cos, -sin),
                    None, None, None, None)
        return (_rotate(grad, cos, sin, ctx.layout, inverse=True),
                None, None, None, None)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, layout: str,
            inverse: bool) -> Tensor:
    """The rotation itself, computed in float32 at least, returned in x's
    dtype."""
    wide = _compute_dtype(x.dtype)
    cos, sin = cos.to(wide), sin.to(wide)
    # one complex multiply: (x_{2i} + i x_{2i+1}) e^{+-i m theta_i}
    if layout == "interleaved":
        z = _as_complex(x.to(wide))  # (..., T, d/2) complex
        rot = torch.complex(cos, -sin if inverse else sin)  # (T, d/2)
        # (..., T, d)
        return torch.view_as_real(z * rot).flatten(-2).to(x.dtype)
    h = x.shape[-1] // 2  # half: pairs (x_i, x_{i+h})
    s = -sin if inverse else sin
    # (..., T, 2, h): x1 = xv[..., 0, :]
    xv = x.to(wide).unflatten(-1, (2, h))
    out = torch.mul(xv, torch.stack([cos, cos], -2))     # (x1 cos, x2 cos)
    out[..., 0, :].addcmul_(xv[..., 1, :], s, value=-1)  # x1 cos - x2 sin
    out[..., 1, :].addcmul_(xv[..., 0, :], s)            # x2 cos + x1 sin
    out = out.flatten(-2)                                # (..., T, d)
    return out.to(x.dtype)


def _half_rotation(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """(x_1 cos - x_2 sin, x_2 cos + x_1 sin) for the halves x = (x_1, x_2): one expression for the compiler."""
    wide = _compute_dtype(x.dtype)
    h = x.shape[-1] // 2
    x1, x2, c, s = x[..., :h].to(wide), x[..., h:].to(wide), cos.to(wide), sin.to(wide)
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1).to(x.dtype)


def _rotate_half_fused(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """`_half_rotation` compiled once per process (one pass over x); eager, with one warning, where it cannot be."""
    return _FUSED_HALF(x, cos, sin)


_FUSED_HALF = CompiledOrEager(lambda: _half_rotation, "the fused RoPE kernel")


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


def nope_layer_indices(n_layers: int, nope_layers=None, nope_every: int | None = None) -> tuple[int, ...]:
    """The blocks (0-based) that leave q, k unrotated: `nope_layers` as given, or every `nope_every`-th
    block counting from 1 (Llama 4: block l is NoPE when (l + 1) % nope_every == 0); () by default."""
    if nope_layers is not None and nope_every is not None:
        raise ValueError(f"give nope_layers or nope_every, not both; got nope_layers={nope_layers!r}, "
                         f"nope_every={nope_every!r}")
    if nope_every is not None:
        if not _is_int(nope_every) or nope_every < 1:
            raise ValueError(f"nope_every must be a positive int (every k-th layer, counting from 1); "
                             f"got {nope_every!r}")
        if nope_every > n_layers:
            raise ValueError(f"nope_every={nope_every} selects no layer of n_layers={n_layers}")
        return tuple(range(nope_every - 1, n_layers, nope_every))
    if nope_layers is None:
        return ()
    if not isinstance(nope_layers, (tuple, list, range, set, frozenset)) or not all(_is_int(i) for i in nope_layers):
        raise TypeError(f"nope_layers must be a tuple of layer indices (ints); got {nope_layers!r}")
    bad = sorted(i for i in nope_layers if not 0 <= i < n_layers)
    if bad:
        raise ValueError(f"nope_layers must lie in [0, n_layers={n_layers}) (0-based block indices); got {bad}")
    return tuple(sorted(set(nope_layers)))


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_positions(positions) -> Tensor:
    """`check_positions` without reading the values (`_check_finite` reads them where that is free)."""
    return check_positions(positions, finite="never")


def _check_finite(positions: Tensor) -> None:
    """ValueError for NaN or infinite float positions, read only where reading is free (on the CPU): the public
    functions call it; the schemes' training steps, whose positions the model has checked, do not."""
    check_positions(positions, finite="on cpu")


# -- the scheme -----------------------------------------------------------------------
@register("rope")
class RoPE(Scheme):
    """q_m -> R_m q_m, k_n -> R_n k_n in every layer; attention stays fused SDPA.

    The tables are computed once per forward in `prepare` and cached per sequence
    length for the default positions 0..n-1; `set_scaling` changes the extension
    after training (it clears the cache).

    Args:
        base: theta_i = base^(-2i/r), r the rotated dims (d_h by default).
        layout: "interleaved" (RoFormer, Meta's LLaMA) or "half" (GPT-NeoX, transformers' LLaMA).
        scaling: None, "pi" (position interpolation, m -> m / factor), "ntk" (NTK-aware,
            base -> base * factor^(r / (r - 2))), or a rope_type of `rope_inv_freq`
            ("default", "linear", "dynamic", "yarn", "llama3", "longrope"; see `set_scaling`).
        factor: the context-extension factor s >= 1 used by `scaling`.
        scaling_params: the other parameters of a rope_type, named as in transformers'
            `rope_parameters` (e.g. {"original_max_position_embeddings": 512}).
        rotary_fraction: rotate only the first r = round(rotary_fraction * d_h) dims of
            each head (GPT-NeoX `rotary_pct`, Phi `partial_rotary_factor`); r must be even.
        p: p-RoPE; only the floor(p r/2) highest-frequency pairs rotate, the rest get angle 0.
        nope_layers: 0-based blocks where q, k are not rotated (Llama 4's NoPE layers), or
        nope_every: every k-th block, counting from 1, is such a NoPE block.

    and those of `Scheme` (d_model, n_heads, n_layers, max_len, causal).
    """

    shift_invariant = True

    def __init__(self, *, d_model: int, n_heads: int, n_layers: int, max_len: int, causal: bool,
                 base: float = 10000.0, layout: str = "interleaved", scaling: str | None = None,
                 factor: float = 1.0, scaling_params: dict | None = None, rotary_fraction: float = 1.0,
                 p: float = 1.0, nope_layers=None, nope_every: int | None = None):
        super().__init__(d_model=d_model, n_heads=n_heads, n_layers=n_layers, max_len=max_len, causal=causal)
        _check_dim(self.head_dim, "head_dim (d_model / n_heads)")
        _check_layout(layout)
        self.rot_dim = rotated_dims(self.head_dim, rotary_fraction)
        rope_frequencies(self.rot_dim, base)  # validates base
        rotated_pairs(self.rot_dim // 2, p)   # validates p
        self.base, self.layout = float(base), layout
        self.rotary_fraction, self.p = float(rotary_fraction), float(p)
        self.nope_layers = nope_layer_indices(n_layers, nope_layers, nope_every)
        self._cache: dict = {}
        if scaling_params is not None and not isinstance(scaling_params, dict):
            raise TypeError(f"scaling_params must be a dict of rope parameters or None; got {scaling_params!r}")
        if scaling_params and "factor" in scaling_params:    # transformers keeps it there; posenc does not
            raise ValueError(f"give the factor as factor={scaling_params['factor']!r}, not inside "
                             f"scaling_params (which holds a rope_type's other parameters)")
        self.set_scaling(scaling, factor, **(scaling_params or {}))

    def set_scaling(self, scaling: str | None, factor: float = 1.0,
                    **params) -> None:
        """Choose the context extension by `factor` >= 1 (the cache of tables
        is cleared).

        None, "pi" or "ntk": positions m / factor, or the NTK-aware base (no
        other parameters).
        "default", "linear", "dynamic", "yarn", "llama3", "longrope": the
        frequencies and attention factor of
        `rope_inv_freq(r, base, rope_type=scaling, factor=factor, **params)`
        over the r rotated dims, `params` named as in transformers'
        `rope_parameters`. They take `original_max_position_embeddings`, the
        context L the model was trained on (for "dynamic" it is what
        transformers calls max_position_embeddings). "dynamic" and "longrope"
        read the current length n = max(position) + 1 at every forward.
        """
        if scaling not in SCALINGS:
            raise ValueError(f"scaling must be one of {SCALINGS}; "
                             f"got {scaling!r}")
        _check_factor(factor)
        if scaling in POSITION_SCALINGS:
            if params:
                raise ValueError(
                    f"scaling={scaling!r} takes only factor; "
                    f"got parameters {sorted(params)} "
                    f"(they belong to the rope_types {ROPE_TYPES})")
            if scaling is None and factor != 1:
                raise ValueError(
                    f"scaling=None is RoPE unscaled: factor must be 1; "
                    f"got factor={factor!r} "
                    f"(name the scaling it is for, e.g. scaling='pi')")
            if scaling == "ntk":
                # validates the rotated dims
                ntk_base(self.base, factor, self.rot_dim)
        else:
            if type(self).table is not RoPE.table:
                raise ValueError(
                    f"{type(self).__name__} builds its own tables: "
                    f"its scaling must be one of {POSITION_SCALINGS}; "
                    f"got scaling={scaling!r}")
            if scaling == "default" and factor != 1:
                raise ValueError(f"scaling='default' is RoPE unscaled: "
                                 f"factor must be 1; got factor={factor!r}")
            for computed in ("seq_len", "max_position_embeddings",
                             "partial_rotary_factor"):
                if computed in params:
                    raise ValueError(
                        f"scaling={scaling!r}: {computed} is not a "
                        f"parameter here (the length is read from the "
                        f"positions, the rotated dims from rotary_fraction); "
                        f"give original_max_position_embeddings, "
                        f"the training context")
            if (scaling == "dynamic"
                    and "original_max_position_embeddings" not in params):
                raise ValueError(
                    "scaling='dynamic' needs "
                    "original_max_position_embeddings, the training context "
                    "(a positive int): the base grows only beyond it")
        previous = (getattr(self, "scaling", None),
                    getattr(self, "factor", 1.0),
                    getattr(self, "scaling_params", {}))
        self.scaling, self.factor, self.scaling_params = (
            scaling, float(factor), dict(params))
        if scaling in ROPE_TYPES:
            # validates the parameters now, at the training length and
            # beyond it
            try:
                L = params.get("original_max_position_embeddings")
                for n in (None,) if not isinstance(L, int) else (L, 2 * L):
                    self.frequencies(n)
            except (ValueError, TypeError) as err:
                # a refused scaling leaves the scheme as it was
                self.scaling, self.factor, self.scaling_params = previous
                raise type(err)(f"scaling={scaling!r}: {err}") from None
        # The class says True (RoPE's scores depend on m - n only);
        # a scaling that reads the current length n = max(position) + 1
        # makes an offset of every position change the frequencies,
        # so this instance says False.
        self.shift_invariant = scaling not in LENGTH_DEPENDENT
        self.clear_cache()

    def clear_cache(self) -> None:
        """Forget the cos/sin tables kept between forward passes (`Scheme.clear_cache`)."""
        self._cache.clear()

    @property
    def effective_base(self) -> float:
        return ntk_base(self.base, self.factor, self.rot_dim) if self.scaling == "ntk" else self.base

    def frequencies(self, seq_len: int | None = None) -> tuple[Tensor, float]:
        """(omega [r/2] float64, attention factor a): the frequencies the
        tables use, p-RoPE's zeros included.

        seq_len: the current length n (the largest position + 1), which
        "dynamic" and "longrope" read; None: the training length. Under "pi"
        the tables divide the positions instead (same angles).
        """
        if self.scaling in POSITION_SCALINGS:
            theta = rope_frequencies(self.rot_dim, self.effective_base)
            theta, a = (
                (theta / self.factor if self.scaling == "pi" else theta), 1.0)
        else:
            kwargs = {**self.scaling_params}
            if self.scaling != "default":
                kwargs["factor"] = self.factor
            # transformers' max_position_embeddings: the training context
            if self.scaling == "dynamic":
                kwargs["max_position_embeddings"] = kwargs.pop(
                    "original_max_position_embeddings", None)
            theta, a = rope_inv_freq(self.rot_dim, self.base,
                                     rope_type=self.scaling, seq_len=seq_len,
                                     dtype=torch.float64, **kwargs)
        # p-RoPE: no rotation
        theta[rotated_pairs(self.rot_dim // 2, self.p):] = 0
        return theta, float(a)

    def scaled_positions(self, positions: Tensor) -> Tensor:
        """The positions the angles see: m, or m / factor under position interpolation."""
        if self.scaling == "pi":
            return positions.to(torch.float64 if positions.device.type != "mps" else torch.float32) / self.factor
        return positions

    def table(self, positions: Tensor,
              highest: float | None = None) -> tuple[Tensor, ...]:
        """(cos, sin) [seq, r/2] for these positions, with the scaling and p
        applied (times a for a rope_type); xPos returns four (query and key
        tables apart).

        `highest`: max(positions) when known on the host (a length-dependent
        scaling needs it); else read."""
        if self.scaling in POSITION_SCALINGS:
            return rope_table(self.scaled_positions(positions), self.rot_dim,
                              self.effective_base, p=self.p)
        n = None
        if self.scaling in LENGTH_DEPENDENT and positions.numel():
            n = int(positions.max() if highest is None else highest) + 1
        theta, a = self.frequencies(n)
        return frequency_table(positions, theta, attention_factor=a)

    def table_settings(self) -> tuple:
        """Every setting `table` reads besides the positions: the cache key's, so that a table built before
        one of them changed (`scheme.base = ...` for a sweep, say) is not served after."""
        return (self.base, self.p, self.rot_dim, self.scaling, self.factor, repr(sorted(self.scaling_params.items())))

    def prepare(self, ctx: PositionContext) -> dict:
        pos, n = ctx.positions, ctx.seq_len
        key, default = ((n, pos.device, self.table_settings()),
                        ctx.consecutive_start() == 0)  # 0..n-1: cached
        if default and caching() and key in self._cache:
            return {"rope": self._cache[key]}
        tables = self.table(pos, (ctx.minmax() or (None, None))[1])
        if default and cacheable(tables[0]):
            if len(self._cache) >= 16:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = tables
        return {"rope": tables}

    def transform_qk(self, q: Tensor, k: Tensor,
                     ctx: PositionContext) -> tuple[Tensor, Tensor]:
        cos, sin = ctx.tables["rope"]  # (T, r/2) each
        return (rotate_leading(q, cos, sin, self.layout),
                rotate_leading(k, cos, sin, self.layout))  # (B, H, T, d_h)

    def layer_transform_qk(self, q: Tensor, k: Tensor, ctx: PositionContext, layer: int) -> tuple[Tensor, Tensor]:
        """No rotation in the NoPE layers, `transform_qk` in the others."""
        if layer in self.nope_layers:
            return q, k
        return self.transform_qk(q, k, ctx)
