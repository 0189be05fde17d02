"""The runner's training step captured as a CUDA graph: the same kernels, launched by one call.

A `full` run's step on the H200 is about 10 ms of Python and kernel launches for well under a
millisecond of arithmetic (`posenc.runs.costs`, `posenc.bench.workers`). A CUDA graph records the
kernels of one step once and replays them with a single launch:

    capture:  g = [ loss* = loss_fn(model, x*, y*);  backward;  clip to grad_clip;  AdamW ]
    step t:   x* <- x_t;   y* <- y_t;   replay(g);   loss_t = copy(loss*)

x*, y* and loss* are static buffers: the graph reads and writes the memory it was captured with, so
each step copies its batch into x*, y* and a copy of loss* is what it returns. The arithmetic is
`posenc.runs.train.optimizer_step`'s, kernel for kernel. What a graph needs beyond what that step
already guarantees (no host synchronisation, `tests/test_host_sync.py`):

* one shape per graph: a batch of a new shape first takes `warmup` eager steps on a side stream
  (they build the scheme's caches and the optimiser's state outside the graph), then a graph of its
  own, with its own gradients;
* an optimiser whose state and learning rate live on the GPU: `capturable_adamw` (AdamW with
  capturable=True and lr a tensor; `set_lr` writes it without waiting for the GPU);
* no loss scaling: fp16's GradScaler reads its inf check on the host, so bf16 or fp32 only;
* no positions from the host: randomized positions are read on the host by the model, and a graph
  would replay the first draw for ever;
* every tensor made outside the graph that the graph reads stays where it was: the pinned buffers of
  the host-to-device copies it captured (`posenc.host.keeping_copies`) and the tables a scheme cached
  (RoPE's, ALiBi's, which a later length could replace) are held as long as the graph.

A step that waits on the GPU (a scheme reading it on the host) is found before its capture, under
`torch.cuda.set_sync_debug_mode("error")`, and leaves the run eager, with the reason in `failed`; a
capture that still fails raises. (FlexAttention's block masks, kept by an `lru_cache` of 32 shapes, are
not held by a graph: no `full` run reaches the 2048 keys from which the model takes that path.) `train` steps through a graph where `graphs_wanted()` (the runner's `--cuda-graphs`) and
`graph_refusal` finds nothing against it.

Whether it pays is measured on the GPU (`posenc.bench.graphs`, `scripts/gpu_costs.sh`): the runner
uses it only when asked (`--cuda-graphs`), and each record then says what it did (`summary`).
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from ..host import collecting, host_checked, keeping_copies
from .train import decay_groups


#: The environment variable that asks `train` for graphed steps ("1"), set by `python -m posenc.runs
#: --cuda-graphs` and inherited by its worker processes.
ENV = "POSENC_CUDA_GRAPHS"


def graphs_wanted() -> bool:
    """Whether this process was asked to step through CUDA graphs (ENV is "1")."""
    return os.environ.get(ENV) == "1"


_LOG: ContextVar[list | None] = ContextVar("posenc_graph_log", default=None)


@contextmanager
def graph_log():
    """Inside: every `train` call appends what it did to the list this yields: {"graphs": captured, "why": None,
    or why it stepped eagerly (a refusal, or a step that waits on the GPU)}. The runner stores the summary."""
    with collecting(_LOG) as log:
        yield log


def note(graphs: int, why: str | None) -> None:
    """Add one training's outcome to the current `graph_log` (nothing outside one)."""
    log = _LOG.get()
    if log is not None:
        log.append({"graphs": graphs, "why": why})


def summary(log: list) -> dict:
    """A record's account of its trainings: how many, graphs captured in all, and the distinct reasons for eager steps."""
    return {"trainings": len(log), "graphs": sum(e["graphs"] for e in log),
            "eager_because": sorted({e["why"] for e in log if e["why"]})}


@contextmanager
def graphs_asked(asked: bool = True):
    """Inside: `graphs_wanted()` is `asked`, in this process and in processes it starts (ENV); restored after."""
    before = os.environ.get(ENV)
    os.environ[ENV] = "1" if asked else "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before


