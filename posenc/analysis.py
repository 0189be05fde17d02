"""Statistics the chapters share: means and spreads over seeds, bootstrap intervals,
steps to a target loss, leaving a plateau, and the one verdict rule of design.md.

Every function takes plain numbers or `Table` rows, so a chapter reads its records
from the store and never re-implements "the mean of a column over filtered rows".
"""
from __future__ import annotations

import math
import numbers
import re
import random
import statistics
from dataclasses import dataclass

from .table import Table


def mean(values) -> float:
    """Arithmetic mean; a ValueError for an empty sequence (never a silent NaN)."""
    values = list(values)
    if not values:
        raise ValueError("mean of an empty sequence: no rows matched")
    return sum(values) / len(values)


def metric_values(rows, metric: str) -> list[float]:
    """Column `metric` of `rows` as floats, in row order; a ValueError naming the metric when a row lacks
    it or holds something that is not a number, or NaN: a NaN passes through a mean, and makes a spread
    (max - min) depend on the order of the rows. An infinity is a value (a target never reached)."""
    rows = list(rows)
    missing = sum(metric not in r for r in rows)
    if missing:
        raise ValueError(f"metric {metric!r} is not a column of {missing} of {len(rows)} rows; their columns: "
                         f"{Table(rows).columns}")
    bad = [r[metric] for r in rows if isinstance(r[metric], bool) or not isinstance(r[metric], numbers.Real)
           or math.isnan(r[metric])]
    if bad:
        raise ValueError(f"metric {metric!r} must hold numbers (not NaN): {len(bad)} of {len(rows)} rows hold "
                         f"{bad[0]!r}{' and others' if len(bad) > 1 else ''}; no mean")
    return [float(r[metric]) for r in rows]


def effect_values(values, name: str = "values") -> list[float]:
    """`values` (a sequence of numbers, or a {seed: number} dict, whose values are taken) as floats.

    A string, a non-number or a NaN raises an error naming `name`: an effect per seed with a NaN in
    it has no mean, and a dict iterated by its keys would judge the seed numbers. An infinity is a
    value (e.g. the steps to a loss a seed never reaches, as a fraction: inf), and is kept.
    """
    if isinstance(values, dict):
        values = list(values.values())
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{name} must be a sequence of numbers or a {{seed: number}} dict; got {values!r}")
    out: list[float] = []
    for v in values:
        if isinstance(v, (str, bytes, bool)):
            raise TypeError(f"{name} must hold numbers; got {v!r}")
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise TypeError(f"{name} must hold numbers; got {v!r}") from None
        if math.isnan(f):
            raise ValueError(f"{name} must not hold NaN (no mean); got NaN as value {len(out) + 1}")
        out.append(f)
    if math.inf in out and -math.inf in out:
        raise ValueError(f"{name} hold both inf and -inf: their mean is undefined")
    return out


def column_mean(rows: Table, metric: str, **where) -> float:
    """Mean of `metric` over the rows whose columns equal `where` (e.g. scheme="rope", x_train=8.0)."""
    sub = Table(rows).where(**where)
    if not sub:
        raise ValueError(f"no rows with {where}; columns: {Table(rows).columns}")
    return mean(metric_values(sub, metric))


def summarize(rows: Table, by, metrics) -> Table:
    """Mean and seed range of each metric, one row per value of `by` (a column or a tuple of columns).

    Columns: the `by` columns, `seeds`, then `<m>` (mean) and `<m>_spread` (max - min) per metric.
    """
    by = (by,) if isinstance(by, str) else tuple(by)
    metrics = (metrics,) if isinstance(metrics, str) else tuple(metrics)
    rows = Table(rows).require(by, "by").require(metrics, "metrics")
    out = Table()
    for key in dict.fromkeys(tuple(r.get(c) for c in by) for r in rows):
        sub = rows.where(**dict(zip(by, key)))
        row = {**dict(zip(by, key)), "seeds": len(sub)}
        for m in metrics:
            vals = metric_values(sub, m)
            row[m] = mean(vals)
            row[f"{m}_spread"] = max(vals) - min(vals)
        out.append(row)
    return out


