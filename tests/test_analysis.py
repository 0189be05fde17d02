"""Statistics shared by the chapters, and the one verdict rule."""
import math
import json

import pytest

import posenc
from hypothesis import given, settings, strategies as st

from posenc.analysis import (Band, bootstrap_ci, central, column_mean, left_plateau_step, mean, plateau_table,
                             smooth, per_seed, steps_to_reach, summarize, verdict, verdict_table)
from posenc.table import Table


def test_mean_and_column_mean_refuse_empty_selections():
    rows = Table([{"s": "a", "x": 1.0, "v": 2.0}, {"s": "a", "x": 1.0, "v": 4.0}, {"s": "b", "x": 1.0, "v": 9.0}])
    assert column_mean(rows, "v", s="a", x=1.0) == 3.0
    with pytest.raises(ValueError, match="no rows"):
        column_mean(rows, "v", s="c")
    with pytest.raises(ValueError, match="empty"):
        mean([])


def test_summarize_groups_by_several_columns():
    rows = Table({"s": s, "x": x, "v": float(v)} for s, x, v in [("a", 1, 1), ("a", 1, 3), ("a", 2, 5), ("b", 1, 7)])
    out = summarize(rows, ("s", "x"), "v")
    assert [(r["s"], r["x"], r["seeds"], r["v"], r["v_spread"]) for r in out] == [
        ("a", 1, 2, 2.0, 2.0), ("a", 2, 1, 5.0, 0.0), ("b", 1, 1, 7.0, 0.0)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-100, 100, allow_nan=False), min_size=1, max_size=12))
def test_bootstrap_interval_brackets_the_mean_and_lies_within_the_data(values):
    lo, hi = bootstrap_ci(values)
    m = sum(values) / len(values)
    assert min(values) - 1e-9 <= lo <= m + 1e-9 <= hi + 2e-9 <= max(values) + 3e-9
    assert bootstrap_ci(values) == (lo, hi)                     # deterministic


def test_bootstrap_resamples_as_many_values_as_it_has():
    """Ten 0/1 values, half of them 1: the mean of ten draws with replacement has a standard deviation of
    sqrt(0.25 / 10) = 0.158, so the 95% percentile interval spans about 2 * 1.96 * 0.158 = 0.62 (a bootstrap
    resampling five values per draw would give 0.88)."""
    low, high = bootstrap_ci([0, 1] * 5, n_boot=4000)
    assert 0.55 <= high - low <= 0.7, (low, high)


def test_an_interval_that_reaches_the_null_of_a_one_sided_band_is_not_opposite_and_one_just_short_of_it_is():
    """"Contradicted" needs the whole interval on the far side of no effect: touching it is not enough."""
    up, down = Band(0.05, None, null=0.0), Band(None, 1.02, null=1.02)
    assert not up.opposite(-0.1, 0.0) and up.opposite(-0.1, -1e-9)
    assert not down.opposite(1.02, 1.5) and down.opposite(1.02 + 1e-9, 1.5)


def test_bootstrap_interval_narrows_with_more_seeds():
    few, many = [0.0, 1.0, 0.5], [0.0, 1.0, 0.5] * 10
    assert bootstrap_ci(many)[1] - bootstrap_ci(many)[0] < bootstrap_ci(few)[1] - bootstrap_ci(few)[0]


def test_verdict_follows_one_rule():
    band = Band(0.6, 0.85, null=1.0)                              # e.g. a fraction of steps; 1 = no effect
    assert verdict([0.70, 0.72, 0.75, 0.71, 0.74], band)["verdict"] == "reproduced"
    assert verdict([1.10, 1.15, 1.12], band)["verdict"] == "contradicted"     # beyond no effect, other side
    assert verdict([0.5, 0.9, 1.2], band)["verdict"] == "not resolved"        # interval too wide
    assert verdict([0.7, 0.7], band)["verdict"] == "not resolved"             # fewer than 3 seeds
    out = verdict([0.70, 0.72, 0.75], band)
    assert out["band"] == "[0.6, 0.85]" and out["seeds"] == 3 and out["interval"][0] <= out["mean"] <= out["interval"][1]
    up = Band(0.03, 0.08)                                          # an increase of 3% to 8%
    assert verdict([-0.05, -0.04, -0.06], up)["verdict"] == "contradicted"
    same = Band(-0.02, 0.02)                                       # "as well as": a signed gap near 0
    assert same.equivalence and not band.equivalence and not up.equivalence
    assert verdict([0.005, -0.004, 0.001, 0.0], same)["verdict"] == "reproduced"
    assert verdict([0.10, 0.12, 0.11], same)["verdict"] == "contradicted"      # surely apart, either side
    assert verdict([-0.10, -0.12, -0.11], same)["verdict"] == "contradicted"
    assert verdict([-0.03, 0.0, 0.03], same)["verdict"] == "not resolved"      # reaches past an edge
    # an equivalence band is contradicted only beyond its edges: [0.01, 0.03] is past the null (0), and
    # past the edge 0.02 only in part, so not resolved (reading "opposite" from the null would contradict it)
    assert verdict([0.01, 0.02, 0.03], same)["verdict"] == "not resolved"
    # a band with its null on an edge, Band(0.0, 0.05), is one-sided in effect, not an equivalence band:
    # an interval above 0.05 is beyond the band but on the claim's side of no effect
    edge = Band(0.0, 0.05)
    assert not edge.equivalence and verdict([0.06, 0.07, 0.08], edge)["verdict"] == "not resolved"
    # intervals exactly on an edge: the band is closed, and the far side starts past the edge
    assert verdict([0.02] * 3, Band(None, 0.02, null=0.02))["verdict"] == "reproduced"
    assert verdict([0.6] * 3, band)["verdict"] == verdict([0.85] * 3, band)["verdict"] == "reproduced"
    assert verdict([1.0] * 3, band)["verdict"] == "not resolved"                # at no effect: not beyond it
    assert verdict([0.02] * 3, same)["verdict"] == "reproduced"
    with pytest.raises(ValueError):
        Band(None, None)
    with pytest.raises(ValueError):
        Band(2.0, 1.0)


