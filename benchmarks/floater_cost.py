"""Cost of FLOATER's positions against the sinusoidal table (Liu et al. 2020 warn of it).

    python benchmarks/floater_cost.py [--dim 128] [--layers 4] [--repeats 5] [--clock wall|cpu]

For 512 and 4096 positions, times (best of `repeats`, one process, CPU or the
default device): the sinusoidal table; FLOATER's ODE solve (fixed-step RK4, one
step per position, forward only and, unless --no-backward, forward + backward); and the cached FLOATER
table lookup used at inference. Prints one table with times and ratios to the
sinusoidal table. Timings vary by machine: they are never asserted in tests.
"""
from __future__ import annotations

import argparse

import torch

from posenc.absolute import sinusoidal_table
from posenc.bench.timing import CLOCKS, interleaved_times
from posenc.floater import Floater

clock = "wall"


def best_time(fn, repeats: int) -> float:
    """Seconds of the fastest of `repeats` calls (after one warm-up call)."""
    return min(interleaved_times({"fn": fn}, rounds=repeats, clock=clock)["fn"])


def measure(n: int, dim: int, layers: int, repeats: int, backward: bool = True) -> dict:
    torch.manual_seed(0)
    floater = Floater(d_model=dim, n_heads=1, n_layers=layers, max_len=n, causal=True).eval()
    pos = torch.arange(n)

    def solve_backward():
        floater.solve(pos).sum().backward()

    with torch.no_grad():
        sin = best_time(lambda: sinusoidal_table(n, dim), repeats)
        solve = best_time(lambda: floater.solve(pos), repeats)
        floater.cache(n)
        cached = best_time(lambda: floater.cached[:, pos], repeats)
    row = {"positions": n, "sinusoidal_ms": 1e3 * sin, "floater_ms": 1e3 * solve, "cached_ms": 1e3 * cached,
           "floater/sin": solve / sin, "cached/sin": cached / sin}
    if backward:
        fwd_bwd = best_time(solve_backward, max(1, repeats // 2))
        row.update({"floater_fwd_bwd_ms": 1e3 * fwd_bwd, "fwd_bwd/sin": fwd_bwd / sin})
    return row


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 4096])
    parser.add_argument("--no-backward", dest="backward", action="store_false", help="skip the training-cost timing")
    parser.add_argument("--clock", choices=list(CLOCKS), default="wall",
                        help="wall time, or this process's CPU time (steadier on a shared machine; use 1 thread)")
    args = parser.parse_args(argv)
    global clock
    clock = args.clock
    rows = [measure(n, args.dim, args.layers, args.repeats, args.backward) for n in args.lengths]
    print(f"d_model={args.dim}, layers={args.layers}, torch threads={torch.get_num_threads()}, "
          f"best of {args.repeats}, {args.clock} clock")
    cols = list(rows[0])
    print("  ".join(f"{c:>13}" for c in cols))
    for r in rows:
        print("  ".join(f"{r[c]:>13.3f}" if isinstance(r[c], float) else f"{r[c]:>13}" for c in cols))


if __name__ == "__main__":
    main()
