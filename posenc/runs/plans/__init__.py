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


def plan(name: str, profile: str) -> list:
    """[(label, spec)] of chapter `name` at `profile` ([] when the chapter has none at that profile)."""
    _load()
    if name not in PLANS:
        raise ValueError(f"no plan named {name!r}; known: {', '.join(sorted(PLANS))}")
    return list(PLANS[name](profile))


def names() -> list[str]:
    _load()
    return sorted(PLANS)