def test_the_rule_at_the_edges_of_its_band_and_its_interval():
    """Each boundary of the rule, where an off-by-one would flip a verdict (values in quarters are exact)."""
    inside = Band(0.1, 0.5)
    assert not inside.contains(0.0, 0.3) and not inside.contains(0.3, 0.6) and inside.contains(0.1, 0.5)
    assert verdict([0.0, 0.2, 0.4], inside)["verdict"] == "not resolved"        # overlaps the band, not inside it
    same = Band(-0.25, 0.25)                                      # closed: an interval ending on -0.25 touches it
    assert not same.opposite(-0.5, -0.25) and same.opposite(-0.5, -0.375)
    assert verdict([-0.5, -0.25, -0.25], same)["verdict"] == "not resolved"
    # the percentile interval's ranks: floor((1 - level)/2 (n - 1)) and ceil((1 + level)/2 (n - 1))
    assert central(list(range(10)), level=0.5) == (2, 7)
    assert central(list(range(101)), level=0.9) == (5, 95)
    # `level` reaches the interval the verdict reports
    v = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5]
    assert verdict(v, Band(None, 1.0, null=1.0), level=0.5)["interval"] == list(bootstrap_ci(v, level=0.5))
    assert verdict(v, Band(None, 1.0, null=1.0), level=0.5)["interval"] != verdict(v, Band(None, 1.0, null=1.0))["interval"]


def test_means_refuse_a_nan_a_missing_or_a_misspelt_metric_and_name_it():
    """A NaN passed through summarize's mean, and made its spread depend on the row order ([0.1, nan, 0.9]
    gave nan and 0.8); a misspelt metric gave `int + NoneType`. Both now raise naming the metric."""
    rows = Table([{"scheme": "a", "seed": 0, "acc": 0.1}, {"scheme": "a", "seed": 1, "acc": math.nan},
                  {"scheme": "a", "seed": 2, "acc": 0.9}])
    for call in (lambda: summarize(rows, "scheme", "acc"), lambda: column_mean(rows, "acc", scheme="a"),
                 lambda: per_seed(rows, "acc", scheme="a")):
        with pytest.raises(ValueError, match=r"metric 'acc' must hold numbers \(not NaN\): 1 of"):
            call()
    for call in (lambda: column_mean(rows, "accuracy", scheme="a"), lambda: per_seed(rows, "accuracy", scheme="a")):
        with pytest.raises(ValueError, match=r"metric 'accuracy' is not a column.*'acc'"):
            call()
    with pytest.raises(ValueError, match="metric 'acc' is not a column of 1 of 2 rows"):
        summarize([{"scheme": "a", "acc": 0.5}, {"scheme": "a"}], "scheme", "acc")
    with pytest.raises(ValueError, match="True"):
        column_mean([{"scheme": "a", "ok": True}], "ok")                          # a flag is not a number
    never = summarize([{"s": "a", "steps": math.inf}, {"s": "a", "steps": 3}], "s", "steps")[0]
    assert never["steps"] == math.inf and never["steps_spread"] == math.inf         # an infinity is a value


def test_a_claim_with_no_seed_to_measure_is_not_resolved_and_says_so(tmp_path):
    # a claim about trained models, when no seed trained: nothing measured, never a verdict either way
    band = Band(None, 0.5, null=1.0)
    out = verdict({}, band)
    assert out == {"verdict": "not resolved", "mean": None, "interval": None, "band": str(band), "seeds": 0}
    assert verdict_table({"c": out})[0]["95% interval"] == "none"
    rec = posenc.record_claim("00_x", "ci", "c", {}, band, effect="spread ratio", results_dir=tmp_path)
    assert rec["verdict"] == "not resolved" and rec["measured"] == f"spread ratio: no seed to measure; band {band}"
    stored = json.loads((tmp_path / "ci" / "claims" / "00_x.json").read_text())["c"]
    assert stored["interval"] is None and stored["seeds"] == 0 and stored["verdict"] == "not resolved"
    with pytest.raises(TypeError, match="values must be a sequence"):   # empty is allowed; not-a-sequence is not
        verdict(None, band)


def test_verdict_reads_a_dict_by_its_values_and_refuses_what_has_no_mean():
    band = Band(0.0, 5.0)
    by_seed = {0: -9.0, 1: -9.0, 2: -9.0}                          # the keys (0, 1, 2) would sit in the band
    assert verdict(by_seed, band)["verdict"] == verdict(list(by_seed.values()), band)["verdict"] == "contradicted"
    assert bootstrap_ci({10: 1.0, 11: 1.0, 12: 1.0}) == (1.0, 1.0)
    with pytest.raises(ValueError, match="values must not hold NaN"):
        verdict([math.nan, 0.5, 0.5, 0.5], Band(0.1, None))
    with pytest.raises(ValueError, match="values must not hold NaN"):
        bootstrap_ci({0: 1.0, 1: math.nan, 2: 3.0})
    with pytest.raises(ValueError, match="both inf and -inf"):
        bootstrap_ci([math.inf, 1.0, -math.inf])
    # a seed that never reaches the target has an infinite step fraction: kept, and it widens the interval
    never = verdict([0.3, 0.35, math.inf], Band(0.2, 0.45, null=1.0))
    assert never["interval"][1] == math.inf and never["verdict"] == "not resolved"
    with pytest.raises(TypeError, match="values must be a sequence"):
        verdict("123", Band(0.1, None))
    with pytest.raises(TypeError, match="band must be"):
        verdict([1.0, 2.0, 3.0], (0.1, None))
    for bad in (0, 10.0, True):
        with pytest.raises(ValueError, match="n_boot"):
            bootstrap_ci([1.0, 2.0, 3.0], n_boot=bad)
    with pytest.raises(ValueError, match="level"):
        bootstrap_ci([1.0, 2.0, 3.0], level="0.9")
    with pytest.raises(ValueError, match="min_seeds"):
        verdict([1.0, 2.0, 3.0], band, min_seeds=-1)


def test_a_band_is_finite_numbers_with_no_effect_outside_a_one_sided_band():
    for kw in ({"low": math.nan, "high": 1.0}, {"low": 0.1, "high": math.inf}, {"low": "0.1", "high": "0.5"},
               {"low": 0.1, "high": 0.5, "null": math.nan}):
        with pytest.raises(ValueError, match="Band (low|high|null) must be a finite number"):
            Band(**kw)
    with pytest.raises(ValueError, match="one-sided Band holds its null=0.0"):
        Band(None, 0.02)                       # "grows at most 2%": no growth would sit inside the band
    with pytest.raises(ValueError, match="one-sided Band holds its null=0.5"):
        Band(0.1, None, null=0.5)
    flat = Band(None, 0.02, null=0.02)         # the edge is the null: contradicted only wholly beyond it
    assert verdict([0.01, 0.02, 0.03], flat)["verdict"] == "not resolved"
    assert verdict([0.03, 0.04, 0.035], flat)["verdict"] == "contradicted"
    assert verdict([0.0, 0.01, 0.005], flat)["verdict"] == "reproduced"


