"""How many worker processes should share one GPU? Aggregate training steps per second against their count.

The runner trains the `full` tier's small models in worker processes that share the GPU
(`python -m posenc.runs --workers W`). One process alone leaves a large GPU mostly idle: its step is
bound by kernel launches and Python. W processes overlap their host work, but their kernels
time-share the GPU, so the aggregate rate

    R(W) = sum over workers w of steps_w / seconds_w

grows with W only until the GPU's switching between them costs what the overlap gains. The 2026-12-04
H200 window measured R(10) = 178.6 steps/s on mixed runs while one process alone steps the same size of
model 85 times a second. This measures R(W) for a few W with the runner's own step (`training_batch`,
`optimizer_step`), every worker training the same model: all W build and warm up, meet at a barrier,
then step for `seconds`, wait for their GPU work, and report their steps and elapsed time.
"""
from __future__ import annotations

import multiprocessing as mp
import time
from typing import TYPE_CHECKING

import torch

from ..runs.train import pick_device
from ..table import Table

if TYPE_CHECKING:
    from ..model import Transformer

#: Seconds a worker may take to start (import, build, warm up) before the probe gives up on that count.
START_TIMEOUT = 120.0


#: Eager steps of a shape before a probe's graphed step captures it (`GraphedStep`'s warmup).
GRAPH_WARMUP = 3


def probe_step(model: Transformer, dtype, graphed: bool):
    """The runner's training step for a probe: step(x, y) on CPU batches -> the loss, not read. As `train` steps:
    the inputs checked on the host, copied without waiting, AdamW (lr 1e-3, weight decay 0.01 on matrices) and
    clipping at 1; eager (`optimizer_step`, fp16 with loss scaling) or as a CUDA graph (`GraphedStep`, capturable
    AdamW, after GRAPH_WARMUP eager steps per shape)."""
    from ..host import host_checked, to_device
    from ..model import lm_loss
    from ..runs.train import decay_groups, optimizer_step
    dev = next(model.parameters()).device
    loss_fn = lambda m, x, y, **kw: lm_loss(m(x, **kw), y)      # noqa: E731 (train's default loss)
    if graphed:
        from ..runs.graphed import GraphedStep, capturable_adamw
        graph = GraphedStep(model, loss_fn, capturable_adamw(model, 1e-3, 0.01), dtype, 1.0, warmup=GRAPH_WARMUP)
    else:
        opt = torch.optim.AdamW(decay_groups(model, 0.01), lr=1e-3)
        scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)

    def step(x, y):
        model.check_inputs(x)
        batch: tuple = (to_device(x, dev), to_device(y, dev), {})
        if graphed:
            return graph(batch)
        with host_checked():
            return optimizer_step(model, loss_fn, batch, opt, scaler, dtype, 1.0)
    return step


def _worker(barrier, out, scheme: str, sizes: dict, device: str, seconds: float, warmup_steps: int,
            graphed: bool = False) -> None:
    """One process: build the model and its optimiser, warm up, wait at `barrier`, then count steps for `seconds`.
    `graphed`: the step replayed as a CUDA graph (`posenc.runs.graphed`), its capture inside the warm-up."""
    from ..model import build_model
    from ..runs.train import TrainConfig, amp_dtype, training_batch
    from ..tasks import make_task
    torch.set_num_threads(1)                        # as the runner's workers (posenc.runs.execute.one_thread)
    dev = pick_device(device)
    task = make_task("corpus", train_length=sizes["seq_len"])
    torch.manual_seed(0)
    model = build_model(scheme, task.vocab_size, causal=True, d_model=sizes["d_model"], n_heads=sizes["n_heads"],
                        n_layers=sizes["n_layers"], max_len=sizes["seq_len"]).to(dev)
    cfg = TrainConfig(steps=10 ** 9, batch_size=sizes["batch_size"], device=device, progress=False)
    dtype = amp_dtype(cfg.amp, dev)
    dtype = None if graphed and dtype == torch.float16 else dtype      # a graph cannot scale losses: fp32 there
    run_step = probe_step(model.train(), dtype, graphed)
    if graphed:
        warmup_steps = max(warmup_steps, GRAPH_WARMUP + 2)     # the warm-up ends with the graph captured and replayed

    def step(i):
        x, y, _ = training_batch(task, cfg, i, True)
        return run_step(x, y)

    for i in range(warmup_steps):
        step(i)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    barrier.wait(timeout=START_TIMEOUT)
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        step(warmup_steps + n)
        n += 1
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)                 # the steps counted have run on the GPU
    out.put((n, time.perf_counter() - t0))


def worker_scaling(counts=(1, 6, 10, 16), *, scheme: str = "rope", seconds: float = 8.0, warmup_steps: int = 5,
                   d_model: int = 128, n_heads: int = 4, n_layers: int = 4, batch_size: int = 32, seq_len: int = 128,
                   device: str = "auto", graphed: bool = False) -> Table:
    """One row per worker count W, in the order of `counts`: `steps_per_s` (the aggregate R(W)), `per_worker`
    (R(W) / W), and `vs_one` (R(W) / R(1), once a count of 1 has been measured; else None). Every worker
    trains the same causal LM on the corpus (the `full` tier's usual size: d=128, 4 layers, batch 32, seq 128)
    with the runner's step, or with it replayed as a CUDA graph (`graphed`, CUDA only; the row says which)."""
    if graphed and pick_device(device).type != "cuda":
        raise ValueError(f"graphed=True needs a CUDA device (a CUDA graph); got device={device!r}")
    if not counts or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in counts):
        raise ValueError(f"counts must be positive ints; got {counts!r}")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds < 3600:
        raise ValueError(f"seconds must be a number in (0, 3600); got {seconds!r}")
    sizes = dict(d_model=d_model, n_heads=n_heads, n_layers=n_layers, batch_size=batch_size, seq_len=seq_len)
    ctx = mp.get_context("spawn")
    rows, one = Table(), None
    for w in counts:
        barrier, out = ctx.Barrier(w), ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(barrier, out, scheme, sizes, device, seconds, warmup_steps, graphed))
                 for _ in range(w)]
        for p in procs:
            p.start()
        try:
            got = _collect(out, procs, START_TIMEOUT + seconds + 60)
        finally:
            for p in procs:
                p.join(timeout=10)
                if p.is_alive():
                    p.kill()
        rate = sum(n / s for n, s in got)
        one = rate if w == 1 else one
        rows.append({"workers": w, "step": "graph" if graphed else "eager", "steps_per_s": rate, "per_worker": rate / w,
                     "vs_one": None if one is None else rate / one})
    return rows


def _collect(out, procs, timeout: float) -> list:
    """Each worker's (steps, seconds), or RuntimeError as soon as one worker dies (not after `timeout`)."""
    import queue
    got: list = []
    end = time.monotonic() + timeout
    while len(got) < len(procs):
        try:
            got.append(out.get(timeout=1.0))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > end:
                raise RuntimeError(f"a worker of {len(procs)} failed (exit codes {dead}) or timed out; see its "
                                   "traceback above") from None
    return got


def best_count(rows: Table, *, within: float = 0.05) -> int:
    """The fewest workers whose aggregate rate is within `within` (a fraction) of the highest measured."""
    rows = Table(rows).require(("workers", "steps_per_s"))
    top = max(r["steps_per_s"] for r in rows)
    return min(r["workers"] for r in rows if r["steps_per_s"] >= (1 - within) * top)
