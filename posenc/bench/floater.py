"""What FLOATER's positions cost against the sinusoidal table (Liu et al. 2020 warn of it).

For each length n, the fastest of `repeats` interleaved calls (one process, CPU or the default device) of:
the sinusoidal table; FLOATER's ODE solve p(0..n-1) (fixed-step RK4, one step per position), forward
only and, with `backward`, forward + backward as in training; and the lookup in the table
`Floater.cache(n)` keeps for inference. Times vary by machine: they are never asserted in tests.
"""
from __future__ import annotations

import torch

from ..schemes.absolute import sinusoidal_table
from ..schemes.floater import Floater
from ..table import Table
from .timing import CLOCKS, interleaved_times


def floater_cost(lengths=(512, 4096), dim: int = 128, layers: int = 4, repeats: int = 5, backward: bool = True,
                 clock: str = "wall") -> Table:
    """One row per length: milliseconds of the sinusoidal table, FLOATER's solve and its cached lookup, and
    their ratios to the sinusoidal table (`floater/sin`, `cached/sin`, and `fwd_bwd/sin` with `backward`)."""
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {tuple(CLOCKS)}; got {clock!r}")
    if not (isinstance(repeats, int) and repeats >= 1):
        raise ValueError(f"repeats must be an int >= 1; got {repeats!r}")
    return Table(_row(n, dim, layers, repeats, backward, clock) for n in lengths)


def _row(n: int, dim: int, layers: int, repeats: int, backward: bool, clock: str) -> dict:
    torch.manual_seed(0)
    floater = Floater(d_model=dim, n_heads=1, n_layers=layers, max_len=n, causal=True).eval()
    pos = torch.arange(n)

    def best(fn, rounds=repeats):
        return min(interleaved_times({"fn": fn}, rounds=rounds, clock=clock)["fn"])

    with torch.no_grad():
        sin, solve = best(lambda: sinusoidal_table(n, dim)), best(lambda: floater.solve(pos))
        floater.cache(n)
        cached = best(lambda: floater.cached[:, pos])
    row = {"positions": n, "sinusoidal_ms": 1e3 * sin, "floater_ms": 1e3 * solve, "cached_ms": 1e3 * cached,
           "floater/sin": solve / sin, "cached/sin": cached / sin}
    if backward:
        fwd_bwd = best(lambda: floater.solve(pos).sum().backward(), max(1, repeats // 2))
        row.update({"floater_fwd_bwd_ms": 1e3 * fwd_bwd, "fwd_bwd/sin": fwd_bwd / sin})
    return row