def graph_refusal(model: torch.nn.Module, cfg, device: torch.device, dtype) -> str | None:
    """Why `train` cannot step this run through a graph, in a few words; None when it can try."""
    scheme = getattr(model, "scheme", None)
    reasons = [(device.type != "cuda", f"on {device.type}, not CUDA"),
               (dtype == torch.float16, "fp16's loss scaling is read on the host"),
               (cfg.random_positions is not None, "randomized positions are drawn on the host"),
               (bool(cfg.checkpoint_path), "a checkpoint keeps the scheduler a graph does not use"),
               (scheme is not None and not getattr(scheme, "graph_safe", True),
                f"{type(scheme).__name__} is not graph_safe")]
    return next((why for bad, why in reasons if bad), None)


def cached_tensors(model: torch.nn.Module) -> list:
    """Every tensor a module of `model` keeps outside its parameters and buffers (schemes' caches), in dicts,
    lists and tuples too: what a graph captured from them must stay allocated as long as the graph."""
    found = []

    def walk(value, depth):
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif depth and isinstance(value, dict):
            for v in value.values():
                walk(v, depth - 1)
        elif depth and isinstance(value, (list, tuple)):
            for v in value:
                walk(v, depth - 1)

    for module in model.modules():
        for name, value in vars(module).items():
            if name not in ("_parameters", "_buffers", "_modules"):
                walk(value, 3)
    return found


