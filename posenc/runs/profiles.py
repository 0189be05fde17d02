"""Profiles (`ci`, `paper`, `full`), and the claims each chapter records.

`ci` is quick on two CPU cores (what nbval recomputes); `paper` is the CPU scale at
which claims are decided, run by the runner and committed; `full` is sized for one GPU.
Claims live beside the runs: `results/<profile>/claims/<chapter>.json`, written atomically.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch

from .store import PROFILES, Store, atomic_write, inside, results_root

if TYPE_CHECKING:
    from ..analysis import Band
    from ..table import Table

#: A claim's effect per replicate: {seed: effect} or a list of effects.
Effects = Mapping[int, float] | Sequence[float]

CHOICES = ("auto",) + PROFILES


def resolve(profile: str = "auto") -> str:
    """'auto' -> 'full' when CUDA is available, else 'ci'; other profiles are returned as they are."""
    if profile not in CHOICES:
        raise ValueError(f"profile must be one of {CHOICES}; got {profile!r}")
    if profile == "auto":
        return "full" if torch.cuda.is_available() else "ci"
    return profile


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); delete it and rerun what writes it") from err


def save_results(name: str, data: Any, results_dir: str | Path | None = None) -> Path:
    """Write `results/<name>.json` atomically (a file outside the run store: benchmarks, summaries).

    A dict gets a "machine" entry (device, torch and Python versions) unless it has one;
    `name` may not leave the folder.
    """
    folder = Path(results_dir) if results_dir is not None else results_root()
    path = inside(folder, f"{name}.json")
    if isinstance(data, dict) and "machine" not in data:
        from ..bench.timing import machine
        data = {"machine": machine("cuda" if torch.cuda.is_available() else "cpu"), **data}
    bad = _nonfinite(data)
    if bad is not None:
        raise ValueError(f"data{bad[0]} is {bad[1]}: JSON has no NaN or infinity (store None, or the number as a "
                         f"string)")
    return atomic_write(path, json.dumps(data, indent=1, allow_nan=False) + "\n")


def _nonfinite(obj, where: str = "", *, infinite: bool = True) -> tuple[str, float] | None:
    """(where, value) of the first NaN in `obj` (dicts and lists walked; `where` written as ["key"][0]), or of
    the first infinity too when `infinite`; None when there is none."""
    if isinstance(obj, float) and (math.isnan(obj) or (infinite and math.isinf(obj))):
        return where, obj
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for key, value in items:
        found = _nonfinite(value, f"{where}[{key!r}]", infinite=infinite)
        if found is not None:
            return found
    return None


def load_results(name: str, results_dir: str | Path | None = None) -> Any:
    """The numbers stored by `save_results`, or None when there are none."""
    folder = Path(results_dir) if results_dir is not None else results_root()
    path = inside(folder, f"{name}.json")
    return _read_json(path) if path.exists() else None


VERDICTS = {True: "reproduced", False: "not reproduced", None: "not resolved"}
#: the words of design.md's one rule (`posenc.analysis.verdict`), which `record_claim` stores
RULE_VERDICTS = ("reproduced", "contradicted", "not resolved")


def _claims_path(profile: str, chapter: str, results_dir) -> Path:
    root = Store(profile).root if results_dir is None else Path(results_dir)
    return inside(root / profile / "claims", f"{chapter}.json")


def save_claim(chapter: str, profile: str, claim: str, measured: str, holds: bool | None, why: str = "",
               results_dir: str | Path | None = None, **evidence: Any) -> None:
    """Record one paper claim tested by a chapter in `results/<profile>/claims/<chapter>.json`.

    measured: what the run found, formatted from its numbers; holds: a verdict of the one rule
    ("reproduced", "contradicted", "not resolved"), or True (reproduced), False (not reproduced) or None
    (not resolved) for a verdict made some other way. `evidence` (band, interval, seeds, ...) is stored with
    it, and so is the profile. One file per chapter; the comparison chapter reads them all. The book records
    every claim through `record_claim`, which judges it by the rule and stores the evidence that `rejudge`
    reads; tests/test_records.py refuses a committed claim without it.
    """
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES} (resolve 'auto' first); got {profile!r}")
    if not (holds in RULE_VERDICTS or (not isinstance(holds, str) and holds in VERDICTS)):
        raise ValueError(f"holds must be True, False, None or one of {RULE_VERDICTS}; got {holds!r}")
    path = _claims_path(profile, chapter, results_dir)
    claims = _read_claims(path) if path.exists() else {}
    word = holds if isinstance(holds, str) else VERDICTS[holds]
    nan = _nonfinite(evidence, infinite=False)                  # an infinity is a value ("never"): kept as "inf"
    if nan is not None:
        raise ValueError(f"evidence{nan[0]} of claim {claim!r} is NaN: a claim's numbers must be numbers")
    claims[claim] = {"measured": measured, "verdict": word, "why": why, "profile": profile, **evidence}
    atomic_write(path, json.dumps(_strict(claims), indent=1, allow_nan=False) + "\n")


def _strict(obj):
    """`obj` with every infinite float written as the string "inf" or "-inf" (a step count never reached gives
    one), so that the file is JSON every parser reads; `_read_claims` turns them back into floats."""
    if isinstance(obj, float) and math.isinf(obj):
        return "inf" if obj > 0 else "-inf"
    if isinstance(obj, dict):
        return {k: _strict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_strict(v) for v in obj]
    return obj


def _read_claims(path: Path) -> dict:
    """A claims file as `save_claim` wrote it, each interval's "inf" or "-inf" read back as a float."""
    claims = _read_json(path)
    for rec in claims.values():
        if isinstance(rec.get("interval"), list):
            rec["interval"] = [float(v) if v in ("inf", "-inf") else v for v in rec["interval"]]
    return claims