def test_training_curve_helpers():
    hist = [{"step": s, "loss": l} for s, l in [(10, 4.0), (20, 3.0), (30, 2.5), (40, 0.5), (50, 0.4)]]
    assert smooth(hist, 1) == [(h["step"], h["loss"]) for h in hist]
    assert steps_to_reach(hist, 2.5, window=1) == 30 and steps_to_reach(hist, 0.0) == math.inf
    assert left_plateau_step(hist, drop=1.0) == 40              # plateau read at step 10 (10% of 50)
    rows = Table([{"model": "m", "seed": 0, "mlm": 1.0}, {"model": "m", "seed": 1, "mlm": 3.0}])
    out = plateau_table(rows, {("m", 0): hist, ("m", 1): hist}, entropy=2.0)
    assert out[0]["seeds_below_H"] == 1 and out[0]["seeds"] == 2 and out[0]["mean_mlm"] == 2.0


def test_plateau_table_reports_the_median_step_at_which_seeds_leave_the_plateau():
    def leaving_at(step):          # loss 4.0 (the plateau, read at step 10) until `step`, then 1.0
        return [{"step": s, "loss": 4.0 if s < step else 1.0} for s in range(10, 101, 10)]
    histories = {("m", 0): leaving_at(40), ("m", 1): leaving_at(math.inf), ("m", 2): leaving_at(20),
                 ("n", 0): leaving_at(math.inf)}
    rows = Table([{"model": "m", "seed": 0, "mlm": 1.9}, {"model": "m", "seed": 1, "mlm": 4.0},
                  {"model": "m", "seed": 2, "mlm": 1.0}, {"model": "n", "seed": 0, "mlm": 3.0}])
    m, n = plateau_table(rows, histories, entropy=2.0)
    assert m["leave_step_median"] == 40               # steps 20, 40, never: the middle one
    assert m["seeds_below_H"] == 2 and m["seeds"] == 3  # 1.9 and 1.0 lie below H - 0.05 = 1.95
    assert n["leave_step_median"] == math.inf and n["seeds_below_H"] == 0


def test_a_run_still_falling_at_a_tenth_of_training_leaves_only_a_known_plateau():
    """In a long run the loss at 10% of training is still on its way down to the plateau: read there, the
    plateau is left a few logs later by every run (the full tier's 1000-step pre-training: step 150 for all).
    Given the plateau's loss, a run that settles on it never leaves, and one that goes below it leaves there."""
    falling_then_flat = [{"step": s, "loss": max(3.9, 4.6 - 0.01 * s)} for s in range(50, 1001, 50)]
    assert left_plateau_step(falling_then_flat) == 200                       # the stand-in "leaves" a flat run
    assert left_plateau_step(falling_then_flat, plateau=3.9) == math.inf
    leaving = [{"step": s, "loss": h["loss"] - (0.5 if s >= 600 else 0.0)} for s, h in
               zip(range(50, 1001, 50), falling_then_flat)]
    assert left_plateau_step(leaving, plateau=3.9) == 600                    # its first log below
    rows = Table([{"model": "m", "seed": 0, "mlm": 3.0}])
    assert plateau_table(rows, {("m", 0): leaving}, 3.2, plateau=3.9)[0]["leave_step_median"] == 600


def test_findings_table_and_summary_follow_the_rows():
    from posenc.analysis import beyond_scores, findings, findings_summary, mean_reciprocal_rank
    rows = Table()
    for s, base, growth, acc in [("a", 3.0, 1.0, 0.9), ("b", 3.5, 1.3, 0.5), ("nope", 3.8, 1.02, 0.3)]:
        for seed in range(3):
            for x in (1.0, 2.0, 8.0):
                rows.append({"scheme": s, "task": "lm", "seed": seed, "x_train": x,
                             "bpc": base * (growth if x == 8.0 else 1.0) + 0.01 * seed})
                rows.append({"scheme": s, "task": "kback", "seed": seed, "x_train": x, "accuracy": acc if x == 1.0 else acc / 2})
            rows.append({"scheme": s, "task": "copy", "seed": seed, "x_train": 1.0, "accuracy": 0.2})
    scores, at_l = beyond_scores(rows)
    assert set(scores) == {"lm", "kback"} and abs(at_l["copy"] - 0.2) < 1e-12       # copy was learned by nobody
    mrr = mean_reciprocal_rank(scores)
    assert mrr[0]["scheme"] == "a" and mrr[0]["MRR"] == 1.0
    table = findings(rows, Table([{"scheme": s, "train/nope": c, "act/nope": 1.0} for s, c in
                                  [("a", 1.5), ("b", 1.1), ("nope", 1.0)]]))
    assert [r["scheme"] for r in table] == ["a", "b", "nope"] and table[0]["bpc at L"].startswith("3.010 [")
    text = findings_summary(table)
    assert "a and b" in text and "b degrades most (1.30x)" in text and "1.10x NoPE's (b)" in text
    # b and NoPE tie on MRR (each second on one task, third on the other): they share place 2 in every resample
    assert [r["MRR places"] for r in table] == ["1", "2", "2"]
    assert "a ranks first (place 1 under seed noise) and NoPE 2 of 3 (place 2 under seed noise)." in text
    ranked_elsewhere = findings(rows, mrr={"b": 1.0, "nope": 0.5})     # a suite that trained b and NoPE only
    assert [r["MRR"] for r in ranked_elsewhere] == ["", 1.0, 0.5]
    text = findings_summary(ranked_elsewhere)
    assert "the 2 schemes ranked) b ranks first and NoPE 2 of 2." in text and "MRR places" not in ranked_elsewhere.columns
    with_places = findings(rows, mrr={"b": 1.0, "nope": 0.5}, places={"b": (1, 2), "nope": (1, 2)})
    assert [r["MRR places"] for r in with_places] == ["", "1 to 2", "1 to 2"]
    assert "b ranks first (places 1 to 2 under seed noise) and NoPE 2 of 2 (places 1 to 2" in findings_summary(with_places)
    assert "seeds" not in table.columns                                  # three seeds each: the page says so once
    fewer = findings(Table(r for r in rows if not (r["scheme"] == "b" and r["seed"] == 2)))
    assert [r["seeds"] for r in fewer] == [3, 2, 3]                     # counts that differ get their column


