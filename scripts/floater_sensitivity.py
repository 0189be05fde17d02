"""Chapter 03's FLOATER LM records (GPU `full` tier), replayed on this CPU: is the run's slow start the machine's
or the training's?

    python scripts/floater_sensitivity.py [--steps 200]      # about 5 minutes on one CPU core

For seed 0 of the `full` FLOATER and sinusoidal character LMs it trains the first steps again here in float32
(`posenc.runs.replay`) and prints the logged training losses beside the H200 record's: FLOATER as stored, and
FLOATER with every parameter nudged by one part in 10^4. On 2026-12-04 sinusoidal replayed the H200's losses to
three decimals; FLOATER replayed them for 100 steps and then took a faster path, and the nudged replay followed
the H200's slow one. Training this flow is sensitive to rounding: the record is the training's, not a
machine's fault.
"""
from __future__ import annotations

import argparse

import posenc
from posenc.runs import Store
from posenc.runs.replay import replay


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args(argv)
    runs, store = posenc.runs.chapter("03_floater", "full"), Store("full")
    columns = {}
    for name, scheme, perturb in (("sinusoidal", "sinusoidal", None), ("floater", "floater", None),
                                  ("floater, nudged 1e-4", "floater", (1, 1e-4))):
        rows = replay(runs.spec(task="lm", scheme=scheme, seed=0), store, args.steps, perturb=perturb)
        columns[name] = rows
        print(f"{name}: done", flush=True)
    table = posenc.Table({"step": r["step"], **{f"{n} (CPU)": c[i]["replayed"] for n, c in columns.items()},
                          "sinusoidal (H200)": columns["sinusoidal"][i]["stored"],
                          "floater (H200)": columns["floater"][i]["stored"]}
                         for i, r in enumerate(columns["floater"]))
    print(table.round(3))


if __name__ == "__main__":
    main()
