"""How claims, tables and run records are written, kept apart and read back: a claim of one profile never
replaces another's, intervals are written low then high, a record is the run its key names (weights
included), and the runner's `load_only`, dry run and `auto` profile say what is really stored.

Found untested by a mutation audit (2026-12-05): each test fails on a realistic bug that every other
test let through.
"""
import json
import sys

import pytest

import posenc
from posenc import Table
from posenc.analysis import Band
from posenc.runs import Store, ensure

from test_runs import tiny


def fake_record():
    return {"table": [{"length": 6, "accuracy": 0.5}], "history": [], "machine": "cpu: x", "seconds": 1.0}


# the claims file must be keyed by its profile: a ci claim never overwrites the paper one
def test_claims_of_two_profiles_live_apart(tmp_path):
    posenc.save_claim("01_x", "paper", "c", "paper numbers", True, results_dir=tmp_path)
    posenc.save_claim("01_x", "ci", "c", "ci numbers", False, results_dir=tmp_path)
    assert (tmp_path / "paper" / "claims" / "01_x.json").exists()
    assert [r["measured"] for r in posenc.load_claims("paper", results_dir=tmp_path)] == ["paper numbers"]
    assert [r["measured"] for r in posenc.load_claims("ci", results_dir=tmp_path)] == ["ci numbers"]
    assert posenc.chapter_claims("01_x", "paper", results_dir=tmp_path)[0]["verdict"] == "reproduced"


# the measured text writes the interval low bound first, as stored
def test_measured_writes_the_interval_low_then_high(tmp_path):
    out = posenc.record_claim("99_t", "ci", "c", [0.10, 0.11, 0.14], Band(0.05, None), effect="gain",
                              results_dir=tmp_path)
    lo, hi = out["interval"]
    assert lo < hi
    assert out["measured"] == f"gain: +0.117 [{lo:+.3f}, {hi:+.3f}] over 3 seeds; band {out['band']}"


# chapter_claims shows the claims in the order the chapter recorded them, with their verdicts
def test_chapter_claims_keep_the_recorded_order(tmp_path):
    posenc.save_claim("02_y", "ci", "zeta holds", "m1", True, results_dir=tmp_path)
    posenc.save_claim("02_y", "ci", "alpha holds", "m2", "contradicted", results_dir=tmp_path)
    t = posenc.chapter_claims("02_y", "ci", results_dir=tmp_path)
    assert list(t) == [{"verdict": "reproduced", "claim": "zeta holds", "measured": "m1"},
                       {"verdict": "contradicted", "claim": "alpha holds", "measured": "m2"}]
    assert posenc.chapter_claims("none", "ci", results_dir=tmp_path) == []


# verdict_table prints the interval low to high, and the mean to 4 places
def test_verdict_table_writes_low_then_high():
    from posenc.analysis import verdict, verdict_table
    out = verdict([0.101, 0.1123, 0.1341], Band(0.05, None))
    row = verdict_table({"c": out})[0]
    lo, hi = out["interval"]
    assert row["95% interval"] == f"[{lo:.4f}, {hi:.4f}]" and lo < hi
    assert row["mean effect"] == round(out["mean"], 4) == 0.1158


# a zero prints as 0 (not blank), floats to 4 significant digits, columns right-aligned
def test_table_prints_zero_precision_and_alignment():
    text = str(Table([{"a": 0.0, "n": 0, "f": 3.14159}, {"a": 100.0, "n": 12, "f": 1.0}]))
    lines = text.splitlines()
    assert lines[2].split() == ["0", "0", "3.142"]
    assert lines[2].startswith("  0")            # right-aligned under "a" (width 3: "100")
    assert "<td>0</td>" in Table([{"a": 0}])._repr_html_()


# length_means' columns go in increasing factor
def test_length_means_columns_in_increasing_factor():
    from posenc.analysis import length_means
    rows = Table({"scheme": "s", "x_train": x, "acc": 1.0} for x in (8.0, 0.5, 16.0, 1.0, 2.0, 0.25))
    assert list(length_means(rows, "acc")[0]) == ["scheme", "0.25x", "0.5x", "1x", "2x", "8x", "16x"]


# findings' seeds column counts seeds, not rows (shown where the counts differ)
def test_findings_counts_seeds():
    from posenc.analysis import findings
    rows = Table()
    for s, base, seeds in (("a", 3.0, 3), ("nope", 3.5, 2)):
        for seed in range(seeds):
            for x in (1.0, 2.0, 8.0):
                rows.append({"scheme": s, "task": "lm", "seed": seed, "x_train": x, "bpc": base + 0.01 * seed})
    table = findings(rows, mrr={"a": 1.0, "nope": 0.5})
    assert [r["seeds"] for r in table] == [3, 2]