def bootstrap_ci(values, *, level: float = 0.95, n_boot: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `values` (resampled with replacement).

    With one value the interval is that value (no spread to estimate): the verdict rule
    treats it as unresolved unless the claim needs no interval. With few values it is narrower
    than its level says (three seeds: nearly their range, which holds the true mean about 75% of
    the time; `bootstrap_coverage`). Deterministic given `seed`.
    """
    values = effect_values(values)
    if not values:
        raise ValueError("bootstrap_ci needs at least one value")
    _check_level(level)
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 100:
        raise ValueError(f"n_boot must be an int >= 100 (fewer draws make no percentile interval); got {n_boot!r}")
    rng = random.Random(seed)
    n = len(values)
    return central((sum(rng.choice(values) for _ in range(n)) / n for _ in range(n_boot)), level=level)


def _check_level(level) -> None:
    if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
        raise ValueError(f"level must be a number in (0, 1); got {level!r}")


def central(draws, *, level: float = 0.95) -> tuple:
    """The percentile interval holding the middle `level` of `draws` (resampled statistics): the values
    at ranks floor((1 - level)/2 * (n - 1)) and ceil((1 + level)/2 * (n - 1)) of the sorted draws.
    A rank within 1e-9 of an integer is that integer: (1 - 0.9)/2 * 100 is 4.999... in floats, rank 5."""
    _check_level(level)
    draws = sorted(draws)
    if not draws:
        raise ValueError("draws is empty: no interval")
    n = len(draws)
    low, high = (1 - level) / 2 * (n - 1), (1 + level) / 2 * (n - 1)
    return draws[int(math.floor(low + 1e-9))], draws[int(math.ceil(high - 1e-9))]


def bootstrap_coverage(n_seeds: int, *, trials: int = 1000, level: float = 0.95, seed: int = 0) -> float:
    """How often `bootstrap_ci` at `level` covers the true mean of `n_seeds` values drawn from N(0, 1):
    the fraction of `trials` samples whose interval holds 0. Deterministic given `seed`.

    A resampled mean never leaves [min, max] of the sample. The range of n values holds the median
    of a continuous distribution with probability 1 - 2 (1/2)^n, and with three values the percentile
    interval is nearly that range: 0.75, not 0.95. The nominal level is reached only with many more seeds.
    """
    if not (isinstance(n_seeds, int) and n_seeds >= 2):
        raise ValueError(f"n_seeds must be an int >= 2; got {n_seeds!r}")
    if not (isinstance(trials, int) and trials >= 1):
        raise ValueError(f"trials must be a positive int; got {trials!r}")
    rng = random.Random(seed)
    hits = 0
    for t in range(trials):
        lo, hi = bootstrap_ci([rng.gauss(0.0, 1.0) for _ in range(n_seeds)], level=level, seed=t)
        hits += lo <= 0.0 <= hi
    return hits / trials


def smooth(history: list, window: int = 3) -> list[tuple[int, float]]:
    """(step, running mean of the last `window` logged losses) along a training history.

    A NaN loss is an error naming its step: it would poison the next `window` means, and a run that
    went on to reach a target would read as one that never did."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int; got {window!r}")
    losses = [h["loss"] for h in history]
    nan = next((h["step"] for h in history if math.isnan(h["loss"])), None)
    if nan is not None:
        raise ValueError(f"history holds a NaN loss at step {nan}: no running mean")
    return [(h["step"], mean(losses[max(0, i - window + 1): i + 1])) for i, h in enumerate(history)]


def steps_to_reach(history: list, target: float, window: int = 3) -> float:
    """First logged step whose smoothed training loss is <= target; inf if never (TUPE's Figure 5(a) measure).

    An empty history or a target that is not a finite number is an error: either would read as "never"."""
    if not history:
        raise ValueError("history is empty: no step to reach the target at")
    if isinstance(target, bool) or not isinstance(target, numbers.Real) or not math.isfinite(target):
        raise ValueError(f"target must be a finite number; got {target!r}")
    return next((step for step, loss in smooth(history, window) if loss <= target), math.inf)


def left_plateau_step(history: list, drop: float = 0.05, *, plateau: float | None = None,
                      start_fraction: float = 0.1) -> float:
    """First logged step whose smoothed loss is `drop` below the plateau; inf if never.

    Masked-LM runs first sit at the unigram plateau (loss ~ the unigram entropy); this is
    the step at which a run leaves it. `plateau` is the training loss there when it is known
    (for `posenc.tasks.MaskedLMWithCLS`, the unigram entropy plus ln 2: a [CLS] guess); without
    it, the smoothed loss at `start_fraction` of training stands in, which only works where the
    run has reached the plateau by then (in a long run the loss is still falling towards it at
    10%, and every run "leaves" a few logs later).
    """
    curve = smooth(history)
    if not curve:
        raise ValueError("empty history")
    if plateau is None:
        first = curve[-1][0] * start_fraction
        plateau = next(loss for step, loss in curve if step >= first)
    return next((step for step, loss in curve if loss <= plateau - drop), math.inf)


def plateau_table(rows: Table, histories: dict, entropy: float, *, by: str = "model", drop: float = 0.05,
                  plateau: float | None = None) -> Table:
    """Masked-LM runs against the unigram plateau, one row per value of `by`.

    rows: held-out metrics with columns `by`, seed and mlm; histories: {(value, seed): history}.
    Columns: seeds_below_H (runs whose held-out MLM is below entropy - drop), seeds, mean_mlm,
    leave_step_median (median `left_plateau_step` over seeds, with `plateau` the training loss at
    the plateau; inf when a run never left).
    """
    rows = Table(rows)
    out = Table()
    for name in dict.fromkeys(rows.column(by)):
        sub = rows.where(**{by: name})
        steps = [left_plateau_step(histories[(name, r["seed"])], drop, plateau=plateau) for r in sub]
        mlm = metric_values(sub, "mlm")
        out.append({by: name, "seeds_below_H": sum(v < entropy - drop for v in mlm), "seeds": len(sub),
                    "mean_mlm": mean(mlm), "leave_step_median": statistics.median(steps)})
    return out


