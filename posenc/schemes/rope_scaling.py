"""RoPE's frequencies, and the scalings that stretch a trained model past its context.

RoPE rotates pair i of a head by the angle m * omega_i at position m, with

    omega_i = base^(-2i/d),   i = 0 .. d/2 - 1,                               (default)

so pair i has wavelength lambda_i = 2 pi / omega_i. A model trained on L positions has
seen angles up to L * omega_i only; the scalings change the omega_i (and sometimes the
softmax temperature) so that a longer context maps onto angles it has seen:

    linear   (position interpolation):  omega_i / s                     every pair slowed by s
    dynamic  (dynamic NTK):             base' = base * (s n / L - (s - 1))^(d / (d - 2)),
                                        n = max(seq_len, L): the base grows with the context
    yarn     (NTK-by-parts + temperature): pairs with many turns in L keep omega_i, pairs with
             few are interpolated (omega_i / s), a linear ramp between; attention_factor
             0.1 ln s + 1 rescales cos/sin
    llama3   the same three bands chosen by wavelength: lambda < L / high_freq_factor keep,
             lambda > L / low_freq_factor divide by s, a smooth mix between
    longrope one searched factor per pair: omega_i / r_i (short_factor up to L, long_factor
             beyond), attention_factor sqrt(1 + ln s / ln L)

`params` are named as in transformers' `rope_parameters`; `rope_inv_freq` returns what
`transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope_type]` returns (a test checks it).
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3", "longrope")
PARAMS = {
    "default": set(),
    "linear": {"factor"},
    "dynamic": {"factor"},
    "yarn": {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale",
             "mscale_all_dim", "truncate"},
    "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
    "longrope": {"factor", "original_max_position_embeddings", "attention_factor", "short_factor", "long_factor"},
}
REQUIRED = {"linear": {"factor"}, "dynamic": {"factor"}, "yarn": {"original_max_position_embeddings"},
            "llama3": {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"},
            "longrope": {"short_factor", "long_factor", "original_max_position_embeddings"}}


def default_inv_freq(dim: int, base: float, dtype: torch.dtype = torch.float32) -> Tensor:
    """omega_i = base^(-2i/dim), [dim/2] in `dtype` (float32 is transformers' rounding)."""
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype) / dim))


