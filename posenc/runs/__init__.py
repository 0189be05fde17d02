"""Runs as data: a frozen spec per training run, a store of records, and one runner.

    spec = RunSpec(scheme="rope", task="corpus", task_kwargs={"train_length": 64},
                   model={"d_model": 64, "causal": True}, train={"steps": 300}, seed=0, lengths=(64, 512))
    [record] = posenc.runs.ensure([spec], profile="ci")   # trains only if no record exists
    runs = posenc.runs.chapter("11_rope")                 # a chapter's declared runs, largest profile stored

`python -m posenc.runs --profile full --deadline 540` runs every chapter's missing
runs with worker processes and keeps whatever finished; `--stack-seeds` trains the seeds
of one spec as one stacked model where they can be (`posenc.runs.stacked`).
"""
from .spec import RunSpec
from .store import PROFILES, Record, Store, atomic_write, results_root
from .recipes import RECIPES, recipe
from .execute import execute, run_specs
from .ensure import Runs, chapter, ensure, missing, so_far, stored, tier_count
from .plans import PLANS, declare, plan

__all__ = ["RunSpec", "Store", "Record", "PROFILES", "results_root", "atomic_write", "RECIPES", "recipe", "execute",
           "run_specs", "ensure", "missing", "so_far", "stored", "tier_count", "Runs", "chapter", "PLANS", "declare", "plan"]