def plateau_sentence(plateau: Table, entropy: float, *, by: str = "model") -> str:
    """One sentence naming the rows of `plateau_table` with no seed below the unigram plateau ("" if none):
    the models whose losses compare what they learned of the characters' frequencies, nothing more."""
    stuck = [r[by] for r in plateau if r["seeds_below_H"] == 0]
    if not stuck:
        return ""
    one = len(stuck) == 1
    return (f"At this tier {', '.join(stuck)} end{'s' if one else ''} on the unigram plateau on every seed (held-out "
            f"loss near H = {entropy:.3f} nats): {'it has' if one else 'they have'} learned the characters' frequencies "
            f"and not yet what their neighbours say.")


@dataclass(frozen=True)
class Band:
    """The interval of an effect that counts as reproducing a claim, named before it is measured.

    `low`/`high` bound the effect (either may be None for one-sided bands); `null` is the
    value of no effect (0 for a difference, 1 for a ratio). A band that holds no effect strictly
    inside it, e.g. Band(-0.02, 0.02) on a signed difference, is an equivalence claim ("A works as
    well as B"): its far side is everything outside the band, on either side.
    """

    low: float | None
    high: float | None
    null: float = 0.0

    def __post_init__(self):
        for name in ("low", "high", "null"):
            v = getattr(self, name)
            if v is None and name != "null":
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"Band {name} must be a finite number{' or None' if name != 'null' else ''}; got {v!r}")
        if self.low is None and self.high is None:
            raise ValueError("a Band needs low or high")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"Band low={self.low} > high={self.high}")
        # A one-sided band must lie on one side of no effect: its null at or beyond its open edge's
        # far side. Band(None, 0.02) with null 0 would call an interval [0.01, 0.03] contradicted.
        if ((self.low is None and self.high is not None and self.null < self.high)
                or (self.high is None and self.low is not None and self.null > self.low)):
            edge = "high" if self.low is None else "low"
            raise ValueError(f"a one-sided Band holds its null={self.null} inside it; for a claim that an effect "
                             f"stays within {edge}={getattr(self, edge)}, set null={getattr(self, edge)} (its far side "
                             f"is then beyond that edge)")

    def contains(self, lo: float, hi: float) -> bool:
        return (self.low is None or lo >= self.low) and (self.high is None or hi <= self.high)

    @property
    def equivalence(self) -> bool:
        return self.low is not None and self.high is not None and self.low < self.null < self.high

    def opposite(self, lo: float, hi: float) -> bool:
        """The interval lies on the far side of no effect from the band (for an equivalence band:
        wholly outside it, the two surely differ by more than the band allows)."""
        if self.low is not None and self.high is not None and self.equivalence:
            return hi < self.low or lo > self.high
        band_above = self.low is not None and self.low >= self.null
        return hi < self.null if band_above else lo > self.null

    def __str__(self) -> str:
        lo = "-inf" if self.low is None else f"{self.low:g}"
        hi = "inf" if self.high is None else f"{self.high:g}"
        return f"[{lo}, {hi}]"


#: Fewer seeds than this give "not resolved" whatever the interval (`verdict`).
MIN_SEEDS = 3
#: What a claim about accuracy beyond the training length presupposes: models that fit the task at L (accuracy at
#: least this, each read as it was trained); a seed whose models do not is not counted (chapters 16 and 17). Set
#: after chapter 17's ci runs were read: the models of its claims split into 0.44 or less and 0.83 or more, so any
#: value between keeps the same seeds.
FITS_AT_L = 0.8


def verdict(values, band: Band, *, level: float = 0.95, min_seeds: int = MIN_SEEDS) -> dict:
    """design.md's one rule: "reproduced" when the bootstrap interval of the mean lies in the band,
    "contradicted" when it lies beyond no effect on the other side, "not resolved" otherwise
    (and always with fewer than `min_seeds` values).

    values: the effect per seed, a sequence or a {seed: effect} dict (`per_seed`, `paired`); finite. It may
    be empty, when no seed met what the claim presupposes (a trained model): "not resolved", with mean and
    interval None and seeds 0.
    """
    if not isinstance(band, Band):
        raise TypeError(f"band must be a posenc.analysis.Band; got {band!r}")
    if isinstance(min_seeds, bool) or not isinstance(min_seeds, int) or min_seeds < 1:
        raise ValueError(f"min_seeds must be a positive int; got {min_seeds!r}")
    values = effect_values(values)
    if not values:
        return {"verdict": "not resolved", "mean": None, "interval": None, "band": str(band), "seeds": 0}
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