def rope_inv_freq(dim: int, base: float = 10000.0, *, rope_type: str = "default",
                  max_position_embeddings: int | None = None, seq_len: int | None = None,
                  partial_rotary_factor: float = 1.0, dtype: torch.dtype = torch.float32,
                  **params: Any) -> tuple[Tensor, float]:
    """(inv_freq [rotated dim / 2], attention_factor) of RoPE under the scaling `rope_type`.

    omega_i = base^(-2i/dim) by default; with s = factor and L = original_max_position_embeddings
    (for "dynamic", max_position_embeddings; the module docstring gives each in full)::

        linear    omega_i / s
        dynamic   base' = base * (s n / L - (s - 1))^(dim / (dim - 2)),  n = max(seq_len, L)
        yarn      omega_i for many turns in L, omega_i / s for few, a linear ramp between;
                  attention_factor = 0.1 ln s + 1
        llama3    omega_i where lambda_i < L / high_freq_factor, omega_i / s where
                  lambda_i > L / low_freq_factor, a smooth mix between
        longrope  omega_i / r_i (short_factor up to L, long_factor beyond)

    Args:
        dim: the head dimension.
        base: theta_i = base^(-2i/dim) before scaling.
        rope_type: "default", "linear", "dynamic", "yarn", "llama3" or "longrope".
        max_position_embeddings: the context the model serves (dynamic: the training context L;
            yarn/longrope: used for a missing `factor`).
        seq_len: the current length (dynamic, longrope).
        partial_rotary_factor: only int(dim * partial_rotary_factor) dimensions rotate (GPT-NeoX,
            Phi).
        dtype: float32 rounds as transformers does (equal to it); float64 gives the angles of long
            contexts exactly (float32 rounds a frequency theta by up to theta * 2^-24, so the angle
            at position m is off by up to m * theta * 2^-24: at 32k positions cos is off by about
            1e-3 for a 128-dim head).
        **params: the rope_type's parameters, named as in transformers' `rope_parameters`.
    """
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"rope_type must be one of {ROPE_TYPES}; got {rope_type!r}")
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < 2:
        raise ValueError(f"dim must be an int >= 2; got {dim!r}")
    if isinstance(base, bool) or not (isinstance(base, (int, float)) and 1 < base < math.inf):
        raise ValueError(f"base must be a finite number > 1; got {base!r}")
    if isinstance(partial_rotary_factor, bool) or not isinstance(partial_rotary_factor, (int, float)) \
            or not 0 < partial_rotary_factor <= 1:
        raise ValueError(f"partial_rotary_factor must be a number in (0, 1]; got {partial_rotary_factor!r}")
    if seq_len is not None and (isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1):
        raise ValueError(f"seq_len must be a positive int or None; got {seq_len!r}")
    unknown = sorted(set(params) - PARAMS[rope_type])
    if unknown:
        raise ValueError(f"unknown parameters {unknown} for rope_type={rope_type!r}; "
                         f"allowed: {sorted(PARAMS[rope_type]) or 'none'}")
    missing = sorted(REQUIRED.get(rope_type, set()) - {k for k, v in params.items() if v is not None})
    if missing:
        raise ValueError(f"rope_type={rope_type!r} needs {missing}")
    rot = int(dim * partial_rotary_factor)
    if rot < 2 or rot % 2:
        raise ValueError(f"dim * partial_rotary_factor must be an even int >= 2; got {dim} * {partial_rotary_factor}")
    _check_params(params, rot)
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64; got {dtype!r}")
    if rope_type == "default":
        return default_inv_freq(rot, base, dtype), 1.0
    if rope_type == "linear":
        return default_inv_freq(rot, base, dtype) / params["factor"], 1.0
    if rope_type == "dynamic":
        if rot < 4:                                  # base' has the exponent d / (d - 2)
            raise ValueError(f"rope_type='dynamic' needs rotated dims >= 4 (its base' has the exponent d/(d-2)); "
                             f"got dim * partial_rotary_factor = {rot}")
        return _dynamic(rot, base, params["factor"], _need(max_position_embeddings, rope_type), seq_len, dtype), 1.0
    if rope_type == "llama3":
        return _llama3(rot, base, dtype, **params), 1.0
    if rope_type == "yarn":
        return _yarn(rot, base, max_position_embeddings, dtype, **params)
    return _longrope(rot, base, max_position_embeddings, seq_len, dtype, **params)


#: numeric parameters and the least value each may take (> for positive ones, >= for mscale's)
POSITIVE = ("factor", "low_freq_factor", "high_freq_factor", "attention_factor", "beta_fast", "beta_slow")
NON_NEGATIVE = ("mscale", "mscale_all_dim")


def _check_params(params: dict, rot: int) -> None:
    """Each given parameter is a finite number of its sign, an int context, or a list of per-pair factors;
    a bad one raises an error naming it (a factor of 0 would make every frequency inf, silently)."""
    for name, v in params.items():
        if v is None:
            continue
        if name in POSITIVE + NON_NEGATIVE:
            ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
            if not ok or (v <= 0 if name in POSITIVE else v < 0):
                raise ValueError(f"{name} must be a finite number {'> 0' if name in POSITIVE else '>= 0'}; got {v!r}")
        elif name == "original_max_position_embeddings":
            if isinstance(v, bool) or not isinstance(v, int) or v < 2:
                raise ValueError(f"original_max_position_embeddings must be an int >= 2 (the trained context L); "
                                 f"got {v!r}")
        elif name == "truncate":
            if not isinstance(v, bool):
                raise TypeError(f"truncate must be True or False; got {v!r}")
        elif name in ("short_factor", "long_factor"):
            vals = list(v) if isinstance(v, (list, tuple, Tensor)) else None
            if vals is None or len(vals) != rot // 2 or not all(
                    not isinstance(x, bool) and math.isfinite(float(x)) and float(x) > 0 for x in vals):
                raise ValueError(f"short_factor and long_factor must each be dim/2 = {rot // 2} positive finite numbers "
                                 f"(one per rotated pair); {name} is {v!r}")
    lo, hi = params.get("low_freq_factor"), params.get("high_freq_factor")
    if lo is not None and hi is not None and not hi > lo:
        raise ValueError(f"high_freq_factor must be > low_freq_factor (the ramp divides by their difference); "
                         f"got high_freq_factor={hi!r}, low_freq_factor={lo!r}")


