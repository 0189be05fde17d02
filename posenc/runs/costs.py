"""The runner's cost model: how long a run takes, whether a tier fits its window, and a refit from stored runs.

One run on one worker takes about

    seconds = steps * overhead + cost / throughput,

with `RunSpec.cost` its training multiply-adds (6 * parameters * tokens * steps), `overhead` the fixed
seconds of a step (kernel launches and Python: the floor for small models) and `throughput` the
multiply-adds per second one worker sustains. Both constants are fitted to stored runs (`fit`), whose
recorded wall time includes their evaluation.
"""
from __future__ import annotations

import numpy as np

#: Multiply-adds per second of one run. CPU: one thread, fitted to the stored ci records. CUDA: one of ten
#: workers sharing an H200, refitted (`--fit`) to the 88 `full` runs of the 2026-12-04 window (chapters 00-04:
#: 86000 steps in 482 s, 178.6 steps/s in all; results/bench/windows/2026-12-04.txt).
THROUGHPUT = {"cpu": 3e10, "cuda": 2.3e12}
#: Fixed seconds per training step (kernel launches and Python), the floor for small models. CUDA: 24 ms,
#: though one process alone steps a 4-layer model in 12 ms (the stacking probe): ten processes time-share the
#: GPU, so the step's launches, not its arithmetic, set the tier's wall time.
STEP_OVERHEAD = {"cpu": 0.002, "cuda": 0.024}
#: The design's budget for the `full` tier: the whole book within 15 minutes of one H200. The runner's share
#: of it: 12 minutes (starting the machine takes the rest), with this many worker processes sharing the GPU
#: (one CPU core each, of its 16). The tier is sized so that the cost model above fits it in this window.
WINDOW = {"seconds": 720.0, "workers": 10}


def estimate_seconds(spec, device: str, constants: dict | None = None) -> float:
    """A rough wall time of one run: steps * overhead + cost / throughput (the module's constants for
    `device`, or `constants` = {"overhead": s, "throughput": macs_per_s}, e.g. from `fit`)."""
    c = constants or {"overhead": STEP_OVERHEAD[device], "throughput": THROUGHPUT[device]}
    return spec.cost() / c["throughput"] + spec.train["steps"] * c["overhead"]


def window_seconds(specs, workers: int = WINDOW["workers"], constants: dict | None = None) -> float:
    """Estimated wall time of `specs` on one H200 shared by `workers` processes: the cost model's total
    spread over the workers, or the longest run when that is longer (a run is never split)."""
    times = [estimate_seconds(s, "cuda", constants) for s in specs]
    return max([sum(times) / workers] + times) if times else 0.0


def fit(records, device: str) -> dict:
    """The cost model's two constants fitted to stored records made on `device` ("cpu" or "cuda"), by least
    squares on seconds = steps * overhead + cost / throughput, both terms kept non-negative.

    Returns {"overhead", "throughput", "runs", "median_error"}, the last the median of |estimate / seconds - 1|
    over the records (how far one run's estimate is off; the sum over many runs is closer).
    """
    if device not in THROUGHPUT:
        raise ValueError(f"device must be one of {tuple(THROUGHPUT)}; got {device!r}")
    rows = [(r.spec.train["steps"], r.spec.cost(), r["seconds"]) for r in records
            if r.get("seconds") and str(r.get("machine", "")).startswith(f"{device}:")]
    if len(rows) < 2:
        raise ValueError(f"records must hold at least 2 timed runs made on {device}; got {len(rows)}")
    steps, cost, seconds = (np.array(c, dtype=float) for c in zip(*rows))
    A = np.stack([steps, cost], 1)
    coef = np.linalg.lstsq(A, seconds, rcond=None)[0]
    if (coef < 0).any():                     # one term alone explains the times better: fit that one
        fits = [(np.sum((seconds - x * (seconds @ x) / (x @ x)) ** 2), i, (seconds @ x) / (x @ x))
                for i, x in enumerate((steps, cost))]
        _, i, value = min(fits)
        coef = np.zeros(2)
        coef[i] = value
    overhead, per_mac = float(coef[0]), float(coef[1])
    estimate = A @ coef
    return {"overhead": overhead, "throughput": 1.0 / per_mac if per_mac > 0 else float("inf"), "runs": len(rows),
            "median_error": float(np.median(np.abs(estimate / seconds - 1)))}
