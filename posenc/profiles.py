"""Run profiles: `ci` (about a minute on two CPU cores) and `full` (one Colab T4 GPU)."""
from __future__ import annotations

import json
from pathlib import Path

import torch

PROFILES = ("auto", "ci", "full")


def resolve(profile: str = "auto") -> str:
    """'auto' -> 'full' when CUDA is available, else 'ci'."""
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}; got {profile!r}")
    if profile == "auto":
        return "full" if torch.cuda.is_available() else "ci"
    return profile


def save_results(name: str, data, results_dir: str | Path = "../results") -> Path:
    """Write `results/<name>.json` (a `full` run's numbers, shown by the book).

    A dict gets a "machine" entry (device, torch and Python versions) unless it has one.
    """
    if isinstance(data, dict) and "machine" not in data:
        from .bench.timing import machine
        data = {"machine": machine("cuda" if torch.cuda.is_available() else "cpu"), **data}
    path = Path(results_dir) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def load_results(name: str, results_dir: str | Path = "../results"):
    """The numbers of a stored `full` run, or None when there is none."""
    path = Path(results_dir) / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


VERDICTS = {True: "reproduced", False: "not reproduced", None: "not resolved at this scale"}


def save_claim(chapter: str, profile: str, claim: str, measured: str, holds: bool | None, why: str = "",
               results_dir: str | Path = "../results") -> Path:
    """Record one paper claim tested by a chapter in `results/claims_<profile>/<chapter>.json`.

    measured: what the run found, formatted from its numbers; holds: True (reproduced),
    False (not reproduced) or None (not resolved: the gap is within seed noise, or the
    scale is too small). One file per chapter (notebooks may run in parallel); the
    comparison chapter's claims table reads them all with `load_claims`.
    """
    if profile not in ("ci", "full"):
        raise ValueError(f"profile must be 'ci' or 'full' (resolve 'auto' first); got {profile!r}")
    if holds not in VERDICTS:
        raise ValueError(f"holds must be True, False or None; got {holds!r}")
    path = Path(results_dir) / f"claims_{profile}" / f"{chapter}.json"
    claims = json.loads(path.read_text()) if path.exists() else {}
    claims[claim] = {"measured": measured, "verdict": VERDICTS[holds], "why": why}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(claims, indent=1) + "\n")
    return path


def load_claims(profile: str, results_dir: str | Path = "../results") -> list[dict]:
    """Every claim recorded for `profile`, as rows {chapter, claim, measured, verdict, why}, by chapter."""
    folder = Path(results_dir) / f"claims_{profile}"
    return [{"chapter": f.stem, "claim": claim, **rec} for f in sorted(folder.glob("*.json"))
            for claim, rec in json.loads(f.read_text()).items()]