def _need(max_position_embeddings, rope_type):
    if (isinstance(max_position_embeddings, bool) or not isinstance(max_position_embeddings, int)
            or max_position_embeddings < 1):                                    # True would read as L = 1
        raise ValueError(f"rope_type={rope_type!r} needs max_position_embeddings (a positive int); "
                         f"got {max_position_embeddings!r}")
    return max_position_embeddings


def _dynamic(dim, base, factor, L, seq_len, dtype):
    """Dynamic NTK: base' = base (s n / L - (s - 1))^(d/(d-2)), n = max(seq_len, L); equal to base at n = L."""
    n = L if seq_len is None else max(int(seq_len), L)
    return default_inv_freq(dim, base * ((factor * n / L) - (factor - 1)) ** (dim / (dim - 2)), dtype)


def _llama3(dim, base, dtype, *, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings):
    """Llama 3.1: keep pairs with wavelength < L/high, divide by s those > L/low, and between them
    mix omega/s and omega with weight (L/lambda - low) / (high - low)."""
    inv = default_inv_freq(dim, base, dtype)
    L = original_max_position_embeddings
    wavelength = 2 * math.pi / inv
    scaled = torch.where(wavelength > L / low_freq_factor, inv / factor, inv)
    w = (L / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    mixed = (1 - w) * scaled / factor + w * scaled
    medium = (wavelength >= L / high_freq_factor) & (wavelength <= L / low_freq_factor)
    return torch.where(medium, mixed, scaled)


def _yarn(dim, base, max_position_embeddings, dtype, *, original_max_position_embeddings, factor=None,
          attention_factor=None, beta_fast=None, beta_slow=None, mscale=None, mscale_all_dim=None, truncate=True):
    """YaRN (Peng et al. 2023). Pair i turns L omega_i / (2 pi) times in the original context L;
    pairs turning more than beta_fast times keep omega_i, fewer than beta_slow are interpolated
    (omega_i / s), and a linear ramp over the pair index joins them. The pair index that turns r
    times is d ln(L / (2 pi r)) / (2 ln base). Temperature: 0.1 ln s + 1 (or the mscale ratio)."""
    L = original_max_position_embeddings
    if factor is None:
        factor = _need(max_position_embeddings, "yarn") / L

    def mscale_of(s, m=1.0):
        return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

    if attention_factor is None:
        attention_factor = (mscale_of(factor, mscale) / mscale_of(factor, mscale_all_dim) if mscale and mscale_all_dim
                            else mscale_of(factor))
    beta_fast, beta_slow = beta_fast or 32, beta_slow or 1

    def pair_index(turns):
        return dim * math.log(L / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_index(beta_fast), pair_index(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=dtype) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp                                          # 1: extrapolate (keep omega_i), 0: interpolate
    wavelength_scale = base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype) / dim)     # 1 / omega_i
    inv, interpolated = 1.0 / wavelength_scale, 1.0 / (factor * wavelength_scale)     # transformers' roundings
    return interpolated * (1 - keep) + inv * keep, float(attention_factor)


def _longrope(dim, base, max_position_embeddings, seq_len, dtype, *, short_factor, long_factor,
              original_max_position_embeddings, factor=None, attention_factor=None):
    """LongRoPE (Ding et al. 2024): omega_i / r_i with searched r (short up to L, long beyond);
    temperature sqrt(1 + ln s / ln L)."""
    L = original_max_position_embeddings
    if factor is None:
        factor = _need(max_position_embeddings, "longrope") / L
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(L))
    r = torch.tensor(long_factor if seq_len and seq_len > L else short_factor, dtype=dtype)
    if r.shape != (dim // 2,):
        raise ValueError(f"short_factor and long_factor must have dim/2 = {dim // 2} entries; got {tuple(r.shape)}")
    shape = torch.arange(0, dim, 2, dtype=torch.int64).to(dtype) / dim
    return 1.0 / (r * base ** shape), float(attention_factor)
