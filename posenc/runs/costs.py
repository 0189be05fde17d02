"""The runner's cost model: how long a run takes, whether a tier fits its window, and a refit from stored runs.

One run on one worker takes about

    seconds = steps * (overhead + positions * ode_step) + cost / throughput,

with `RunSpec.cost` its training multiply-adds (6 * parameters * tokens * steps), `overhead` the fixed
seconds of a step (kernel launches and Python: the floor for small models), `throughput` the
multiply-adds per second one worker sustains, and, for FLOATER alone, `positions` the RK4 steps of its
ODE solve in one training step (`solve_positions`: one per position, in sequence) and `ode_step` the
seconds of one of them, forward and backward. That last term is launches, not arithmetic: on the H200 it
made a FLOATER LM at L = 128 run some sixteen times longer than its multiply-adds say. The constants are fitted to
stored runs (`fit`), whose recorded wall time includes their evaluation.
"""
from __future__ import annotations

from typing import Any

import numpy as np

#: Multiply-adds per second of one run. CPU: one thread, fitted (`--fit`) to the stored ci records (668 runs).
#: CUDA: one of ten workers sharing an H200, fitted to the 439 timed `full` runs of the three 2026-12-04 windows
#: (the third stored 311 runs in 628 s of two calls, 463.7 and 364.5 steps/s in all; results/bench/windows/).
#: One run's estimate is off by 26% (median).
THROUGHPUT = {"cpu": 7.0e10, "cuda": 1.27e12}
#: Fixed seconds per training step (kernel launches and Python), the floor for small models. CUDA: 10 ms,
#: about what one process alone takes to step a 4-layer model (the stacking probe): with ten processes
#: time-sharing the GPU, a step's launches, not its arithmetic, set the tier's wall time.
STEP_OVERHEAD = {"cpu": 0.0062, "cuda": 0.0103}
#: Seconds of one RK4 step of FLOATER's ODE solve, forward and backward (`solve_positions`), fitted with the
#: constants above to the FLOATER kback runs solved on the GPU (112 s for 1200 steps, where sinusoidal took 19 s).
#: CUDA: 3.9 ms, so a FLOATER LM at L = 128 (1000 steps) solved on the shared GPU takes about 520 s where its
#: multiply-adds say 30: more than the runner gets of one device call. Six such runs were in flight at the
#: deadline of both calls of the second 2026-12-04 window, and abandoned; `full` FLOATER runs now solve on the
#: host (`posenc.runs.plans.FULL_MODEL_OPTIONS`). CPU: 0.38 ms, fitted to the ci records.
ODE_STEP = {"cpu": 0.00038, "cuda": 0.0039}
#: Seconds of one RK4 step of FLOATER's solve on one CPU core, forward and backward, for the `full` model (d = 128,
#: 4 layers): 95 ms for 128 positions on this project's CPU machine, one thread. For solve_on="host" on a GPU.
HOST_ODE_STEP = 0.00074
#: The design's budget for the `full` tier: the whole book within 15 minutes of one H200. The runner's share
#: of it: 12 minutes (starting the machine takes the rest), with this many worker processes sharing the GPU
#: (one CPU core each, of its 16). The tier is sized so that the cost model above fits it in this window.
WINDOW: dict[str, Any] = {"seconds": 720.0, "workers": 10}


def solve_positions(spec) -> float:
    """The RK4 steps of FLOATER's ODE solve in one training step, on average (0 for every other scheme).

    FLOATER solves from position 0 to the batch's last one, one RK4 step per position (its step is
    delta, its time grid t_i = delta * i). A corpus batch has `train_length` positions. A synthetic task
    draws its length n uniformly from [min_length, train_length] per batch; a labelling task (kback,
    parity, ...) reads n + 1 tokens, a sequence-to-sequence one (copy, reverse, ...) 2 n + 1.
    """
    if spec.scheme != "floater":
        return 0.0
    if spec.task != "synthetic":
        return float(spec.task_kwargs.get("train_length", 32))
    from ..tasks.synthetic import LABELLING, SyntheticTask
    task = SyntheticTask(**spec.task_kwargs)
    n = (task.min_length + task.train_length) / 2
    return n + 1 if task.name in LABELLING else 2 * n + 1