# a record whose spec does not hash to its key is corrupt, even when its "key" field was copied
def test_a_record_with_a_copied_key_but_another_spec_is_refused(tmp_path):
    store = Store("ci", tmp_path)
    a, b = tiny(0), tiny(1)
    store.put(b, fake_record())
    data = json.loads(store.path(b).read_text())
    data["key"] = a.key
    store.path(a).write_text(json.dumps(data))
    with pytest.warns(UserWarning, match="does not hash"):
        assert store.get(a) is None


# a record that keeps weights is missing when its weights file is gone
def test_a_record_without_its_weights_file_is_missing(tmp_path):
    store = Store("ci", tmp_path)
    spec = tiny().replace(keep_weights=True)
    store.put(spec, fake_record(), state_dict={})
    assert store.get(spec) is not None
    store.weights_path(spec).unlink()
    with pytest.warns(UserWarning, match="weights file is missing"):
        assert store.get(spec) is None


# load_only refuses when some (not all) runs are missing, and trains nothing
def test_load_only_refuses_a_partly_stored_set(tmp_path, monkeypatch):
    store = Store("ci", tmp_path)
    store.put(tiny(0), fake_record())
    ran = []
    monkeypatch.setattr(sys.modules["posenc.runs.execute"], "get_recipe",
                        lambda name: lambda s, dev: ran.append(s) or 1 / 0)
    with pytest.raises(LookupError, match="1 of 2 runs"):
        ensure([tiny(0), tiny(1)], store=store, load_only=True, progress=False)
    assert ran == []