def claim_verdict(values: Effects, band: Band, *, effect: str, fmt: str = "{:+.3f}", unit: str = "seeds") -> dict:
    """design.md's rule on a claim's per-seed effect: `analysis.verdict`'s dict (verdict, mean, interval, band,
    seeds) plus "measured", the effect's name with its mean, interval, seeds and band written out. An interval
    of zero width says so ("over 3 seeds (all 3 the same)"): every seed at a ceiling, a floor or a value the
    construction fixes, which the interval alone would read as a precise measurement.

    values: the effect per seed (a dict {seed: effect} or a list), signed so that the paper's direction is
    the band's side of no effect; band: the `posenc.analysis.Band` named before the runs were read.
    unit: what the replicates are, as "measured" names them: "seeds" (trained models), or for a claim about
    speed "interleaved rounds" (one timing of both arms per round, `posenc.bench.schemes.round_ratios`).
    """
    if not isinstance(unit, str) or not unit:
        raise ValueError(f"unit must be a non-empty str naming the replicates; got {unit!r}")
    from ..analysis import verdict, written
    out = verdict(list(values.values()) if isinstance(values, dict) else list(values), band)
    if out["seeds"] == 0:                       # no seed met what the claim presupposes: nothing measured
        out["measured"] = f"{effect}: no {'seed' if unit == 'seeds' else unit} to measure; band {out['band']}"
        return out
    lo, hi = out["interval"]
    # every replicate the same: a ceiling, a floor or a value fixed by construction, not a spread that is small
    same = f" (all {out['seeds']} the same)" if out["seeds"] > 1 and lo == hi else ""
    out["measured"] = (f"{effect}: {written(out['mean'], fmt)} [{written(lo, fmt)}, {written(hi, fmt)}] over "
                       f"{out['seeds']} {unit}{same}; band {out['band']}")
    return out