def verdict_table(results: dict) -> Table:
    """{claim: `verdict` dict} as a table: mean effect, 95% interval, band, seeds and verdict per claim."""
    return Table({"claim": claim, "mean effect": None if out["mean"] is None else round(out["mean"], 4),
                  "95% interval": "none" if out["interval"] is None else "[{:.4f}, {:.4f}]".format(*out["interval"]),
                  "band": out["band"],
                  "seeds": out["seeds"], "verdict": out["verdict"]} for claim, out in results.items())


# -- the comparison: length generalisation and the book's findings -------------------------------
def checks_table(checks: dict) -> Table:
    """{observation: bool} -> rows {holds, observation}: what a chapter's runs show, on means over seeds with
    fixed thresholds (a task learned, a model that ran). Checks of the experiment, not verdicts on a claim:
    those are judged by the one rule (`verdict`, `posenc.record_claim`)."""
    bad = [k for k, v in checks.items() if type(v).__name__ not in ("bool", "bool_")]   # Python or numpy bool
    if bad:
        raise TypeError(f"checks must map each observation to a bool; got non-bool values for {bad}")
    return Table({"holds": "yes" if ok else "no", "observation": text} for text, ok in checks.items())


def beyond_scores(rows: Table, *, threshold: float = 0.9) -> tuple[dict, dict]:
    """Scores of each scheme beyond the training length, per task, from the comparison's rows.

    rows: columns scheme, task, seed, x_train and accuracy (synthetic tasks) or bpc ("lm").
    A scheme's score on a task is its mean over seeds and over the lengths beyond L (x_train > 1).
    Synthetic tasks on which no scheme reaches `threshold` mean accuracy at L are left out (a
    scheme cannot generalise what it never fitted). Returns (scores {task: {scheme: score}},
    best accuracy at L of every synthetic task).
    """
    rows = Table(rows)
    schemes = list(dict.fromkeys(rows.column("scheme")))
    tasks = list(dict.fromkeys(rows.column("task")))
    at_l = {t: max(column_mean(rows, "accuracy", task=t, scheme=s, x_train=1.0) for s in schemes)
            for t in tasks if t != "lm"}
    scores = {}
    for t in [t for t in tasks if t == "lm" or at_l[t] >= threshold]:
        metric = "bpc" if t == "lm" else "accuracy"
        scores[t] = {s: mean(metric_values([r for r in rows.where(task=t, scheme=s) if r["x_train"] > 1], metric))
                     for s in schemes}
    return scores, at_l


def _same_schemes(schemes_by_task: dict) -> list:
    """The schemes of the first task, once every task is checked to hold exactly those (a ValueError naming the
    task and the schemes it lacks or adds): a scheme missing from one task would leave that task's ranks wrong."""
    tasks = list(schemes_by_task)
    if not tasks:
        raise ValueError("scores must hold at least one task")
    first = list(schemes_by_task[tasks[0]])
    for t in tasks[1:]:
        have = set(schemes_by_task[t])
        if have != set(first):
            raise ValueError(f"task {t!r} must rank the schemes of task {tasks[0]!r}: it lacks "
                             f"{sorted(set(first) - have)} and adds {sorted(have - set(first))}")
    return first


def tied_ranks(values: dict, *, higher_is_better: bool = True) -> dict:
    """{key: 1 + the number of keys strictly better}: tied keys share the best rank of their tie (1, 1, 3),
    so a rank never depends on the order of the input."""
    sign = 1 if higher_is_better else -1
    return {k: 1 + sum(sign * w > sign * v for w in values.values()) for k, v in values.items()}


def mean_reciprocal_rank(scores: dict, lower_is_better=("lm",)) -> Table:
    """Kazemnejad et al.'s summary: rank schemes on each task, average 1/rank over tasks (MRR), best first.

    Every task must score the same schemes; tied scores share the best rank of their tie (`tied_ranks`)."""
    schemes = _same_schemes({t: list(sc) for t, sc in scores.items()})
    ranks = {t: tied_ranks(sc, higher_is_better=t not in lower_is_better) for t, sc in scores.items()}
    return Table(sorted(({"scheme": s, **{f"{t} (beyond L)": scores[t][s] for t in scores},
                          **{f"rank {t}": ranks[t][s] for t in scores},
                          "MRR": mean(1 / ranks[t][s] for t in scores)} for s in schemes), key=lambda r: -r["MRR"]))