def test_findings_summary_counts_a_scheme_exactly_1_percent_above_its_loss_at_l_as_flat():
    from posenc.analysis import findings_summary
    row = lambda s, bpc, ratio: {"scheme": s, "bpc at L": f"{bpc} [0, 9]", "8L / L": f"{ratio} [0, 9]", "MRR": ""}
    table = Table([row("a", 2.0, 1.01), row("b", 2.1, 1.0101), row("c", 2.2, 1.5)])
    text = findings_summary(table)                                # and no suite ranked any scheme
    assert "From L to 8L, a ends at most 1% above its loss at L, while c degrades most (1.50x)." in text
    assert "rank" not in text


def _suite(spread):
    """Three schemes on two tasks, five seeds: `a` best everywhere by 0.2, `b` and `c` level on average,
    each seed's score shifted by `spread` * (seed - 2), with b and c shifted in opposite directions."""
    rows = Table()
    for t in ("copy", "sort"):
        for s, base, sign in (("a", 0.9, 0), ("b", 0.5, 1), ("c", 0.5, -1)):
            for seed in range(5):
                for x in (1.0, 2.0, 4.0):
                    acc = 1.0 if x == 1.0 else base + sign * spread * (seed - 2) + (0.001 if s == "b" else 0.0)
                    rows.append({"scheme": s, "task": t, "seed": seed, "x_train": x, "accuracy": acc})
    return rows


def test_mrr_bootstrap_shows_which_places_seed_noise_can_swap():
    from posenc.analysis import mean_reciprocal_rank, mrr_bootstrap
    rows = _suite(spread=0.0)                           # no seed noise: every resample is the point MRR
    out = {r["scheme"]: r for r in mrr_bootstrap(rows, ["copy", "sort"], n_boot=200)}
    assert [r["scheme"] for r in mrr_bootstrap(rows, ["copy", "sort"], n_boot=50)] == ["a", "b", "c"]
    assert out["a"]["MRR interval"] == [1.0, 1.0] and out["a"]["places"] == [1, 1]
    assert out["b"]["MRR interval"] == [0.5, 0.5] and out["c"]["places"] == [3, 3]
    scores = {t: {s: sum(r["accuracy"] for r in rows.where(task=t, scheme=s) if r["x_train"] > 1) / 10
                  for s in "abc"} for t in ("copy", "sort")}
    assert {r["scheme"]: r["MRR"] for r in mean_reciprocal_rank(scores)} == pytest.approx(
        {s: r["MRR"] for s, r in out.items()})
    noisy = {r["scheme"]: r for r in mrr_bootstrap(_suite(spread=0.05), ["copy", "sort"], n_boot=400, seed=1)}
    assert noisy["a"]["places"] == [1, 1]               # 0.2 ahead: no resample moves it
    assert noisy["b"]["places"] == [2, 3] and noisy["c"]["places"] == [2, 3]     # 0.001 apart: they swap
    lo, hi = noisy["b"]["MRR interval"]
    assert lo == pytest.approx(1 / 3) and hi == pytest.approx(0.5)
    assert mrr_bootstrap(_suite(spread=0.05), ["copy", "sort"], n_boot=100, seed=3) == \
        mrr_bootstrap(_suite(spread=0.05), ["copy", "sort"], n_boot=100, seed=3)


def test_mrr_bootstrap_refuses_bad_input_by_name():
    from posenc.analysis import mrr_bootstrap
    rows = _suite(spread=0.0)
    with pytest.raises(ValueError, match="tasks"):
        mrr_bootstrap(rows, ["parity"])
    with pytest.raises(ValueError, match="tasks"):
        mrr_bootstrap(rows, [])
    with pytest.raises(ValueError, match="n_boot"):
        mrr_bootstrap(rows, ["copy"], n_boot=0)
    unpaired = Table(r for r in rows if not (r["task"] == "sort" and r["seed"] == (0 if r["scheme"] == "a" else 1)))
    assert mrr_bootstrap(unpaired, ["sort"])[0]["scheme"] == "a"       # seeds 2, 3, 4 are shared: resampled alone
    with pytest.raises(ValueError, match=r"tasks \['sort'\] have no seed"):
        mrr_bootstrap(Table(r for r in rows if (r["scheme"] == "a") == (r["seed"] == 0)), ["sort"])


def test_per_seed_pairs_runs_by_seed_and_selects_lengths():
    from posenc.analysis import per_seed
    rows = posenc.Table({"scheme": s, "seed": seed, "x_train": x, "acc": base + seed + x / 10}
                        for s, base in (("a", 0.0), ("b", 1.0)) for seed in (0, 1) for x in (1.0, 2.0, 4.0))
    a = per_seed(rows, "acc", scheme="a", x_train=(2, 4))
    b = per_seed(rows, "acc", scheme="b", x_train=(2, 4))
    assert a == pytest.approx({0: 0.3, 1: 1.3})                   # mean of x = 2 and 4 for each seed
    assert {s: b[s] - a[s] for s in a} == pytest.approx({0: 1.0, 1: 1.0})
    assert per_seed(rows, "acc", scheme="a", x_train=1) == pytest.approx({0: 0.1, 1: 1.1})
    with pytest.raises(ValueError, match="no rows"):
        per_seed(rows, "acc", scheme="c")


@given(st.dictionaries(st.integers(0, 20), st.floats(0.1, 10), min_size=1, max_size=6), st.data())
def test_paired_effects_combine_each_seed_with_itself_and_only_itself(a, data):
    from posenc.analysis import paired, paired_difference
    b = {s: data.draw(st.floats(0.1, 10)) for s in reversed(list(a))}      # same seeds, other insertion order
    diff = paired_difference(a, b)
    assert list(diff) == sorted(a)                       # ascending seeds whatever the dicts' order
    assert all(diff[s] == a[s] - b[s] for s in a)        # seed s meets seed s, never a neighbour
    assert paired(min, a, b, a) == {s: min(a[s], b[s]) for s in sorted(a)}


def test_paired_effects_refuse_arms_with_different_seeds():
    from posenc.analysis import paired, paired_difference
    with pytest.raises(ValueError, match=r"arm 2 holds seeds \[0, 1\], arm 1 holds \[0, 1, 2\]"):
        paired_difference({0: 1.0, 1: 1.0, 2: 1.0}, {0: 1.0, 1: 2.0})
    with pytest.raises(ValueError, match="at least one arm"):
        paired(min)


