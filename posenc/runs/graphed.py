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
  would replay the first draw for ever.

Whether it pays is measured on the GPU (`posenc.bench.graphs`, `scripts/gpu_costs.sh`): the runner
does not use it until a window shows a gain.
"""
from __future__ import annotations

import torch

from ..host import host_checked
from .train import decay_groups


def capturable_adamw(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """`train`'s AdamW (weight decay on matrices only) with its state and lr on the model's GPU, for a graph.

    lr is a one-element tensor on the device; change it with `set_lr`, never by assigning a float.
    """
    device = next(model.parameters()).device
    if device.type != "cuda":
        raise ValueError(f"capturable_adamw needs a model on a CUDA device; its parameters are on {device}")
    return torch.optim.AdamW(decay_groups(model, weight_decay), lr=torch.tensor(float(lr), device=device),
                             capturable=True)


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
        self.model, self.loss_fn, self.opt, self.dtype, self.grad_clip = model, loss_fn, opt, dtype, grad_clip
        self.warmup, self.max_graphs = warmup, max_graphs
        self.seen: dict = {}                        # shape -> eager steps taken at that shape
        self.graphs: dict = {}                      # shape -> (graph, x*, y*, loss*)
        self.stream = torch.cuda.Stream(device)     # eager warm-up and capture run off the default stream

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
            graph, sx, sy, loss = self.graphs[key]
            sx.copy_(x)
            sy.copy_(y)
            graph.replay()
            return loss.clone()
        if self.seen.get(key, 0) < self.warmup or len(self.graphs) >= self.max_graphs:
            self.seen[key] = self.seen.get(key, 0) + 1
            return self._on_side_stream(self._eager, x, y)
        self.graphs[key] = self._capture(x, y)
        return self(batch)

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
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.stream), host_checked():
            loss = self._math(sx, sy)
        return graph, sx, sy, loss
