"""Keeping the host from waiting for the GPU: copies that are enqueued, checks read on the host.

A CUDA kernel launch returns at once, so the host can run ahead and queue step t + 1 while the
GPU executes step t. Anything that reads a GPU tensor's *value* on the host (`.item()`,
`bool(tensor)`, `int(tensor.max())`, `torch.unique`, `torch.equal`) or copies from pageable
memory (a plain `t.to("cuda")`: PyTorch synchronises the stream after it) makes the host wait
until the GPU has caught up. For the book's small models the GPU's work per step is short and
the host's launch time long, so one wait per step costs the overlap of the whole step.

Two tools keep the training step free of waits:

* `to_device(t, device)`: a CPU tensor copied from pinned memory, `non_blocking`;
* `host_checked()`: a context in which the model skips the value checks of its inputs (tokens
  in the vocabulary, finite pixels) because the caller checked them on the host, where the
  batch was made (`posenc.runs.train` does, with the model's `check_inputs`).

Positions need neither: the model reads their range where it is free (`PositionContext.minmax`).

The same reads would break a graph that `torch.compile` traces, so inside one the value checks
are assertions the kernels run (`assert_values`), and schemes keep no cached tables
(`posenc.scheme.caching`): `torch.compile(model, fullgraph=True)` traces a model that makes its
own positions as one graph (all schemes but FLOATER and the RNN, `tests/test_compile.py`).
Positions passed in are still read on the host, which breaks the graph there.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import Tensor

_HOST_CHECKED: ContextVar[bool] = ContextVar("posenc_host_checked", default=False)
_KEPT: ContextVar[list | None] = ContextVar("posenc_kept_copies", default=None)


def to_device(t: torch.Tensor, device) -> torch.Tensor:
    """`t` on `device`; from the CPU to a GPU through pinned memory without waiting (`non_blocking`).

    The copy is ordered on the current stream before every later kernel, so reading the result
    is safe; the pinned buffer is kept alive by PyTorch's caching host allocator until the copy ends.
    Inside `keeping_copies()` the pinned buffer is also kept by the caller (a CUDA graph replays the
    copy from it).
    """
    device = torch.device(device)
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    pinned = t.pin_memory()
    kept = _KEPT.get()
    if kept is not None:
        kept.append(pinned)
    return pinned.to(device, non_blocking=True)


@contextmanager
def keeping_copies():
    """Inside: every pinned buffer `to_device` copies from is appended to the list this yields.

    A CUDA graph that captured such a copy reads the buffer again at every replay, so the buffer must
    outlive the graph, unchanged: `posenc.runs.graphed` holds the list as long as its graph. (Only
    copies of values fixed by the batch's shape are captured: positions 0..n-1, their distances.)
    """
    with collecting(_KEPT) as kept:
        yield kept


@contextmanager
def collecting(var: ContextVar):
    """Inside: the context variable `var` holds a new list, which this yields; `var` is restored after."""
    items: list = []
    token = var.set(items)
    try:
        yield items
    finally:
        var.reset(token)


@contextmanager
def host_checked():
    """Inside: models skip the checks of input *values* that would read a GPU tensor on the host.

    Only for callers that have checked the same inputs on the host (e.g. with
    `model.check_inputs(batch)` before `to_device`); shapes and dtypes are still checked.
    """
    token = _HOST_CHECKED.set(True)
    try:
        yield
    finally:
        _HOST_CHECKED.reset(token)


def values_checked_on_host() -> bool:
    """Whether the caller has checked the inputs' values on the host (inside `host_checked()`).

    Always False inside a graph that `torch.compile` traces, which cannot read a context variable:
    there a model checks values with `assert_values` (a check run by the kernels, no wait)."""
    return not torch.compiler.is_compiling() and _HOST_CHECKED.get()


def assert_values(ok: Tensor, message: str) -> None:
    """Fail with `message` unless the bool tensor `ok` is all True, without reading it on the host.

    For a graph that `torch.compile` traces: the check becomes part of the compiled kernels
    (`torch._assert_async`), a RuntimeError on the CPU, a device-side assertion on a GPU. Eager code
    reads the value instead and raises a ValueError that can give the values it found."""
    torch._assert_async(ok.all(), message)