def test_length_ratio_is_each_seeds_metric_far_over_near():
    from posenc.analysis import length_ratio
    rows = posenc.Table({"scheme": s, "seed": seed, "x_train": x, "bpc": (1 + seed) * (1 + grow * (x - 1))}
                        for s, grow in (("flat", 0.0), ("grows", 0.1)) for seed in (0, 1, 2) for x in (1, 2, 8))
    assert length_ratio(rows, "bpc", 8, scheme="flat") == pytest.approx({0: 1.0, 1: 1.0, 2: 1.0})
    assert length_ratio(rows, "bpc", 8, scheme="grows") == pytest.approx({0: 1.7, 1: 1.7, 2: 1.7})
    assert length_ratio(rows, "bpc", 8, near=2, scheme="grows") == pytest.approx({s: 1.7 / 1.1 for s in (0, 1, 2)})
    with pytest.raises(ValueError, match="no rows"):
        length_ratio(rows, "bpc", 4, scheme="flat")


def test_cope_gate_maps_reads_the_gates_the_model_counts_with_and_leaves_it_unchanged():
    import torch
    from posenc.analysis import cope_gate_maps
    torch.manual_seed(0)
    model = posenc.build_model("cope", 11, d_model=16, n_heads=2, n_layers=2, causal=True).eval()
    tokens = torch.randint(0, 11, (1, 7))
    before = model(tokens)
    gates = cope_gate_maps(model, tokens)
    assert len(gates) == 2 and all(g.shape == (1, 2, 7, 7) for g in gates)
    assert all(((g >= 0) & (g <= 1)).all() and torch.equal(g.triu(1), torch.zeros_like(g)) for g in gates)
    assert "gates" not in vars(model.scheme)                           # the wrapper is gone
    torch.testing.assert_close(model(tokens), before)
    with pytest.raises(TypeError, match="CoPE"):
        cope_gate_maps(posenc.build_model("rope", 11, d_model=16, n_heads=2, n_layers=1, causal=True), tokens)


def test_gate_means_average_the_visible_marked_and_unmarked_keys_one_by_one():
    """gate_means against the entries picked out one at a time: key j of row b counts for query i when j <= i,
    for the marked mean when marked[b, j]; future keys never count, whatever their gate."""
    import torch
    from posenc.analysis import gate_means
    g = torch.Generator().manual_seed(0)
    maps = [torch.rand(3, 2, 5, 5, generator=g) for _ in range(2)]
    marked = torch.rand(3, 5, generator=g) < 0.4
    table = gate_means(maps, marked)
    assert [(r["layer"], r["head"]) for r in table] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    for r in table:
        gl = maps[r["layer"] - 1][:, r["head"] - 1]
        on = [gl[b, i, j] for b in range(3) for i in range(5) for j in range(i + 1) if marked[b, j]]
        off = [gl[b, i, j] for b in range(3) for i in range(5) for j in range(i + 1) if not marked[b, j]]
        assert r["mean gate, marked keys"] == pytest.approx(float(sum(on) / len(on)), rel=1e-6)
        assert r["mean gate, unmarked keys"] == pytest.approx(float(sum(off) / len(off)), rel=1e-6)
    future = [m + 10 * torch.ones(5, 5).triu(1) for m in maps]              # gates above the diagonal ignored
    assert gate_means(future, marked) == table
    with pytest.raises(TypeError, match="marked"):
        gate_means(maps, marked.long())
    with pytest.raises(ValueError, match="gate_maps"):
        gate_means([maps[0][:, :, :4, :4]], marked)


def test_head_kind_rules_at_their_boundaries():
    """p(-1) must be twice p(+1) to call a head "previous token" (0.45 against 0.3 is not), and "local" counts
    the mass at both ends of |o| <= window."""
    from posenc.analysis import head_kind
    assert head_kind([0.0, 0.05, 0.45, 0.2, 0.3, 0.0, 0.0]) == "local"            # p(-1) 0.45 < 2 * p(+1) 0.3
    assert head_kind([0.0, 0.05, 0.45, 0.25, 0.22, 0.0, 0.03]) == "previous token"
    assert head_kind([0.0, 0.0, 0.3, 0.5, 0.3, 0.0, 0.0][::-1]) == "local"
    edge = [0.2, 0.3, 0.05, 0.0, 0.05, 0.0, 0.0, 0.0, 0.4]                          # m = 4, window 2
    assert head_kind(edge) == "global"                                              # +-2 hold 0.1: 0.1 < 0.6
    at_plus = [0.1, 0.0, 0.05, 0.0, 0.05, 0.0, 0.5, 0.0, 0.3]                      # offset +2 holds 0.5
    at_minus = at_plus[::-1]
    assert head_kind(at_plus) == head_kind(at_minus) == "local"                     # 0.6 within |o| <= 2


def test_head_kinds_on_constructed_attention():
    import torch
    from posenc.analysis import head_kind, offset_profile
    n = 16
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    logits = torch.stack([8.0 * (j == i - 1), 8.0 * (j == i + 1), -2.0 * (j - i).abs(), torch.zeros(n, n)])
    prof = offset_profile(logits, 4)
    assert prof.shape == (4, 9)
    torch.testing.assert_close(prof[3], torch.full((9,), 1 / n))              # uniform rows: 1/N at every offset
    assert [head_kind(p) for p in prof] == ["previous token", "next token", "local", "global"]


def test_offset_profile_is_the_mean_diagonal_of_the_softmax():
    import torch
    from posenc.analysis import offset_profile
    logits = torch.randn(3, 10, 10)
    probs = logits.softmax(-1)
    prof = offset_profile(logits, 3)
    for h in range(3):
        for o in range(-3, 4):
            want = sum(probs[h, i, i + o] for i in range(10) if 0 <= i + o < 10) / (10 - abs(o))
            torch.testing.assert_close(prof[h, o + 3], want)


def test_head_analysis_bad_input():
    import torch
    from posenc.analysis import head_kind, offset_profile
    with pytest.raises(ValueError, match="logits"):
        offset_profile(torch.zeros(4, 5), 2)
    with pytest.raises(ValueError, match="max_offset"):
        offset_profile(torch.zeros(1, 5, 5), 5)
    with pytest.raises(ValueError, match="profile"):
        head_kind([0.5, 0.5])


