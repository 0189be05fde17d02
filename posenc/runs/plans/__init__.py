"""Every chapter's runs, declared as specs per profile; importing this package registers them.

A module here defines, for one chapter, a function `profile -> [(label, RunSpec), ...]`
decorated with `@declare("<chapter>")`. The label (scheme, seed, task, ...) is how the
chapter finds a run again; it is not part of the spec's hash, so two chapters that
declare the same run share its record.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Callable
from ..store import PROFILES

PLANS: dict[str, Callable] = {}


def declare(name: str):
    """Decorator registering a chapter's plan under `name` (the notebook's file stem)."""
    def add(fn):
        PLANS[name] = fn
        return fn
    return add


def _load() -> None:
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


#: Model options every `full` spec of a scheme carries, whichever chapter declares it. `full` runs are made by ten
#: workers sharing one GPU, where FLOATER's ODE solve (T sequential RK4 steps, hundreds of tiny kernels) costs
#: about 0.55 s a training step at T = 128 against 0.1 s on the worker's own CPU core (`Floater`'s solve_on).
FULL_MODEL_OPTIONS = {"floater": {"solve_on": "host"}}


def plan(name: str, profile: str) -> list:
    """[(label, spec)] of chapter `name` at `profile` ([] when the chapter has none at that profile), each `full`
    spec with its scheme's FULL_MODEL_OPTIONS."""
    _load()
    if name not in PLANS:
        raise ValueError(f"no plan named {name!r}; known: {', '.join(sorted(PLANS))}")
    if profile not in PROFILES:                      # a misspelt profile is not "no runs at this profile"
        raise ValueError(f"profile must be one of {PROFILES}; got {profile!r}")
    labelled = list(PLANS[name](profile))
    if profile != "full":
        return labelled
    return [(label, spec.replace(model=FULL_MODEL_OPTIONS[spec.scheme]) if spec.scheme in FULL_MODEL_OPTIONS
             else spec) for label, spec in labelled]


def names() -> list[str]:
    """Every declared plan's name, sorted: the chapters' file stems and the runner's extra sweeps."""
    _load()
    return sorted(PLANS)
