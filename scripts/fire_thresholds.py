"""Where FIRE's learned threshold ends in the comparison's paper-tier LM: rerun stored runs with their weights kept.

    python scripts/fire_thresholds.py [--seeds 0 1]      # about a minute per run on one CPU core

The paper tier (chapter 15) stores no weights, so the threshold tau that FIRE learns is not in its records.
For each seed this trains again, on this CPU, the tuned `fire` and `fire (threshold L/4)` LM runs of the
tier (`posenc.runs.plans.suite.tuned_records`) into a throwaway store, keeping the weights, and prints each
layer's tau = init_threshold * exp(log_scale) beside the run's bits per character at L, stored and rerun
(a rerun on other hardware matches to a few thousandths, not bit for bit). On 2026-12-05, seed 0: tau
starts at 512 and ends at 73.4 and 59.0 (layers 0 and 1); started at L/4 = 16 it ends near 60: both end
near the training length L = 64.
"""
from __future__ import annotations

import argparse
import tempfile

from posenc.runs.execute import execute
from posenc.runs.plans import suite
from posenc.runs.store import Store


def thresholds(state_dict: dict) -> list[float]:
    """Each FIRE layer's learned tau, in layer order."""
    return [float(state_dict[k.replace("log_scale", "init_threshold")] * state_dict[k].exp())
            for k in sorted(state_dict) if k.endswith("log_scale")]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as root:
        store = Store("paper", root=root)
        for scheme in ("fire", "fire (threshold L/4)"):
            stored = suite.tuned_records(scheme, "lm")
            if stored is None:
                raise SystemExit(f"the paper tier's tuned LM runs of {scheme!r} are not all stored: "
                                 "python -m posenc.runs --profile paper --chapters 15_length_generalisation")
            for seed in args.seeds:
                if seed not in stored:
                    raise SystemExit(f"seed {seed} of {scheme!r} is not stored; stored seeds: {sorted(stored)}")
                rerun = execute(stored[seed].spec.replace(keep_weights=True), store, device="cpu")
                taus = ", ".join(f"{t:.1f}" for t in thresholds(rerun.state_dict()))
                print(f"{scheme:>22} seed {seed}: tau by layer {taus} | bits per character at L: stored "
                      f"{stored[seed].table[0]['bpc']:.3f}, rerun {rerun.table[0]['bpc']:.3f}", flush=True)


if __name__ == "__main__":
    main()