def test_checks_table_says_yes_or_no_and_refuses_non_bools():
    import numpy as np
    from posenc.analysis import checks_table
    table = checks_table({"a task is learned": True, "a model ran": np.bool_(False)})
    assert table.column("holds") == ["yes", "no"]
    assert table.column("observation") == ["a task is learned", "a model ran"]
    with pytest.raises(TypeError, match="non-bool values for \\['accuracy'\\]"):
        checks_table({"accuracy": 0.93})


def test_a_tables_html_sets_a_values_interval_apart_and_escapes_the_rest():
    html = Table([{"bpc": "3.208 [3.198, 3.215]", "claim": "+0.1 [-0.2, 0.3] over 3 seeds", "n": 1.5,
                   "name": "a <b> & c"}])._repr_html_()
    assert '<td>3.208<span class="posenc-ci"> [3.198, 3.215]</span></td>' in html
    assert "<td>+0.1 [-0.2, 0.3] over 3 seeds</td>" in html          # an interval inside a sentence stays put
    assert "<td>1.5</td>" in html and "<td>a &lt;b&gt; &amp; c</td>" in html
    prose = "bits per character at 8L / at L: 0.982 [0.982, 0.984] over 3 seeds"   # a measured claim: it wraps
    assert f'<td class="posenc-text">{prose}</td>' in Table([{"measured": prose}])._repr_html_()
    assert '<td>a_long_identifier_without_any_space_in_it_at_all_xx</td>' in \
        Table([{"name": "a_long_identifier_without_any_space_in_it_at_all_xx"}])._repr_html_()   # no space: one line
    assert str(Table([{"bpc": "3.208 [3.198, 3.215]"}])).splitlines()[-1].strip() == "3.208 [3.198, 3.215]"
    at, over = "x" * 39 + " ", "x" * 40 + " "                         # 40 characters stay on one line, 41 wrap
    assert f"<td>{at}</td>" in Table([{"c": at}])._repr_html_()
    assert f'<td class="posenc-text">{over}</td>' in Table([{"c": over}])._repr_html_()


def test_a_tables_html_headers_may_break_after_underscores_and_slashes_only():
    html = Table([{"final_loss_spread": 1, "train/nope": 2, "a <b>": 3}])._repr_html_()
    assert "<th>final_<wbr>loss_<wbr>spread</th>" in html and "<th>train/<wbr>nope</th>" in html
    assert "<th>a &lt;b&gt;</th>" in html                               # escaped, and no break added
    assert "<td>1</td>" in html and "wbr" not in html.split("</thead>")[1]   # the cells are left alone


def test_with_interval_writes_the_mean_and_its_bootstrap_interval():
    from posenc.analysis import bootstrap_ci, with_interval
    values = [3.1, 3.3, 3.2]
    lo, hi = bootstrap_ci(values)
    assert with_interval(values) == f"3.200 [{lo:.3f}, {hi:.3f}]" and lo < 3.2 < hi
    assert with_interval([0.5, 0.25], "{:+.1%}") == "+37.5% [+25.0%, +50.0%]"
    with pytest.raises(ValueError, match="at least one value"):
        with_interval([])


def test_length_table_gives_each_length_with_its_interval_and_the_far_to_near_ratio_sorted_by_the_near_one():
    from posenc.analysis import length_table, with_interval
    bpc = {("a", 1): [3.0, 3.2], ("a", 8): [6.0, 6.4], ("b", 1): [2.0, 2.2], ("b", 8): [2.0, 2.2]}
    rows = Table({"scheme": s, "seed": k, "x_train": float(f), "bpc": v[k]} for (s, f), v in bpc.items() for k in (0, 1))
    table = length_table(rows, factors=(1, 8))
    assert table.column("scheme") == ["b", "a"]                                   # lowest loss at L first
    assert table.columns == ["scheme", "1x", "8x", "8x / 1x"]
    assert table[1]["8x"] == with_interval([6.0, 6.4]) and table[1]["8x / 1x"] == 2.0 and table[0]["8x / 1x"] == 1.0
    with pytest.raises(ValueError, match="scheme='a' at factors \\[4\\]"):
        length_table(rows, factors=(1, 4, 8))
    # sorted at the first factor, not the last: c is best at L and worst at 8L
    rows += Table({"scheme": "c", "seed": k, "x_train": f, "bpc": v} for k in (0, 1) for f, v in ((1.0, 1.5), (8.0, 9.0)))
    assert length_table(rows, factors=(1, 8)).column("scheme") == ["c", "b", "a"]


def test_length_means_averages_every_row_of_a_group_at_each_factor_in_order_of_first_appearance():
    from posenc.analysis import length_means
    rows = Table([{"variant": "b", "x_train": 1.0, "acc": 0.5}, {"variant": "a", "x_train": 2.0, "acc": 0.25},
                  {"variant": "b", "x_train": 1.0, "acc": 1.0}, {"variant": "b", "x_train": 4.0, "acc": 0.0},
                  {"variant": "a", "x_train": 1.0, "acc": 0.125}])
    table = length_means(rows, "acc", by="variant")
    assert table == [{"variant": "b", "1x": 0.75, "4x": 0.0}, {"variant": "a", "1x": 0.125, "2x": 0.25}]
    assert length_means(Table(), "acc") == []
    with pytest.raises(ValueError, match="no column 'bpc'"):
        length_means(rows, "bpc", by="variant")


def test_with_three_seeds_the_95_percent_bootstrap_interval_covers_about_three_times_in_four():
    from posenc.analysis import bootstrap_ci, bootstrap_coverage
    values = [0.3, -1.2, 2.0]
    lo, hi = bootstrap_ci(values)
    assert min(values) <= lo < hi <= max(values)                      # a resampled mean never leaves the range
    assert 0.65 < bootstrap_coverage(3, trials=300) < 0.85            # 1 - 2 (1/2)^3 = 0.75 for the range itself
    with pytest.raises(ValueError, match="n_seeds must be an int >= 2"):
        bootstrap_coverage(1)
    with pytest.raises(ValueError, match="trials must be a positive int"):
        bootstrap_coverage(3, trials=0)