# the dry run's per-chapter minutes are the sum over that chapter's missing runs
def test_dry_run_sums_each_chapters_cost(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("POSENC_CI_STORE", str(tmp_path))
    from posenc.runs.__main__ import collect, main
    from posenc.runs.costs import estimate_seconds
    todo = collect(["02_sinusoidal"], "ci")
    assert len(todo) > 1
    assert main(["--profile", "ci", "--chapters", "02_sinusoidal", "--dry-run"]) == 0
    out = capsys.readouterr().out
    cpu = sum(estimate_seconds(s, "cpu") for _, s in todo) / 60
    assert f"~{cpu:7.1f} min" in out
    assert f"{len(todo):>4} runs" in out


# profile="auto" on a CPU shows the full tier when both full and paper are stored in full
def test_auto_prefers_a_complete_full_tier_over_paper(monkeypatch):
    ens = sys.modules["posenc.runs.ensure"]
    from posenc.runs.ensure import Runs
    monkeypatch.setattr(ens.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(ens, "so_far", lambda name, p: Runs(name, p, [], []))
    assert ens.chapter("02_sinusoidal", "auto").profile == "full"


# profile="auto" with load_only on a CUDA machine reads the stored tiers as on a CPU: it trains nothing, and a
# `full` tier still missing runs would raise LookupError (chapter 15 and the findings page on a GPU, on Colab)
def test_auto_load_only_on_cuda_shows_the_largest_complete_stored_tier(monkeypatch):
    ens = sys.modules["posenc.runs.ensure"]
    from posenc.runs.ensure import Runs
    monkeypatch.setattr(ens.torch.cuda, "is_available", lambda: True)
    complete = {"paper"}                                           # full has runs missing; paper is whole
    monkeypatch.setattr(ens, "so_far", lambda name, p: Runs(name, p, [], [], missing=[] if p in complete else [{}]))
    assert ens.chapter("02_sinusoidal", "auto", load_only=True).profile == "paper"
    asked = []
    monkeypatch.setattr(ens, "ensure", lambda specs, profile, **kw: asked.append(profile) or [])
    assert ens.chapter("02_sinusoidal", "auto").profile == "full" and asked == ["full"]   # a chapter that trains


# a chapter without a `full` tier (chapter 10: its claims are decided at paper) shows its stored tiers on a GPU too,
# and asking for a tier a chapter does not declare names the tiers it has
def test_auto_on_cuda_keeps_to_the_stored_tiers_of_a_chapter_without_full_runs(monkeypatch):
    ens = sys.modules["posenc.runs.ensure"]
    from posenc.runs.ensure import Runs
    monkeypatch.setattr(ens.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ens, "so_far", lambda name, p: Runs(name, p, [], []) if p == "paper" else None)
    assert ens.chapter("10_complex_order", "auto").profile == "paper"
    with pytest.raises(ValueError, match="chapter '10_complex_order' declares no 'full' runs; its tiers: ci, paper"):
        ens.chapter("10_complex_order", "full")


# load_claims reads the chapters in name order, whatever order the files were written in
def test_load_claims_orders_by_chapter(tmp_path):
    names = ["05_e", "01_a", "09_i", "03_c", "07_g", "02_b", "08_h", "04_d", "06_f"]
    for n in names:
        posenc.save_claim(n, "ci", f"claim of {n}", "m", None, results_dir=tmp_path)
    assert [r["chapter"] for r in posenc.load_claims("ci", results_dir=tmp_path)] == sorted(names)


# stored() is None unless every record is there
def test_stored_needs_every_record(tmp_path, monkeypatch):
    from posenc.runs import stored
    monkeypatch.setenv("POSENC_CI_STORE", str(tmp_path))
    Store("ci").put(tiny(0), fake_record())
    assert stored([tiny(0), tiny(1)], "ci") is None
    assert [r["key"] for r in stored([tiny(0)], "ci")] == [tiny(0).key]


# every committed verdict must follow from its own record: the one rule applied to the stored interval and band
@pytest.mark.parametrize("profile", ["ci", "paper", "full"])
def test_every_committed_verdict_follows_from_its_stored_interval_band_and_null(profile):
    from posenc.runs.profiles import rejudge
    rows = posenc.load_claims(profile)
    assert rows, f"no committed {profile} claims"
    unbanded = [(r["chapter"], r["claim"]) for r in rows if "band" not in r]
    assert not unbanded, f"claims judged without the one rule's band and interval (record_claim): {unbanded}"
    banded = [r for r in rows if "band" in r]
    unjudgeable = [(r["chapter"], r["claim"]) for r in banded if "null" not in r]
    assert not unjudgeable, f"claims with a band but no null (rerun their chapter): {unjudgeable}"
    wrong = [(r["chapter"], r["claim"], r["verdict"], rejudge(r)) for r in banded if rejudge(r) != r["verdict"]]
    assert not wrong
    assert all(r["profile"] == profile for r in rows)


# a {seed: effect} dict is judged by its effects, not its seeds: the same verdict, mean and interval as the list
def test_a_claim_given_as_a_seed_dict_is_judged_by_its_values(tmp_path):
    from posenc.runs.profiles import claim_verdict
    band, effects = Band(0.05, None), {0: 0.10, 1: 0.12, 2: 0.11}
    as_list = claim_verdict([0.10, 0.12, 0.11], band, effect="gain")
    assert as_list["verdict"] == "reproduced" and as_list["mean"] == pytest.approx(0.11)
    assert claim_verdict(effects, band, effect="gain") == as_list
    out = posenc.record_claim("99_t", "ci", "c", effects, band, effect="gain", results_dir=tmp_path)
    assert out == as_list
    [stored] = posenc.load_claims("ci", results_dir=tmp_path)
    assert stored["verdict"] == "reproduced" and stored["interval"] == list(as_list["interval"])


# ensure gives one record per spec asked for, in order: a spec listed twice is run once but returned twice
def test_ensure_returns_a_record_for_every_spec_listed_even_a_repeated_one(tmp_path):
    store = Store("ci", tmp_path)
    a, b = tiny(0), tiny(1)
    for spec in (a, b):
        store.put(spec, fake_record())
    records = ensure([a, b, a], store=store, load_only=True, progress=False)
    assert [r["key"] for r in records] == [a.key, b.key, a.key]
    assert records[0].spec == records[2].spec == a and records[0]["table"] == records[2]["table"]


# profile="auto" is the GPU tier on a CUDA machine
def test_auto_resolves_to_full_where_cuda_is_available(monkeypatch):
    from posenc.runs.profiles import resolve, torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve("auto") == "full" and resolve("paper") == "paper"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve("auto") == "ci"


# A page that shows another tier shows the deciding tier's verdict of each claim beside its own, and its
# key result names every claim on which the two differ
def test_a_page_of_another_tier_shows_the_deciding_verdicts(tmp_path):
    from posenc.runs.profiles import DECIDING, disagreements
    assert DECIDING == "paper"
    posenc.save_claim("03_z", "paper", "a holds", "m", True, results_dir=tmp_path, seeds=5)
    posenc.save_claim("03_z", "paper", "b holds", "m", "not resolved", results_dir=tmp_path, seeds=5)
    posenc.save_claim("03_z", "full", "a holds", "m", "contradicted", results_dir=tmp_path, seeds=3)
    posenc.save_claim("03_z", "full", "b holds", "m", "not resolved", results_dir=tmp_path, seeds=3)
    posenc.save_claim("03_z", "full", "c holds", "m", True, results_dir=tmp_path, seeds=3)
    t = posenc.chapter_claims("03_z", "full", results_dir=tmp_path)
    assert [(r["verdict"], r["at paper"]) for r in t] == [
        ("contradicted", "reproduced"), ("not resolved", "not resolved"), ("reproduced", "not tested")]
    assert list(t[0]) == ["verdict", "at paper", "claim", "measured"]
    said = disagreements("03_z", "full", results_dir=tmp_path)
    assert said.count("\u201c") == 1 and "\u201ca holds\u201d is contradicted at `full` and reproduced at `paper` (5 seeds)" in said
    assert said.startswith("The `paper` tier") and "differs on 1 claim:" in said
    # the deciding tier itself, and a chapter without paper claims, add nothing
    assert list(posenc.chapter_claims("03_z", "paper", results_dir=tmp_path)[0]) == ["verdict", "claim", "measured"]
    assert disagreements("03_z", "paper", results_dir=tmp_path) == ""
    posenc.save_claim("04_w", "full", "d holds", "m", True, results_dir=tmp_path, seeds=3)
    assert list(posenc.chapter_claims("04_w", "full", results_dir=tmp_path)[0]) == ["verdict", "claim", "measured"]
    assert disagreements("04_w", "full", results_dir=tmp_path) == ""


# A claim that one chapter judges at ci and another at the deciding tier (15 judges at paper what 14, 16 and
# 17 judge at ci) shows that verdict on the first chapter's page, naming the chapter that made it
def test_the_deciding_verdict_is_found_in_another_chapter_by_the_claims_name(tmp_path):
    from posenc.runs.profiles import disagreements
    posenc.save_claim("15_c", "paper", "x holds", "m", "contradicted", results_dir=tmp_path, seeds=5)
    posenc.save_claim("17_b", "paper", "y holds", "m", True, results_dir=tmp_path, seeds=5)
    posenc.save_claim("17_b", "ci", "x holds", "m", "not resolved", results_dir=tmp_path, seeds=3)
    posenc.save_claim("17_b", "ci", "y holds", "m", True, results_dir=tmp_path, seeds=3)
    posenc.save_claim("17_b", "ci", "z holds", "m", True, results_dir=tmp_path, seeds=3)
    t = posenc.chapter_claims("17_b", "ci", results_dir=tmp_path)
    assert [r["at paper"] for r in t] == ["contradicted (chapter 15)", "reproduced", "not tested"]
    said = disagreements("17_b", "ci", results_dir=tmp_path)
    assert "\u201cx holds\u201d is not resolved at `ci` and contradicted at `paper` (5 seeds, chapter 15)" in said
    # a chapter is named as the book numbers it, suffix included
    posenc.save_claim("07b_r", "paper", "z holds", "m", True, results_dir=tmp_path, seeds=5)
    assert posenc.chapter_claims("17_b", "ci", results_dir=tmp_path)[2]["at paper"] == "reproduced (chapter 07b)"
    # two other chapters that disagree at the deciding tier leave no one verdict
    posenc.save_claim("16_a", "paper", "x holds", "m", True, results_dir=tmp_path, seeds=5)
    with pytest.raises(ValueError, match="'x holds' is contradicted in 15_c and reproduced in 16_a"):
        posenc.chapter_claims("17_b", "ci", results_dir=tmp_path)
    # the chapter's own record wins over another chapter's of the same name
    posenc.save_claim("17_b", "paper", "x holds", "m", "not resolved", results_dir=tmp_path, seeds=5)
    assert posenc.chapter_claims("17_b", "ci", results_dir=tmp_path)[0]["at paper"] == "not resolved"


#: How a claim names its source (record_claim's `claim`): a paper's authors, the source article, a named
#: model's or lab's report, or "(this book)" for a check the book adds
SOURCE = r"et al\.|\(the source article\)|\(EleutherAI: |Llama 4's|\(bloc97\)|\(this book[,)]"


# Every committed claim names its source, and one claim has one name in every chapter that judges it, so that
# chapter 15 counts it once and can tell the papers' claims from the book's own
@pytest.mark.parametrize("profile", ["ci", "paper", "full"])
def test_every_committed_claim_names_its_source(profile):
    import re
    rows = posenc.load_claims(profile)
    unsourced = sorted({r["claim"] for r in rows if not re.search(SOURCE, r["claim"])})
    assert not unsourced, f"claims that name no source (a paper, or '(this book)'): {unsourced}"


# An interval of zero width (every seed at a ceiling, or fixed by construction) says so in the measured text
def test_measured_says_when_every_seed_gives_the_same_value(tmp_path):
    same = posenc.record_claim("99_t", "ci", "c", [0.0, 0.0, 0.0], Band(0.02, None), effect="gain",
                               results_dir=tmp_path)
    assert same["measured"] == "gain: +0.000 [+0.000, +0.000] over 3 seeds (all 3 the same); band [0.02, inf]"
    spread = posenc.record_claim("99_t", "ci", "d", [0.0, 0.01, 0.0], Band(0.02, None), effect="gain",
                                 results_dir=tmp_path)
    assert "the same" not in spread["measured"]
    one = posenc.record_claim("99_t", "ci", "e", [0.5], Band(0.02, None), effect="gain", results_dir=tmp_path)
    assert "the same" not in one["measured"]