def mrr_bootstrap(rows: Table, tasks, *, level: float = 0.95, n_boot: int = 1000, seed: int = 0,
                  lower_is_better=("lm",)) -> Table:
    """How far seed noise moves the MRR ranking: one row per scheme with its MRR over `tasks`
    (`mean_reciprocal_rank` of the mean over seeds), the percentile bootstrap interval of that MRR
    at `level`, and the best and worst place in the MRR order that the middle `level` of resamples give
    (tied MRRs share the best place of their tie). Every task must hold the same schemes.

    Each resample draws, for every task, its seeds with replacement, paired across schemes (the
    schemes of one task share seeds, hence data), and recomputes every score as the mean over the
    drawn seeds of the metric beyond L (x_train > 1: accuracy, or bits per character for `lower_is_better`
    tasks), then the MRR. Deterministic given `seed`. A rank moves when scores inside their seeds'
    spread swap, which the mean of the scores does not show.
    """
    rows, tasks = Table(rows), list(tasks)
    if not tasks:
        raise ValueError("tasks must name at least one task of rows")
    unknown = [t for t in tasks if not rows.where(task=t)]
    if unknown:
        raise ValueError(f"tasks {unknown} have no rows; rows hold {list(dict.fromkeys(rows.column('task')))}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, int) or n_boot < 1:
        raise ValueError(f"n_boot must be an int of at least 1; got {n_boot!r}")
    _check_level(level)
    schemes = _same_schemes({t: list(dict.fromkeys(rows.where(task=t).column("scheme"))) for t in tasks})
    beyond = [x for x in set(rows.column("x_train")) if x > 1]
    by_seed = {t: {s: per_seed(rows, "bpc" if t in lower_is_better else "accuracy", x_train=beyond, task=t, scheme=s)
                   for s in schemes} for t in tasks}   # {task: {scheme: {seed: score beyond L}}}
    seeds = {t: sorted(set.intersection(*(set(by_seed[t][s]) for s in schemes))) for t in tasks}
    unpaired = [t for t in tasks if not seeds[t]]      # resampling pairs seeds across schemes: they must share one
    if unpaired:
        raise ValueError(f"tasks {unpaired} have no seed that every scheme of rows was trained with")

    def mrr_of(draw):                                     # draw: {task: [seed, ...]}
        scores = {t: {s: mean(by_seed[t][s][k] for k in draw[t]) for s in schemes} for t in tasks}
        return {r["scheme"]: r["MRR"] for r in mean_reciprocal_rank(scores, lower_is_better)}

    point = mrr_of(seeds)
    rng = random.Random(seed)
    mrrs: dict[str, list[float]] = {s: [] for s in schemes}
    places: dict[str, list[int]] = {s: [] for s in schemes}
    for _ in range(n_boot):
        m = mrr_of({t: [rng.choice(seeds[t]) for _ in seeds[t]] for t in tasks})
        place = tied_ranks(m)                              # tied MRRs share a place
        for s in schemes:
            mrrs[s].append(m[s])
            places[s].append(place[s])
    return Table({"scheme": s, "MRR": point[s], "MRR interval": list(central(mrrs[s], level=level)),
                  "places": list(central(places[s], level=level))} for s in sorted(schemes, key=lambda s: -point[s]))


def written(x: float, fmt: str = "{:.3f}") -> str:
    """`fmt.format(x)`, except that a value that rounds to zero is written as zero: -0.0004 with
    "{:+.3f}" is "+0.000", not "-0.000" (a sign the printed digits do not carry)."""
    text = fmt.format(x)
    digits = re.sub(r"[^0-9]", "", text)
    return fmt.format(0.0) if text.lstrip().startswith("-") and digits and not digits.strip("0") else text


def with_interval(values, fmt: str = "{:.3f}") -> str:
    """'mean [low, high]': the mean of `values` (one per seed) and its 95% bootstrap interval
    (`bootstrap_ci`), each written with `fmt` (`written`). The book's tables write every interval so."""
    values = effect_values(values)
    lo, hi = bootstrap_ci(values)
    return f"{written(mean(values), fmt)} [{written(lo, fmt)}, {written(hi, fmt)}]"


def length_table(rows: Table, *, metric: str = "bpc", factors=(1, 2, 4, 8), hue: str = "scheme") -> Table:
    """One row per `hue` group: `metric` at each evaluation length factor * L as the mean over seeds with its
    95% interval (`with_interval`), and the ratio of the means at the last and first factor, e.g. "8x / 1x"
    = mean bpc at 8L / mean bpc at L. Sorted by the mean at the first factor, lowest first."""
    rows = Table(rows)
    first, last = factors[0], factors[-1]
    at = {g: {f: rows.where(**{hue: g}, x_train=float(f)).column(metric) for f in factors}
          for g in dict.fromkeys(rows.column(hue))}
    for g, by in at.items():
        missing = [f for f, v in by.items() if not v]
        if missing:
            raise ValueError(f"rows has no {metric!r} for {hue}={g!r} at factors {missing}")
    out = Table({hue: g, **{f"{f}x": with_interval(v) for f, v in by.items()},
                 f"{last}x / {first}x": round(mean(by[last]) / mean(by[first]), 3)} for g, by in at.items())
    return Table(sorted(out, key=lambda r: mean(at[r[hue]][first])))


def length_means(rows: Table, metric: str, *, by: str = "scheme", digits: int = 3) -> Table:
    """One row per value of `by` (in order of first appearance): the mean of `metric` over its rows at each
    evaluation length factor x_train, as columns "1x", "2x", ... (rounded to `digits`). Every row of a group
    at one factor counts once (seeds, and e.g. the passkey's depths): for intervals over seeds use
    `length_table`. A group has columns only for the factors it was scored at."""
    rows = Table(rows)
    for column in (by, metric, "x_train"):
        if rows and column not in rows.columns:
            raise ValueError(f"rows has no column {column!r}; columns: {rows.columns}")
    out = Table()
    for name in dict.fromkeys(rows.column(by)):
        group = rows.where(**{by: name})
        out.append({by: name, **{f"{x:g}x": round(column_mean(group, metric, x_train=x), digits)
                                 for x in sorted(set(group.column("x_train")))}})
    return out


def findings(rows: Table, costs: Table | None = None, *, threshold: float = 0.9, mrr: dict | None = None,
             places: dict | None = None) -> Table:
    """The book's summary, one row per scheme: language-model loss at L and its ratio at 8L (means over
    seeds with 95% bootstrap intervals), the length-generalisation MRR (over the tasks some scheme learns to
    `threshold` at L, `beyond_scores`) with the places in the MRR order that seed noise allows
    (`mrr_bootstrap`), and the training-step time and memory against NoPE from the cost benchmark
    (`costs`: rows with scheme, train/nope, act/nope). A "seeds" column only where the schemes' seed counts
    differ.

    mrr, places: {scheme: MRR} and {scheme: (best place, worst place)} ranked elsewhere (a suite trained
    for some of the schemes only), instead of ranking `rows`; a scheme they lack gets empty cells."""
    rows = Table(rows)
    lm = rows.where(task="lm")
    if mrr is None:
        boot = mrr_bootstrap(rows, list(beyond_scores(rows, threshold=threshold)[0]))
        mrr, places = {r["scheme"]: r["MRR"] for r in boot}, {r["scheme"]: r["places"] for r in boot}
    cost = {r["scheme"]: r for r in (costs or [])}
    out = Table()
    for s in dict.fromkeys(rows.column("scheme")):
        seeds = sorted({r["seed"] for r in lm.where(scheme=s)})
        at_l = [lm.where(scheme=s, seed=k, x_train=1.0)[0]["bpc"] for k in seeds]
        ratio = [lm.where(scheme=s, seed=k, x_train=8.0)[0]["bpc"] / lm.where(scheme=s, seed=k, x_train=1.0)[0]["bpc"]
                 for k in seeds]
        row = {"scheme": s, "bpc at L": with_interval(at_l), "8L / L": with_interval(ratio), "MRR": round(mrr[s], 3) if s in mrr else ""}
        if places:
            row["MRR places"] = _places(places[s]) if s in places else ""
        row["seeds"] = len(seeds)
        if s in cost:
            row |= {"step / NoPE": round(cost[s]["train/nope"], 2), "memory / NoPE": round(cost[s]["act/nope"], 2)}
        out.append(row)
    if len({r["seeds"] for r in out}) == 1:         # one count for all: the page's status line gives it, not a column
        out = Table({k: v for k, v in r.items() if k != "seeds"} for r in out)
    return Table(sorted(out, key=lambda r: float(r["bpc at L"].split()[0])))


def _places(span) -> str:
    """(best, worst) place in an order, written "2 to 4", or "1" when seed noise cannot move it."""
    best, worst = span
    return f"{best}" if best == worst else f"{best} to {worst}"


def findings_summary(table: Table) -> str:
    """A paragraph reading the `findings` table, written from its numbers (so it follows the results)."""
    rows = list(table)
    num = lambda r, col: float(str(r[col]).split()[0])
    best = rows[:2]
    flat = [r["scheme"] for r in rows if num(r, "8L / L") <= 1.01]
    worst = max(rows, key=lambda r: num(r, "8L / L"))
    by_mrr = sorted((r for r in rows if r["MRR"] != ""), key=lambda r: -r["MRR"])
    nope = next((r for r in by_mrr if r["scheme"] == "nope"), None)
    nope_rank = tied_ranks({r["scheme"]: r["MRR"] for r in by_mrr})["nope"] if nope else None
    text = (f"At the training length the best language models are {best[0]['scheme']} and {best[1]['scheme']} "
            f"({num(best[0], 'bpc at L'):.3f} and {num(best[1], 'bpc at L'):.3f} bits per character). "
            f"From L to 8L, {', '.join(flat) or 'no scheme'} {'ends' if len(flat) < 2 else 'end'} at most 1% above "
            f"{'its' if len(flat) < 2 else 'their'} loss at L, while "
            f"{worst['scheme']} degrades most ({num(worst, '8L / L'):.2f}x).")
    if by_mrr:                                                    # a synthetic suite ranked some schemes
        span = lambda r: (f" (place{'s' if ' to ' in r['MRR places'] else ''} {r['MRR places']} under seed noise)"
                          if r.get("MRR places") else "")
        text += (f" On length generalisation (mean reciprocal rank over the LM and the tasks some scheme learned"
                 f"{'' if len(by_mrr) == len(rows) else f', the {len(by_mrr)} schemes ranked'}) "
                 f"{by_mrr[0]['scheme']} ranks first{span(by_mrr[0])}")
        text += f" and NoPE {nope_rank} of {len(by_mrr)}{span(nope)}." if nope else "."
    if all("step / NoPE" in r for r in rows):
        cheap = sorted((r for r in rows if r["scheme"] != "nope"), key=lambda r: r["step / NoPE"])
        text += (f" A training step costs from {cheap[0]['step / NoPE']:.2f}x NoPE's ({cheap[0]['scheme']}) to "
                 f"{cheap[-1]['step / NoPE']:.2f}x ({cheap[-1]['scheme']}).")
    return text


# -- chapter 17: paired effects over seeds, and what a trained CoPE counts ------------------------
def per_seed(rows: Table, metric: str, *, x_train=None, **where) -> dict:
    """{seed: mean of `metric`} over the rows matching `where` (exact values) whose x_train is `x_train`
    (a number, or a collection of numbers: e.g. (2, 4) for "beyond the training length"; None: any).

    The values of two schemes trained with the same seeds pair up by key, so an effect per seed is
    `{s: a[s] - b[s] for s in a}`, and `verdict` takes its values.
    """
    sub = Table(rows).where(**where)
    if x_train is not None:
        wanted = {float(x) for x in (x_train if isinstance(x_train, (list, tuple, set)) else (x_train,))}
        sub = Table(r for r in sub if float(r["x_train"]) in wanted)
    if not sub:
        raise ValueError(f"no rows with {where} and x_train={x_train!r}; columns: {Table(rows).columns}")
    out = {}
    for seed in sorted(set(sub.column("seed"))):
        out[seed] = mean(metric_values((r for r in sub if r["seed"] == seed), metric))
    return out


def paired(fn, *arms: dict) -> dict:
    """{seed: fn(arm_1[seed], ..., arm_k[seed])}: a per-seed effect of arms trained on the same seeds.

    Each arm is a `per_seed` dict. Pairing by seed is what makes the effect's interval tight: two
    schemes trained from seed s share their data order, so e(s) = f(a_s, b_s) cancels what the seed
    alone decides. The arms must hold the same seeds; a seed missing from one is an error, never
    a silently shorter effect. Seeds come out in ascending order, as `per_seed` gives them.
    """
    if not arms:
        raise ValueError("paired needs at least one arm (a {seed: value} dict)")
    seeds = sorted(arms[0])
    for i, arm in enumerate(arms[1:], start=2):
        if sorted(arm) != seeds:
            raise ValueError(f"arm {i} holds seeds {sorted(arm)}, arm 1 holds {seeds}: paired effects need the "
                             f"same seeds in every arm")
    return {s: fn(*(arm[s] for arm in arms)) for s in seeds}


def paired_difference(a: dict, b: dict) -> dict:
    """{seed: a[seed] - b[seed]} (`paired` with subtraction): e.g. RoPE's loss at 8L minus xPos's."""
    return paired(lambda x, y: x - y, a, b)


def length_ratio(rows: Table, metric: str, far, *, near=1, **where) -> dict:
    """{seed: m(far) / m(near)}: how `metric` grows from `near` to `far` times the training length.

    m(x) is `per_seed(rows, metric, x_train=x, **where)`; e.g. a language model whose loss at 8L
    over its loss at L is 1.00 extrapolates flat, and 1.10 has lost 10%.
    """
    return paired(lambda f, n: f / n, per_seed(rows, metric, x_train=far, **where),
                  per_seed(rows, metric, x_train=near, **where))


def cope_gate_maps(model, tokens, positions=None) -> list:
    """The gates g_ij of every layer of a CoPE model on `tokens` [B, T]: a list of [B, H, T, T] tensors.

    Reads them as the forward pass makes them (the scheme's `gates` is wrapped for one call), so
    they are exactly the gates the trained model counts with; nothing in the model is changed.
    """
    import torch
    scheme = model.scheme
    if not hasattr(scheme, "gates"):
        raise TypeError(f"cope_gate_maps needs a CoPE model; got scheme {type(scheme).__name__}")
    seen, original = [], scheme.gates

    def record(q, k):
        g = original(q, k)
        seen.append(g.detach())
        return g

    scheme.gates = record
    try:
        with torch.no_grad():
            model(tokens, positions)
    finally:
        del scheme.gates                       # the instance attribute; the class's method is back
    return seen


def gate_means(gate_maps, marked) -> Table:
    """Per layer and head, the mean gate on visible keys that are marked and on those that are not.

    mean_{b, i, j <= i : marked[b, j]} g_bij, and the same over unmarked keys, for `gate_maps` as
    `cope_gate_maps` returns them (a list of [B, H, T, T]) and `marked` a [B, T] bool tensor.
    """
    import torch
    if not isinstance(marked, torch.Tensor) or marked.dtype != torch.bool or marked.dim() != 2:
        raise TypeError("marked must be a [batch, T] bool tensor")
    batch, T = marked.shape
    if not gate_maps or any(g.dim() != 4 or g.shape[0] != batch or g.shape[2:] != (T, T) for g in gate_maps):
        raise ValueError(f"gate_maps must be a non-empty list of [batch, heads, T, T] tensors with batch={batch}, "
                         f"T={T} (the shape of marked)")
    visible = torch.ones(T, T, dtype=torch.bool, device=marked.device).tril()
    keys = {"marked": marked[:, None, :] & visible, "unmarked": ~marked[:, None, :] & visible}      # [B, T, T]
    out = Table()
    for layer, g in enumerate(gate_maps, 1):
        means = {k: (g * m[:, None]).sum((0, 2, 3)) / m.sum() for k, m in keys.items()}   # [H] each
        for head in range(g.shape[1]):
            out.append({"layer": layer, "head": head + 1, "mean gate, marked keys": means["marked"][head].item(),
                        "mean gate, unmarked keys": means["unmarked"][head].item()})
    return out


# -- what attention heads do with position (TUPE's head analysis) ---------------------------------
HEAD_KINDS = ("previous token", "next token", "local", "global")


def offset_profile(logits, max_offset: int):
    """Mean attention weight at each offset o = j - i, per head: softmax_j(logits_ij) averaged over the
    queries i for which key i + o exists. logits: [H, N, N]; returns [H, 2 max_offset + 1] (o = -m..m)."""
    import torch
    if logits.dim() != 3 or logits.shape[-1] != logits.shape[-2]:
        raise ValueError(f"logits must be [heads, N, N]; got {tuple(logits.shape)}")
    if not isinstance(max_offset, int) or not 1 <= max_offset < logits.shape[-1]:
        raise ValueError(f"max_offset must be an int in [1, N={logits.shape[-1]}); got {max_offset!r}")
    probs = logits.float().softmax(-1)                                       # (H, N, N)
    return torch.stack([probs.diagonal(o, dim1=-2, dim2=-1).mean(-1) for o in range(-max_offset, max_offset + 1)], -1)


def cls_attention_share(model, tokens, start: int) -> list[float]:
    """Per layer, the share of the attention [CLS] gives the window's tokens that goes to those from index
    `start` on, its weight on itself left out: sum_{j >= start} a_[CLS],1+j / sum_{j >= 0} a_[CLS],1+j, averaged
    over the batch and the heads. tokens: [B, L] without [CLS]; the model needs cls_token=True. Attention spread
    evenly over the window gives (L - start) / L."""
    if getattr(model, "cls", None) is None:
        raise ValueError("model needs cls_token=True (a [CLS] row to read)")
    if tokens.dim() != 2:
        raise ValueError(f"tokens must be [batch, length]; got {tuple(tokens.shape)}")
    if not isinstance(start, int) or not 0 <= start < tokens.shape[1]:
        raise ValueError(f"start must be an int in [0, length={tokens.shape[1]}); got {start!r}")
    from .tasks.scoring import scoring_mode
    with scoring_mode(model):
        maps = model.attention_maps(tokens)                                 # each (B, H, 1 + L, 1 + L)
    return [(a[:, :, 0, 1 + start:].sum(-1) / a[:, :, 0, 1:].sum(-1)).mean().item() for a in maps]


def head_kind(profile, *, window: int = 2) -> str:
    """One head's kind from its `offset_profile` row p(o), o = -m..m:

        "previous token"  p(-1) >= 0.4 and p(-1) >= 2 p(+1);   "next token": the mirror image;
        "local"           the mass within |o| <= window is >= 0.6;   "global": otherwise.
    """
    m = (len(profile) - 1) // 2
    if len(profile) != 2 * m + 1 or m < max(1, window):
        raise ValueError(f"profile must have 2m + 1 entries with m >= window={window}; got {len(profile)}")
    p = [float(v) for v in profile]
    prev, nxt = p[m - 1], p[m + 1]
    if prev >= 0.4 and prev >= 2 * nxt:
        return "previous token"
    if nxt >= 0.4 and nxt >= 2 * prev:
        return "next token"
    return "local" if sum(p[m - window: m + window + 1]) >= 0.6 else "global"
