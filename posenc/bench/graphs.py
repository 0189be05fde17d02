"""Does a CUDA graph pay for the runner's step? Eager against graphed, one process and ten.

The `full` tier's step is launches and Python, not arithmetic (`posenc.runs.costs`). A CUDA graph
(`posenc.runs.graphed.GraphedStep`) replays the step's kernels with one launch, so one process should
step much faster; whether ten processes sharing the GPU do too depends on whether the GPU, running
their kernels in turn, was the limit already. Both are measured here, with the same model the worker
probe steps (`posenc.bench.workers`): a causal LM on the corpus, d=128, 4 layers, batch 32, seq 128.
"""
from __future__ import annotations

import math
import time

import torch

from ..model import build_model
from ..runs.train import TrainConfig, amp_dtype, pick_device, training_batch
from ..table import Table
from ..tasks import make_task
from .workers import GRAPH_WARMUP, probe_step, worker_scaling


def graph_costs(schemes=("nope", "rope", "alibi"), *, steps: int = 40, warmup: int = 6, seq_len: int = 128,
                batch_size: int = 32, d_model: int = 128, n_heads: int = 4, n_layers: int = 4,
                device: str = "cuda") -> Table:
    """One row per scheme, in one process: milliseconds per training step eager and graphed (`probe_step`),
    `speedup` = eager / graphed, and `loss_gap`, the |graphed / eager - 1| of the mean training loss over the
    last 10 of `warmup + steps` steps, both trained from the same initial weights on the same batches (bf16
    where the GPU has it, else fp32)."""
    dev = pick_device(device)
    if dev.type != "cuda":
        raise ValueError(f"graph_costs needs a CUDA device (a CUDA graph); got device={device!r}")
    for name, value, low in (("steps", steps, 10), ("warmup", warmup, GRAPH_WARMUP + 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}; got {value!r}")
    task = make_task("corpus", train_length=seq_len)
    cfg = TrainConfig(steps=warmup + steps, batch_size=batch_size, device=str(dev), progress=False)
    dtype = amp_dtype(cfg.amp, dev)
    dtype = None if dtype == torch.float16 else dtype               # a graph cannot scale losses: fp32 on such a GPU
    rows = Table()
    for scheme in schemes:
        out = {}
        for how in ("eager", "graph"):
            torch.manual_seed(0)
            model = build_model(scheme, task.vocab_size, causal=True, d_model=d_model, n_heads=n_heads,
                                n_layers=n_layers, max_len=seq_len).to(dev).train()
            step = probe_step(model, dtype, graphed=how == "graph")
            losses: list = []
            t0 = time.perf_counter()                                # set again when the warmup ends
            for i in range(warmup + steps):
                if i == warmup:
                    torch.cuda.synchronize(dev)
                    t0 = time.perf_counter()
                x, y, _ = training_batch(task, cfg, i, True)
                losses.append(step(x, y))
            torch.cuda.synchronize(dev)
            out[how] = ((time.perf_counter() - t0) / steps, sum(float(v) for v in losses[-10:]) / 10)
        (eager_s, eager_loss), (graph_s, graph_loss) = out["eager"], out["graph"]
        rows.append({"scheme": scheme, "steps": steps, "eager_ms": 1e3 * eager_s, "graph_ms": 1e3 * graph_s,
                     "speedup": eager_s / graph_s, "loss_gap": abs(graph_loss / eager_loss - 1),
                     "loss_eager": eager_loss, "loss_graph": graph_loss})
    return rows


def graph_probe(device: str = "cuda", *, counts=(1, 10), seconds: float = 6.0) -> dict:
    """The bench's `graphs` section: {"single": graph_costs(...), "workers": the aggregate steps/s of
    `counts` processes, each row eager then graphed (`worker_scaling`)}."""
    single = graph_costs(device=device)
    print("-- single (printed first: the worker rows take a minute or more)", single.round(3), sep="\n", flush=True)
    workers = Table()
    for graphed in (False, True):
        workers.extend(worker_scaling(counts, seconds=seconds, device=device, graphed=graphed))
    return {"single": single, "workers": workers}


def graph_decision(single, workers, *, min_speedup: float = 1.2, max_gap: float = 0.02) -> tuple[bool, str]:
    """Whether graphed steps should train the tier, and why: at the largest worker count measured, the aggregate
    rate graphed is at least `min_speedup` times eager, and every scheme's loss agrees within `max_gap`."""
    single = Table(single).require("loss_gap")
    workers = Table(workers).require(("workers", "step", "steps_per_s"))
    w = max(r["workers"] for r in workers)
    rate = {r["step"]: r["steps_per_s"] for r in workers if r["workers"] == w}
    if set(rate) != {"eager", "graph"}:
        raise ValueError(f"workers must hold an eager and a graph row at {w} workers; got {sorted(rate)}")
    gaps = [r["loss_gap"] for r in single]
    gap = math.nan if any(math.isnan(g) for g in gaps) else max(gaps)       # max() would skip a NaN
    speedup = rate["graph"] / rate["eager"]
    ok = speedup >= min_speedup and gap < max_gap
    return ok, (f"graph probe: {w} workers {rate['eager']:.0f} -> {rate['graph']:.0f} steps/s ({speedup:.2f}x), "
                f"largest loss gap {gap:.3g}" + ("" if ok else f" (below {min_speedup}x or over {max_gap:.0%})"))
