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
    """Write `results/<name>.json` (a `full` run's numbers, shown by the book)."""
    path = Path(results_dir) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def load_results(name: str, results_dir: str | Path = "../results"):
    """The numbers of a stored `full` run, or None when there is none."""
    path = Path(results_dir) / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None
