"""Cost of FLOATER's positions against the sinusoidal table: `posenc.bench.floater.floater_cost` from the shell.

    python benchmarks/floater_cost.py [--dim 128] [--layers 4] [--repeats 5] [--clock wall|cpu]
"""
from __future__ import annotations

import argparse

import torch

from posenc.bench.floater import floater_cost
from posenc.bench.timing import CLOCKS


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
    print(f"d_model={args.dim}, layers={args.layers}, torch threads={torch.get_num_threads()}, "
          f"best of {args.repeats}, {args.clock} clock")
    print(floater_cost(args.lengths, args.dim, args.layers, args.repeats, args.backward, args.clock))


if __name__ == "__main__":
    main()