def record_claim(chapter: str, profile: str, claim: str, values: Effects, band: Band, *, effect: str,
                 fmt: str = "{:+.3f}", why: str | dict = "", unit: str = "seeds",
                 results_dir: str | Path | None = None) -> dict:
    """Judge `claim` by the book's one rule (`claim_verdict`) and record it (design.md, "Claims").

    The stored record carries the profile, the seeds, the mean effect, its 95% bootstrap interval and the
    band, written out ("band") and as numbers (low and high, None where open, and null, the value of no
    effect), so that its verdict can be judged again from the file alone (`rejudge`). Returns
    `claim_verdict`'s dict. With replicates other than seeds (`unit`), "seeds" counts them and "unit" names them.

    Args:
        chapter: the notebook's file stem ("11_rope"); the record goes to
            `results/<profile>/claims/<chapter>.json`.
        profile: the tier measured, "ci", "paper" or "full".
        claim: the claim in words, naming its source in parentheses: the paper ("(Press et al.,
            Table 2)"), or "(this book)" for a check the book adds itself. One claim has one name in
            every chapter and tier that judges it, however it is measured there (`effect` says how),
            so that a page finds its verdict at the deciding tier and chapter 15 counts it once.
        values: the effect per seed (a dict {seed: effect} or a list), signed so that the paper's
            direction is the band's side of no effect.
        band: the `posenc.analysis.Band` named before the runs were read.
        effect: what `values` measure, in words.
        fmt: how the effect is written.
        why: the reason shown beside the verdict; or a dict {verdict: reason} when the reason depends on
            how the claim comes out (a reason written for a failure must not stand beside
            "reproduced"). The dict must have a reason for the verdict the rule gives.
        unit: what the replicates are ("seeds", or "interleaved rounds" for a claim about speed).
        results_dir: another results folder than the package's `results/`.
    """
    if isinstance(why, dict):
        unknown = sorted(set(why) - set(RULE_VERDICTS))
        if unknown:
            raise ValueError(f"why's keys must be verdicts {RULE_VERDICTS}; got {unknown}")
    elif not isinstance(why, str):
        raise TypeError(f"why must be a str or a dict {{verdict: reason}}; got {type(why).__name__}")
    out = claim_verdict(values, band, effect=effect, fmt=fmt, unit=unit)
    if isinstance(why, dict) and out["verdict"] not in why:
        raise ValueError(f"why has no reason for the verdict {out['verdict']!r} of claim {claim!r} "
                         f"({out['measured']}); it has {sorted(why)}")
    reason = why[out["verdict"]] if isinstance(why, dict) else why
    save_claim(chapter, profile, claim, out["measured"], out["verdict"], reason, results_dir,
               band=out["band"], low=band.low, high=band.high, null=band.null, mean=out["mean"],
               interval=out["interval"], seeds=out["seeds"], **({} if unit == "seeds" else {"unit": unit}))
    return out


def rejudge(record: dict) -> str:
    """The verdict the one rule gives a stored claim record (`record_claim`'s fields: low, high, null,
    interval, seeds), for checking a claims file without the chapter that wrote it: a record as `load_claims`
    gives it, or straight from `json.load` (its infinities the strings "inf" and "-inf")."""
    from ..analysis import MIN_SEEDS, Band
    missing = [k for k in ("low", "high", "null", "interval", "seeds") if k not in record]
    if missing:
        raise ValueError(f"record lacks {missing}: only claims written by record_claim can be judged again")
    if record["seeds"] < MIN_SEEDS or record["interval"] is None:          # too few seeds, or none at all
        return "not resolved"
    number = lambda v: float(v) if v in ("inf", "-inf") else v       # a raw file writes infinities as strings
    band, (lo, hi) = Band(record["low"], record["high"], record["null"]), map(number, record["interval"])
    return "reproduced" if band.contains(lo, hi) else "contradicted" if band.opposite(lo, hi) else "not resolved"


def load_claims(profile: str, results_dir: str | Path | None = None) -> list[dict]:
    """Every committed claim for `profile`, as rows {chapter, claim, measured, verdict, why}, by chapter."""
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}; got {profile!r}")
    folder = (results_root() if results_dir is None else Path(results_dir)) / profile / "claims"
    return [{"chapter": f.stem, "claim": claim, **rec} for f in sorted(folder.glob("*.json"))
            for claim, rec in _read_claims(f).items()]


#: The tier at which the book decides its claims (design.md, "Runs as data"): the CPU scale, with the
#: most seeds and tuned rates. A page that shows another tier shows this one's verdicts beside its own.
DECIDING = "paper"