@pytest.mark.parametrize("x, fmt, text", [
    (-0.0004, "{:+.3f}", "+0.000"), (-0.0004, "{:.3f}", "0.000"), (-0.004, "{:+.3f}", "-0.004"),
    (0.0004, "{:+.3f}", "+0.000"), (-0.001, "{:.0%}", "0%"), (-0.3, "{:.0%}", "-30%"), (-1e-9, "{:.2e}", "-1.00e-09"),
])
def test_a_value_that_rounds_to_zero_is_written_without_a_minus_sign(x, fmt, text):
    from posenc.analysis import written
    assert written(x, fmt) == text


def test_claims_and_intervals_write_no_negative_zero():
    from posenc.analysis import Band, with_interval
    from posenc.runs.profiles import claim_verdict
    values = [-0.0004, 0.0003, -0.0002]
    assert "-0.000" not in with_interval(values) and "-0.000" not in claim_verdict(values, Band(0.01, None), effect="e")["measured"]


def test_a_misspelt_column_is_an_error_not_a_pooled_or_blank_result():
    from posenc.analysis import summarize
    rows = Table({"scheme": s, "seed": k, "loss": float(k)} for s in ("a", "b") for k in range(3))
    with pytest.raises(ValueError, match=r"by: no column 'schme'; the rows have \['scheme', 'seed', 'loss'\]"):
        summarize(rows, by="schme", metrics="loss")          # used to pool both schemes into one row
    with pytest.raises(ValueError, match="metrics: no column 'los'"):
        summarize(rows, by="scheme", metrics="los")
    assert [r["scheme"] for r in summarize(rows, by="scheme", metrics="loss")] == ["a", "b"]
    assert Table().require("anything") == Table()          # nothing to check in no rows


def test_table_to_json_writes_through_a_rename(tmp_path, monkeypatch):
    import os
    path = tmp_path / "t.json"
    path.write_text("old\n")
    calls = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (calls.append((a, b)), real(a, b))[1])
    Table([{"a": 1}]).to_json(path)
    assert calls and calls[0][1] == path and path.read_text() == '[\n {\n  "a": 1\n }\n]\n'


def test_the_plateau_sentence_names_the_models_with_no_seed_below_the_plateau():
    from posenc.analysis import plateau_sentence
    plateau = Table([{"model": "A", "seeds_below_H": 0}, {"model": "B", "seeds_below_H": 2},
                     {"model": "C", "seeds_below_H": 0}])
    text = plateau_sentence(plateau, 3.2141)
    assert text.startswith("At this tier A, C end on the unigram plateau") and "H = 3.214 nats" in text
    assert "it has" in plateau_sentence(plateau.where(model="A"), 3.0)
    assert plateau_sentence(plateau.where(model="B"), 3.0) == ""


def test_tied_scores_share_a_rank_whatever_the_order_of_the_input():
    from posenc.analysis import mean_reciprocal_rank, tied_ranks
    assert tied_ranks({"a": 1.0, "b": 1.0, "c": 0.5}) == {"a": 1, "b": 1, "c": 3}
    assert tied_ranks({"a": 2.0, "b": 2.0, "c": 3.0}, higher_is_better=False) == {"a": 1, "b": 1, "c": 3}
    one = mean_reciprocal_rank({"copy": {"a": 1.0, "b": 1.0, "c": 0.5}, "lm": {"a": 2.0, "b": 2.1, "c": 2.2}})
    other = mean_reciprocal_rank({"copy": {"b": 1.0, "a": 1.0, "c": 0.5}, "lm": {"b": 2.1, "a": 2.0, "c": 2.2}})
    mrr = lambda t: {r["scheme"]: r["MRR"] for r in t}
    assert mrr(one) == mrr(other) == {"a": 1.0, "b": 0.75, "c": 1 / 3}
    assert one[0]["rank copy"] == one[1]["rank copy"] == 1


def test_mean_reciprocal_rank_refuses_tasks_that_rank_different_schemes():
    from posenc.analysis import mean_reciprocal_rank, mrr_bootstrap
    with pytest.raises(ValueError, match=r"task 't2'.*lacks \[\] and adds \['z'\]"):
        mean_reciprocal_rank({"t1": {"a": 1.0, "b": 0.0}, "t2": {"a": 0.2, "b": 0.1, "z": 0.9}})
    rows = Table({"scheme": s, "task": t, "seed": 0, "x_train": 2.0, "accuracy": 0.5}
                 for t, schemes in (("copy", "ab"), ("kback", "abz")) for s in schemes)
    for tasks in (["copy", "kback"], ["kback", "copy"]):            # either order: the same error
        with pytest.raises(ValueError, match="must rank the schemes"):
            mrr_bootstrap(rows, tasks)
    with pytest.raises(ValueError, match="level"):
        mrr_bootstrap(rows.where(task="copy"), ["copy"], level=95)
    with pytest.raises(ValueError, match="level"):
        central([1.0, 2.0], level=-0.5)


def test_mrr_bootstrap_gives_schemes_tied_on_every_seed_one_place():
    from posenc.analysis import mrr_bootstrap
    rows = Table({"scheme": s, "task": "copy", "seed": k, "x_train": 2.0, "accuracy": acc}
                 for s, acc in (("a", 1.0), ("b", 1.0), ("c", 0.5)) for k in range(3))
    places = {r["scheme"]: r["places"] for r in mrr_bootstrap(rows, ["copy"], n_boot=50)}
    assert places == {"a": [1, 1], "b": [1, 1], "c": [3, 3]}


def test_with_interval_reads_a_seed_dict_by_its_values():
    from posenc.analysis import with_interval
    assert with_interval({0: 1.5, 1: 1.6, 2: 1.7}) == with_interval([1.5, 1.6, 1.7]) == "1.600 [1.500, 1.700]"


def test_nan_is_an_error_in_every_summary_not_a_silent_value():
    from posenc.analysis import beyond_scores, metric_values
    nan = float("nan")
    with pytest.raises(ValueError, match="NaN loss at step 100"):
        smooth([{"step": 50, "loss": 5.0}, {"step": 100, "loss": nan}, {"step": 150, "loss": 0.1}])
    with pytest.raises(ValueError, match="window"):
        smooth([{"step": 50, "loss": 5.0}], window=0)
    rows = Table([{"model": m, "seed": k, "mlm": v} for m, k, v in (("a", 0, 3.0), ("a", 1, nan), ("b", 0, 2.0),
                                                                    ("b", 1, 2.1))])
    with pytest.raises(ValueError, match="NaN"):
        metric_values(rows.where(model="a"), "mlm")
    flat = [{"step": s, "loss": 4.0} for s in (50, 100, 150)]
    with pytest.raises(ValueError, match="NaN"):
        plateau_table(rows, {(m, k): flat for m in "ab" for k in (0, 1)}, 3.2, plateau=3.9)
    scored = Table([{"scheme": s, "task": "kback", "seed": 0, "x_train": x, "accuracy": nan if x > 1 and s == "a"
                     else 0.95} for s in "ab" for x in (1.0, 2.0)])
    with pytest.raises(ValueError, match="NaN"):
        beyond_scores(scored)


