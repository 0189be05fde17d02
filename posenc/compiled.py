"""A kernel compiled by `torch.compile` on its first call, with the eager function as the fallback."""
from __future__ import annotations

import warnings
from typing import Callable

import torch


class CompiledOrEager:
    """Call `load()`'s function compiled by `torch.compile` (once per process, `dynamic=False`). Where it
    cannot be compiled (a CPU machine without a C++ compiler, say) warn once, naming `what`, and call the
    eager function from then on (`fell_back` says so, for a benchmark's row); an error the eager function also
    raises is the caller's and propagates, and a `torch.OutOfMemoryError` is never taken for a failed compile.

    load: a zero-argument callable returning the eager function (so an optional import can wait until
    the first call).
    """

    def __init__(self, load: Callable[[], Callable], what: str):
        self.load, self.what, self.fell_back = load, what, False
        self.kernel: Callable | None = None                 # compiled on the first call

    def __call__(self, *args, **kwargs):
        if self.kernel is None:
            self.kernel = torch.compile(self.load(), dynamic=False)
        kernel = self.kernel
        try:
            return kernel(*args, **kwargs)
        except torch.OutOfMemoryError:                # the inputs are too big, for any kernel: not a compile failure
            raise
        except Exception as err:  # noqa: BLE001  (torch.compile raises many kinds; the eager call re-raises real errors)
            eager = self.load()
            if self.kernel is eager:
                raise
            warnings.warn(f"{self.what} could not be compiled ({type(err).__name__}: {err}); using its eager kernel",
                          RuntimeWarning, stacklevel=3)
            self.kernel, self.fell_back = eager, True
            return eager(*args, **kwargs)