def capturable_adamw(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """`train`'s AdamW (weight decay on matrices only) with its state and lr on the model's GPU, for a graph.

    lr is a one-element tensor on the device; change it with `set_lr`, never by assigning a float.
    """
    device = next(model.parameters()).device
    if device.type != "cuda":
        raise ValueError(f"capturable_adamw needs a model on a CUDA device; its parameters are on {device}")
    opt = torch.optim.AdamW(decay_groups(model, weight_decay), lr=torch.tensor(float(lr), device=device),
                            capturable=True)
    opt._warned_capturable_if_run_uncaptured = True   # the eager warm-up steps are meant: no warning per training
    return opt


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    """Write `lr` into every group's lr tensor in place: a fill kernel, no wait, seen by every captured graph."""
    for group in opt.param_groups:
        group["lr"].fill_(lr)


class GraphedStep:
    """`optimizer_step(model, loss_fn, batch, opt, ..., dtype, grad_clip)` as a CUDA graph per batch shape.

    `step(batch)` -> the step's loss (a tensor, not read), where batch = (x, y, kw) on the model's GPU and
    kw empty. The first `warmup` batches of each shape run eagerly; the next is captured and replayed;
    at most `max_graphs` shapes are captured (others stay eager). `captured` counts the graphs.
    """

    def __init__(self, model: torch.nn.Module, loss_fn, opt: torch.optim.Optimizer, dtype, grad_clip: float,
                 *, warmup: int = 3, max_graphs: int = 4):
        if dtype not in (None, torch.bfloat16, torch.float32):
            raise ValueError(f"dtype must be torch.bfloat16 or None (fp32): fp16's loss scaling reads the "
                             f"GPU on the host, which a graph cannot; got {dtype}")
        if not all(g.get("capturable") and isinstance(g["lr"], torch.Tensor) for g in opt.param_groups):
            raise ValueError("opt must keep its state and lr on the GPU: build it with capturable_adamw")
        for name, value, low in (("warmup", warmup, 1), ("max_graphs", max_graphs, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}; got {value!r}")
        device = next(model.parameters()).device
        if device.type != "cuda":
            raise ValueError(f"GraphedStep needs a model on a CUDA device; its parameters are on {device}")
        if any(g["lr"].device != device for g in opt.param_groups):
            raise ValueError(f"opt's lr tensors must be on the model's device ({device}): build it with capturable_adamw")
        self.model, self.loss_fn, self.opt, self.dtype, self.grad_clip = model, loss_fn, opt, dtype, grad_clip
        self.warmup, self.max_graphs = warmup, max_graphs
        self.seen: dict = {}                        # shape -> eager steps taken at that shape
        self.graphs: dict = {}                      # shape -> (graph, x*, y*, loss*, tensors it reads)
        self.failed: str | None = None              # why the step cannot be captured (then every step is eager)
        self.stream = torch.cuda.Stream(device)     # eager warm-up and capture run off the default stream

    def set_lr(self, lr: float) -> None:
        """The learning rate of every step from now on, captured graphs included (`set_lr`)."""
        set_lr(self.opt, lr)

    @property
    def captured(self) -> int:
        return len(self.graphs)

    def __call__(self, batch) -> torch.Tensor:
        x, y, kw = batch
        if kw:
            raise ValueError(f"a graphed step takes no forward keywords (got {sorted(kw)}): positions drawn on "
                             "the host would be replayed as the first draw at every step")
        key = (tuple(x.shape), x.dtype, tuple(y.shape), y.dtype)
        if key in self.graphs:
            graph, sx, sy, loss, _ = self.graphs[key]
            sx.copy_(x)
            sy.copy_(y)
            graph.replay()
            return loss.clone()
        seen, room = self.seen.get(key, 0), len(self.graphs) < self.max_graphs and not self.failed
        if seen < self.warmup or not room:
            self.seen[key] = seen + 1
            if room and seen == self.warmup - 1:
                return self._last_warmup(x, y)
            return self._on_side_stream(self._eager, x, y)
        self.graphs[key] = self._capture(x, y)
        return self(batch)

    def _last_warmup(self, x, y) -> torch.Tensor:
        """The eager step before a capture, with every wait on the GPU an error (`torch.cuda.set_sync_debug_mode`).

        A step that waits (a scheme reading the GPU on the host) would fail its capture, and a failed capture
        leaves the process's allocator mid-capture. Such a step is found here instead: `failed` says so, the
        step runs again as it is, and every later step stays eager. The aborted attempt changed no parameter:
        the step waits before AdamW, which never waits."""
        before = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            return self._on_side_stream(self._eager, x, y)
        except RuntimeError as err:
            self.failed = f"the step waits on the GPU ({str(err).splitlines()[0] if str(err) else type(err).__name__})"
        finally:
            torch.cuda.set_sync_debug_mode(before)
        return self._on_side_stream(self._eager, x, y)

    def _math(self, x, y) -> torch.Tensor:
        """Forward under autocast, backward, clipping, AdamW: `optimizer_step` without loss scaling."""
        with torch.autocast("cuda", dtype=self.dtype, enabled=self.dtype is not None, cache_enabled=False):
            loss = self.loss_fn(self.model, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.opt.step()
        return loss.detach()

    def _eager(self, x, y) -> torch.Tensor:
        self.opt.zero_grad(set_to_none=True)
        with host_checked():
            return self._math(x, y)

    def _on_side_stream(self, fn, *args):
        current = torch.cuda.current_stream(self.stream.device)
        self.stream.wait_stream(current)            # the batch's copy was queued on the current stream
        with torch.cuda.stream(self.stream):
            out = fn(*args)
        current.wait_stream(self.stream)
        return out

    def _capture(self, x, y) -> tuple:
        """A graph of one step at x's and y's shape, with buffers of its own (captured, not run)."""
        sx, sy = x.clone(), y.clone()
        torch.cuda.synchronize(self.stream.device)  # once per shape: the capture must start from a quiet device
        self.opt.zero_grad(set_to_none=True)       # this graph's gradients are allocated inside it, its own
        graph, current = torch.cuda.CUDAGraph(), torch.cuda.current_stream(self.stream.device)
        try:
            with torch.cuda.graph(graph, stream=self.stream), host_checked(), keeping_copies() as copied:
                loss = self._math(sx, sy)
        except Exception as err:
            torch.cuda.set_stream(current)          # a failed capture_end leaves the capture stream current
            cause = err.__context__ or err          # capture_end's own error hides the one that broke the capture
            raise RuntimeError(f"capturing the training step as a CUDA graph failed ({type(cause).__name__}: "
                               f"{str(cause).splitlines()[0] if str(cause) else ''}); this process's CUDA allocator "
                               "may be left mid-capture: train this run without --cuda-graphs") from err
        return graph, sx, sy, loss, copied + cached_tensors(self.model)