def chapter_claims(chapter: str, profile: str, results_dir: str | Path | None = None) -> Table:
    """The claims `chapter` recorded for `profile`, as a table (verdict, claim, measured): what the chapter
    shows after recording them, and what the comparison chapter's claims table collects.

    When `profile` is not the deciding tier (`DECIDING`) and that tier judged any of the chapter's claims
    (in this chapter or, by the claim's name, in another: `deciding_verdicts`), a column `at paper` beside
    the verdict gives each claim's verdict there, naming the other chapter where it was judged ("not
    tested" where that tier does not test the claim): a page that shows its GPU or quick runs never
    hides the verdict that decides.
    """
    from ..table import Table
    path = _claims_path(profile, chapter, results_dir)
    claims = _read_claims(path) if path.exists() else {}
    deciding = deciding_verdicts(chapter, profile, results_dir)
    column = f"at {DECIDING}"
    return Table({"verdict": r["verdict"],
                  **({column: _verdict_there(deciding.get(c))} if deciding else {}),
                  "claim": c, "measured": r["measured"]} for c, r in claims.items())


def _verdict_there(record: dict | None) -> str:
    """A deciding-tier record's verdict, naming the chapter that made it when it is another's; "not tested"
    for no record."""
    if record is None:
        return "not tested"
    return record["verdict"] + (f" (chapter {chapter_number(record['chapter'])})" if "chapter" in record else "")


def chapter_number(chapter: str) -> str:
    """A chapter's number as the book writes it, from its file stem ("07b_relative_comparison" -> "07b")."""
    return chapter.split("_")[0]


def deciding_verdicts(chapter: str, profile: str, results_dir: str | Path | None = None) -> dict:
    """{claim: record} at the deciding tier for `chapter`'s claims, or {} when `profile` is that tier or
    it holds none of them.

    A claim's record is the chapter's own at that tier, else the record of the same claim (by name) that
    another chapter made there, with "chapter" naming that chapter: the comparison chapter (15) judges
    at `paper` some claims that chapters 14, 16 and 17 judge only at `ci`. Two other chapters that judge
    the claim there with different verdicts are a ValueError: no one verdict decides it."""
    if profile == DECIDING:
        return {}
    own = _claims_path(DECIDING, chapter, results_dir)
    found = _read_claims(own) if own.exists() else {}
    shown = _claims_path(profile, chapter, results_dir)
    wanted = (set(_read_claims(shown)) if shown.exists() else set()) - set(found)
    for other in sorted(own.parent.glob("*.json")) if wanted else ():
        for claim, rec in _read_claims(other).items():
            if claim not in wanted:
                continue
            if claim in found and found[claim]["verdict"] != rec["verdict"]:
                raise ValueError(f"claim {claim!r} is {found[claim]['verdict']} in {found[claim]['chapter']} and "
                                 f"{rec['verdict']} in {other.stem} at {DECIDING}: no one verdict decides it")
            found.setdefault(claim, {**rec, "chapter": other.stem})
    return found


def disagreements(chapter: str, profile: str, results_dir: str | Path | None = None) -> str:
    """One sentence naming the claims whose verdict at `profile` differs from the deciding tier's, with
    that tier's verdict and seeds; "" when none does (or `profile` is the deciding tier)."""
    deciding = deciding_verdicts(chapter, profile, results_dir)
    path = _claims_path(profile, chapter, results_dir)
    shown = _read_claims(path) if deciding and path.exists() else {}
    differ = [(c, r["verdict"], deciding[c]) for c, r in shown.items()
              if c in deciding and deciding[c]["verdict"] != r["verdict"]]
    if not differ:
        return ""
    def where(rec: dict) -> str:
        """The note after a verdict, e.g. ' (5 seeds, chapter 14)': its seeds, and the chapter that made
        the record where it is another's."""
        said = ([f"{rec['seeds']} seeds"] if isinstance(rec.get("seeds"), int) else []) + (
            [f"chapter {chapter_number(rec['chapter'])}"] if "chapter" in rec else [])
        return f" ({', '.join(said)})" if said else ""
    parts = [f"\u201c{c}\u201d is {mine} at `{profile}` and {rec['verdict']} at `{DECIDING}`{where(rec)}"
             for c, mine, rec in differ]
    return (f"The `{DECIDING}` tier, which decides the book's verdicts, differs on {len(differ)} "
            f"claim{'s' if len(differ) != 1 else ''}: " + "; ".join(parts) + ".")
