"""Statistics the chapters share: means and spreads over seeds, bootstrap intervals,
steps to a target loss, leaving a plateau, and the one verdict rule of design.md.

Every function takes plain numbers or `Table` rows, so a chapter reads its records
from the store and never re-implements "the mean of a column over filtered rows".
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from .table import Table


def mean(values) -> float:
    """Arithmetic mean; a ValueError for an empty sequence (never a silent NaN)."""
    values = list(values)
    if not values:
        raise ValueError("mean of an empty sequence: no rows matched")
    return sum(values) / len(values)


def column_mean(rows: Table, metric: str, **where) -> float:
    """Mean of `metric` over the rows whose columns equal `where` (e.g. scheme="rope", x_train=8.0)."""
    sub = Table(rows).where(**where)
    if not sub:
        raise ValueError(f"no rows with {where}; columns: {Table(rows).columns}")
    return mean(sub.column(metric))


def summarize(rows: Table, by, metrics) -> Table:
    """Mean and seed range of each metric, one row per value of `by` (a column or a tuple of columns).

    Columns: the `by` columns, `seeds`, then `<m>` (mean) and `<m>_spread` (max - min) per metric.
    """
    by = (by,) if isinstance(by, str) else tuple(by)
    metrics = (metrics,) if isinstance(metrics, str) else tuple(metrics)
    rows = Table(rows)
    out = Table()
    for key in dict.fromkeys(tuple(r.get(c) for c in by) for r in rows):
        sub = rows.where(**dict(zip(by, key)))
        row = {**dict(zip(by, key)), "seeds": len(sub)}
        for m in metrics:
            vals = [r[m] for r in sub]
            row[m] = mean(vals)
            row[f"{m}_spread"] = max(vals) - min(vals)
        out.append(row)
    return out


def bootstrap_ci(values, *, level: float = 0.95, n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `values` (resampled with replacement).

    With one value the interval is that value (no spread to estimate): the verdict rule
    treats it as unresolved unless the claim needs no interval. Deterministic given `seed`.
    """
    values = [float(v) for v in values]
    if not values:
        raise ValueError("bootstrap_ci needs at least one value")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1); got {level!r}")
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choice(values) for _ in range(n)) / n for _ in range(n_boot))
    lo = means[int(math.floor((1 - level) / 2 * (n_boot - 1)))]
    hi = means[int(math.ceil((1 + level) / 2 * (n_boot - 1)))]
    return lo, hi


def smooth(history: list, window: int = 3) -> list[tuple[int, float]]:
    """(step, running mean of the last `window` logged losses) along a training history."""
    losses = [h["loss"] for h in history]
    return [(h["step"], mean(losses[max(0, i - window + 1): i + 1])) for i, h in enumerate(history)]


def steps_to_reach(history: list, target: float, window: int = 3) -> float:
    """First logged step whose smoothed training loss is <= target; inf if never (TUPE's Figure 4 measure)."""
    return next((step for step, loss in smooth(history, window) if loss <= target), math.inf)


def left_plateau_step(history: list, drop: float = 0.05, *, start_fraction: float = 0.1) -> float:
    """First logged step whose smoothed loss is `drop` below the loss at `start_fraction` of training; inf if never.

    Masked-LM runs first sit at the unigram plateau (loss ~ the unigram entropy); this is
    the step at which a run leaves it.
    """
    curve = smooth(history)
    if not curve:
        raise ValueError("empty history")
    first = curve[-1][0] * start_fraction
    plateau = next(loss for step, loss in curve if step >= first)
    return next((step for step, loss in curve if loss <= plateau - drop), math.inf)


def plateau_table(rows: Table, histories: dict, entropy: float, *, by: str = "model", drop: float = 0.05) -> Table:
    """Masked-LM runs against the unigram plateau, one row per value of `by`.

    rows: held-out metrics with columns `by`, seed and mlm; histories: {(value, seed): history}.
    Columns: seeds_below_H (runs whose held-out MLM is below entropy - drop), seeds, mean_mlm,
    leave_step_median (median `left_plateau_step` over seeds; inf when a run never left).
    """
    rows = Table(rows)
    out = Table()
    for name in dict.fromkeys(rows.column(by)):
        sub = rows.where(**{by: name})
        steps = sorted(left_plateau_step(histories[(name, r["seed"])], drop) for r in sub)
        out.append({by: name, "seeds_below_H": sum(r["mlm"] < entropy - drop for r in sub), "seeds": len(sub),
                    "mean_mlm": mean(sub.column("mlm")), "leave_step_median": steps[len(steps) // 2]})
    return out


def seed_gap(rows: Table, a: str, b: str, metric: str = "mlm", by: str = "model") -> dict:
    """Mean of `metric` for b minus a over seeds, the larger of the two seed ranges, and a verdict.

    real: True when |gap| exceeds the spread (a difference the seeds agree on), False when
    it does not, None with a single seed (no spread to compare with).
    """
    rows = Table(rows)
    va, vb = rows.where(**{by: a}).column(metric), rows.where(**{by: b}).column(metric)
    if not va or not vb:
        raise ValueError(f"no rows with {by}={a!r} and {by}={b!r}")
    gap = mean(vb) - mean(va)
    spread = max(max(va) - min(va), max(vb) - min(vb))
    return {"gap": gap, "spread": spread, "real": None if min(len(va), len(vb)) < 2 else abs(gap) > spread}


@dataclass(frozen=True)
class Band:
    """The interval of an effect that counts as reproducing a claim, named before it is measured.

    `low`/`high` bound the effect (either may be None for one-sided bands); `null` is the
    value of no effect (0 for a difference, 1 for a ratio).
    """

    low: float | None
    high: float | None
    null: float = 0.0

    def __post_init__(self):
        if self.low is None and self.high is None:
            raise ValueError("a Band needs low or high")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"Band low={self.low} > high={self.high}")

    def contains(self, lo: float, hi: float) -> bool:
        return (self.low is None or lo >= self.low) and (self.high is None or hi <= self.high)

    def opposite(self, lo: float, hi: float) -> bool:
        """The interval lies on the far side of no effect from the band."""
        band_above = self.low is not None and self.low >= self.null
        return hi < self.null if band_above else lo > self.null

    def __str__(self) -> str:
        lo = "-inf" if self.low is None else f"{self.low:g}"
        hi = "inf" if self.high is None else f"{self.high:g}"
        return f"[{lo}, {hi}]"


def verdict(values, band: Band, *, level: float = 0.95, min_seeds: int = 3) -> dict:
    """design.md's one rule: "reproduced" when the bootstrap interval of the mean lies in the band,
    "contradicted" when it lies beyond no effect on the other side, "not resolved" otherwise
    (and always with fewer than `min_seeds` values)."""
    values = [float(v) for v in values]
    lo, hi = bootstrap_ci(values, level=level)
    if len(values) < min_seeds:
        word = "not resolved"
    elif band.contains(lo, hi):
        word = "reproduced"
    elif band.opposite(lo, hi):
        word = "contradicted"
    else:
        word = "not resolved"
    return {"verdict": word, "mean": mean(values), "interval": [lo, hi], "band": str(band), "seeds": len(values)}