def test_steps_to_reach_refuses_what_would_read_as_never():
    history = [{"step": 50, "loss": 5.0}, {"step": 100, "loss": 0.1}, {"step": 150, "loss": 0.1}]
    assert steps_to_reach(history, 2.0) == 150 and steps_to_reach(history, 0.01) == math.inf   # (5 + 0.1 + 0.1) / 3
    with pytest.raises(ValueError, match="history is empty"):
        steps_to_reach([], 1.0)
    for target in (float("nan"), math.inf, None):
        with pytest.raises(ValueError, match="target must be a finite number"):
            steps_to_reach(history, target)


def test_plateau_table_takes_the_median_of_an_even_number_of_seeds():
    rows = Table([{"model": "m", "seed": k, "mlm": 3.0} for k in range(4)])
    histories = {("m", k): [{"step": s, "loss": 4.0 - (0.5 if s >= leave else 0.0)} for s in range(50, 1001, 50)]
                 for k, leave in enumerate((300, 500, 700, 900))}
    assert plateau_table(rows, histories, 3.2, plateau=3.9)[0]["leave_step_median"] == 600


def test_a_claim_never_reached_is_stored_as_strict_json_and_read_back_as_inf(tmp_path):
    band = Band(0.2, 0.45, null=1.0)
    posenc.record_claim("00_x", "paper", "c", [0.4, math.inf, math.inf], band, effect="steps", results_dir=tmp_path)
    text = (tmp_path / "paper" / "claims" / "00_x.json").read_text()
    strict = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert strict["c"]["interval"][1] == "inf"
    from posenc.runs.profiles import load_claims
    (rec,) = load_claims("paper", tmp_path)
    assert rec["interval"][1] == math.inf and rec["interval"][0] == pytest.approx(0.4)


def test_cls_attention_share_reads_the_cls_row():
    """Of the attention [CLS] gives the window, the share from `start` on: on identical tokens a model without
    positions spreads it evenly, (L - start) / L; from 0 it is all of it; bad arguments are named."""
    import torch
    from posenc.analysis import cls_attention_share
    torch.manual_seed(0)
    model = posenc.build_model("nope", 20, causal=False, cls_token=True, num_classes=2, d_model=16, n_heads=2,
                               n_layers=2, max_len=16).train()
    assert cls_attention_share(model, torch.full((3, 12), 5), 4) == pytest.approx([8 / 12] * 2, abs=1e-6)
    assert model.training                                                    # the mode it had
    x = torch.randint(1, 20, (3, 12))
    assert cls_attention_share(model, x, 0) == pytest.approx([1.0, 1.0], abs=1e-6)
    maps = model.eval().attention_maps(x)
    by_hand = (maps[1][:, :, 0, 7:].sum(-1) / (1 - maps[1][:, :, 0, 0])).mean().item()
    assert cls_attention_share(model, x, 6)[1] == pytest.approx(by_hand, abs=1e-6)
    with pytest.raises(ValueError, match="start"):
        cls_attention_share(model, x, 12)
    with pytest.raises(ValueError, match="cls_token"):
        cls_attention_share(posenc.build_model("nope", 20, causal=False, d_model=16, n_heads=2, n_layers=1,
                                               max_len=16), x, 2)


def test_beyond_scores_leave_out_the_training_length():
    """Scores beyond L average x_train > 1 only: `a` leads at L (1.0 against 0.9) but `b` leads beyond it
    (0.45 against 0.4), so `b` ranks first; counting the L rows would put `a` first (0.7 against 0.675)."""
    from posenc.analysis import beyond_scores, mean_reciprocal_rank
    rows = Table({"scheme": s, "task": "copy", "seed": k, "x_train": x, "accuracy": acc[x]}
                 for s, acc in (("a", {1.0: 1.0, 2.0: 0.4}), ("b", {1.0: 0.9, 2.0: 0.45}))
                 for k in range(3) for x in (1.0, 2.0))
    scores, at_l = beyond_scores(rows)
    assert scores["copy"] == pytest.approx({"a": 0.4, "b": 0.45}) and at_l == {"copy": 1.0}
    assert [r["scheme"] for r in mean_reciprocal_rank(scores)] == ["b", "a"]


def test_with_interval_writes_the_mean_not_the_median():
    """[1, 2, 6]: mean 3, median 2; the written value is the mean."""
    from posenc.analysis import with_interval
    assert with_interval([1, 2, 6]).startswith("3.000 [")


def test_findings_rows_go_by_bits_per_character_at_l_best_first_whatever_the_input_order():
    """The worst language model listed first still ends last: rows are sorted by bpc at L, and the summary names
    the two lowest."""
    from posenc.analysis import findings, findings_summary
    rows = Table({"scheme": s, "task": "lm", "seed": k, "x_train": x, "bpc": base + 0.01 * k}
                 for s, base in (("worst", 3.9), ("mid", 3.5), ("best", 3.1)) for k in range(3) for x in (1.0, 8.0))
    table = findings(rows, mrr={"worst": 0.3, "mid": 0.5, "best": 1.0})
    assert [r["scheme"] for r in table] == ["best", "mid", "worst"]
    assert "the best language models are best and mid (3.110 and 3.510 bits per character)" in findings_summary(table)


def test_mrr_bootstrap_resamples_as_many_seeds_as_each_task_has(monkeypatch):
    """Each resample draws, for every task, one seed per seed it has (with replacement): n_boot * (5 + 5) draws
    for two tasks of five seeds, not one seed fewer per task."""
    import random
    import types
    from posenc import analysis
    drawn = []

    class Counting(random.Random):
        def choice(self, seq):
            drawn.append(len(seq))
            return super().choice(seq)

    monkeypatch.setattr(analysis, "random", types.SimpleNamespace(Random=Counting))
    analysis.mrr_bootstrap(_suite(spread=0.05), ["copy", "sort"], n_boot=20)
    assert drawn == [5] * (20 * 2 * 5)