def host_solve(spec, device: str) -> bool:
    """Whether `spec`'s ODE is solved on the worker's CPU while the rest of it runs on `device` (a GPU)."""
    return device != "cpu" and spec.model.get("solve_on") == "host"


def estimate_seconds(spec, device: str, constants: dict | None = None) -> float:
    """A rough wall time of one run: steps * (overhead + solve_positions * ode_step) + cost / throughput (the
    module's constants for `device`, or `constants` = {"overhead", "throughput", "ode_step"}, e.g. from `fit`)."""
    c = {"overhead": STEP_OVERHEAD[device], "throughput": THROUGHPUT[device], "ode_step": ODE_STEP[device],
         **(constants or {})}
    ode_step = HOST_ODE_STEP if host_solve(spec, device) else c["ode_step"]
    return spec.cost() / c["throughput"] + spec.train["steps"] * (c["overhead"] + solve_positions(spec) * ode_step)


def window_seconds(specs, workers: int = WINDOW["workers"], constants: dict | None = None) -> float:
    """Estimated wall time of `specs` on one H200 shared by `workers` processes: the cost model's total
    spread over the workers, or the longest run when that is longer (a run is never split)."""
    times = [estimate_seconds(s, "cuda", constants) for s in specs]
    return max([sum(times) / workers] + times) if times else 0.0


def fit(records, device: str) -> dict:
    """The cost model's three constants fitted to stored records made on `device` ("cpu" or "cuda"): least
    squares on seconds = steps * overhead + cost / throughput + steps * solve_positions * ode_step, every term
    non-negative (the best non-negative fit, found over the subsets of terms). Without FLOATER records the
    ODE term cannot be fitted: `ode_step` keeps the module's constant.

    Returns {"overhead", "throughput", "ode_step", "runs", "median_error"}, the last the median of
    |estimate / seconds - 1| over the records (how far one run's estimate is off; the sum over many runs is
    closer).
    """
    if device not in THROUGHPUT:
        raise ValueError(f"device must be one of {tuple(THROUGHPUT)}; got {device!r}")
    rows = []
    for r in records:
        if r.get("seconds") and str(r.get("machine", "")).startswith(f"{device}:"):
            spec, solves = r.spec, r.spec.train["steps"] * solve_positions(r.spec)
            host = host_solve(spec, device)           # a solve on the host: its constant, not fitted here
            rows.append((spec.train["steps"], spec.cost(), 0.0 if host else solves,
                         r["seconds"] - (solves * HOST_ODE_STEP if host else 0.0)))
    if len(rows) < 2:
        raise ValueError(f"records must hold at least 2 timed runs made on {device}; got {len(rows)}")
    steps, cost, solves, seconds = (np.array(c, dtype=float) for c in zip(*rows))
    A = np.stack([steps, cost, solves], 1)
    coef = nonnegative_least_squares(A, seconds)
    ode_step = float(coef[2]) if solves.any() else ODE_STEP[device]
    estimate = A[:, :2] @ coef[:2] + solves * ode_step
    return {"overhead": float(coef[0]), "throughput": 1.0 / coef[1] if coef[1] > 0 else float("inf"),
            "ode_step": ode_step, "runs": len(rows),
            "median_error": float(np.median(np.abs(estimate / seconds - 1)))}


def nonnegative_least_squares(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||A x - b|| over x >= 0, for a few columns: the best of the unconstrained fits on each subset
    of columns (the others 0) whose coefficients are all non-negative. Columns that are all zero get 0."""
    n = A.shape[1]
    best, best_x = np.inf, np.zeros(n)
    for mask in range(1, 2 ** n):
        cols = [j for j in range(n) if mask >> j & 1 and A[:, j].any()]
        if not cols:
            continue
        x = np.zeros(n)
        x[cols] = np.linalg.lstsq(A[:, cols], b, rcond=None)[0]
        residual = float(np.sum((A @ x - b) ** 2))
        if (x >= 0).all() and residual < best:
            best, best_x = residual, x
    return best_x
