"""Absolute positional encodings added to the input (hook `embed`).

Sinusoidal table (Vaswani et al. 2017, section 3.5), interleaved layout:

    PE(p, 2i)   = sin(p / base^(2i/d))
    PE(p, 2i+1) = cos(p / base^(2i/d)),     i = 0 .. d/2 - 1
"""
from __future__ import annotations

import torch
from torch import Tensor


def sinusoidal_angles(positions: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """theta[p, i] = p / base^(2i/dim): [len(positions), dim/2], float64 then float32-safe."""
    if not isinstance(dim, int) or dim < 2 or dim % 2:
        raise ValueError(f"dim must be a positive even int; got {dim!r}")
    if not base > 1:
        raise ValueError(f"base must be > 1; got {base!r}")
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)       # (dim/2,)
    return positions.to(torch.float64)[:, None] * inv_freq[None, :]                 # (P, dim/2)


def sinusoidal_table(num_positions: int, dim: int, base: float = 10000.0) -> Tensor:
    """The [num_positions, dim] float32 table, column 2i = sin, column 2i+1 = cos (contract)."""
    if not isinstance(num_positions, int) or num_positions < 0:
        raise ValueError(f"num_positions must be a non-negative int; got {num_positions!r}")
    return sinusoidal_at(torch.arange(num_positions), dim, base)


def sinusoidal_at(positions: Tensor, dim: int, base: float = 10000.0) -> Tensor:
    """PE at arbitrary (integer or fractional) positions: [len(positions), dim] float32."""
    angles = sinusoidal_angles(positions, dim, base)                                # (P, dim/2)
    return torch.stack([angles.sin(), angles.cos()], -1).flatten(-2).float()        # (P, dim) interleaved
