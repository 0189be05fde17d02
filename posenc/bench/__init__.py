"""Benchmarks: what each scheme costs, and the kernels the book writes by hand.

    python -m posenc.bench                       # everything, on CUDA if present
    python -m posenc.bench --only schemes xt     # some sections; --help lists them

Every section times its candidates in one process, in turns (round-robin), so that
drifts of the machine's load hit all of them alike, and prints ratios against a
reference measured in the same run. Timings are never asserted in tests.
"""
from .timing import interleaved_times, machine

__all__ = ["interleaved_times", "machine"]
