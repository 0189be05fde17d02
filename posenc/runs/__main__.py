"""The runner: every chapter's missing runs, with worker processes and a deadline.

    python -m posenc.runs --profile ci --workers 2            # the whole ci tier
    python -m posenc.runs --profile full --deadline 540       # a GPU window: keep what finishes
    python -m posenc.runs --profile full --dry-run            # what is missing, and its estimated cost
    python -m posenc.runs --profile full --fit                # the cost model refitted to the stored runs
    python -m posenc.runs --profile paper --tasks corpus      # only the runs of one task (or synthetic task name)
    torchrun --nproc_per_node 4 -m posenc.runs --profile full # one GPU per rank; a spec goes to rank key % world

Runs are ordered by chapter, then seed, then estimated cost, so that within a deadline
whole chapters and first seeds are done before later ones. Every run is stored the
moment it ends; a run still going at the deadline is abandoned, and the next call
starts it again.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch

from .costs import STEP_OVERHEAD, THROUGHPUT, WINDOW, estimate_seconds, fit, window_seconds
from .ensure import missing
from .execute import default_workers, run_specs, seed_groups
from .plans import names, plan
from .store import PROFILES, Store
from .train import pick_device


def collect(chapters, profile: str) -> list:
    """(chapter, spec) for every missing run of the chosen chapters, in priority order, without repeats."""
    seen, out = set(), []
    for rank, name in enumerate(chapters):
        labelled = plan(name, profile)
        todo = {s.key for s in missing([s for _, s in labelled], profile)}
        for label, spec in sorted(labelled, key=lambda ls: (ls[0].get("seed", 0), ls[1].cost())):
            if spec.key in todo and spec.key not in seen:
                seen.add(spec.key)
                out.append((rank, name, spec))
    return [(name, spec) for _, name, spec in sorted(out, key=lambda t: t[0])]


def of_tasks(todo: list, tasks) -> list:
    """The (chapter, spec) pairs of `todo` whose task, or synthetic task name, is in `tasks` (all when None)."""
    if tasks is None:
        return todo
    return [(name, spec) for name, spec in todo
            if spec.task in tasks or spec.task_kwargs.get("name") in tasks]


def stacking_summary(specs) -> str:
    """How many of `specs` `--stack-seeds` would train stacked, and their share of the estimated GPU time."""
    from .recipes import stack_refusal
    groups = seed_groups(specs, stack=True)
    stacked = [g for g in groups if stack_refusal(g) is None]
    runs = sum(len(g) for g in stacked)
    share = sum(estimate_seconds(s, "cuda") for g in stacked for s in g) / max(
        sum(estimate_seconds(s, "cuda") for s in specs), 1e-9)
    return (f"--stack-seeds: {runs} of {len(specs)} runs in {len(stacked)} stacked groups "
            f"({share:.0%} of the estimated GPU time); the rest one by one")


def declared(profile: str) -> list:
    """Every spec that some chapter declares for `profile`, once each (chapters share specs)."""
    return list({spec.key: spec for name in names() for _, spec in plan(name, profile)}.values())


def prune(profile: str) -> int:
    """Delete the records (and weights) of `profile` that no chapter's plan declares any more."""
    store = Store(profile)
    declared_keys = {spec.key for spec in declared(profile)}
    stale = sorted(store.keys() - declared_keys)
    for key in stale:
        for suffix in (".json", ".pt"):
            (store.folder / f"{key}{suffix}").unlink(missing_ok=True)
    print(f"removed {len(stale)} records that no chapter declares from {store.folder}")
    return 0


def fit_report(profile: str) -> int:
    """Print the cost model (`posenc.runs.costs`) refitted to the stored runs of `profile`, per device, beside the
    constants in the code, and the whole tier's H200 window under the refitted CUDA constants."""
    store, specs = Store(profile), declared(profile)
    records = [r for s in specs if (r := store.get(s)) is not None]
    for device in THROUGHPUT:
        try:
            got = fit(records, device)
        except ValueError:
            print(f"{device}: fewer than 2 timed {profile} runs stored")
            continue
        print(f"{device}: {got['runs']} runs: {got['overhead'] * 1e3:.2f} ms per step (code: "
              f"{STEP_OVERHEAD[device] * 1e3:.2f}), {got['throughput']:.3g} multiply-adds/s (code: "
              f"{THROUGHPUT[device]:.3g}); one run's estimate off by {got['median_error']:.0%} (median)")
        if device == "cuda":
            wall = window_seconds(specs, constants=got)
            print(f"  the whole {profile} tier, {len(specs)} runs, on one H200 with {WINDOW['workers']} workers: "
                  f"about {wall / 60:.1f} min (the window: {WINDOW['seconds'] / 60:.0f})")
    return 0


def _rank_and_world(parser) -> tuple[int, int]:
    """torchrun's RANK and WORLD_SIZE (0 and 1 without torchrun): this process takes the specs `mine` gives it."""
    try:
        rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    except ValueError:
        parser.error(f"RANK and WORLD_SIZE must be ints; got RANK={os.environ.get('RANK')!r}, "
                     f"WORLD_SIZE={os.environ.get('WORLD_SIZE')!r}")
    if world < 1 or not 0 <= rank < world:
        parser.error(f"need WORLD_SIZE >= 1 and 0 <= RANK < WORLD_SIZE; got RANK={rank}, WORLD_SIZE={world}")
    return rank, world


def mine(todo: list, rank: int, world: int) -> list:
    """The (chapter, spec) pairs of `todo` that rank `rank` of `world` runs: those whose key (hexadecimal) is rank
    modulo world. A spec's rank follows from the spec alone, so a rank planning again while others still run
    never takes their specs (a split by position in the list would, once the list changes)."""
    return [(name, spec) for name, spec in todo if int(spec.key, 16) % world == rank]


def one_gpu_per_rank(world: int) -> int:
    """Under torchrun with several ranks on a machine, this rank's GPU alone visible to it and its workers
    (CUDA_VISIBLE_DEVICES narrowed to entry LOCAL_RANK), before anything touches CUDA; returns how many ranks
    share the machine (LOCAL_WORLD_SIZE; 1 without torchrun), which share its cores among their workers."""
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1)) if world > 1 else 1
    if local_world > 1:
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = visible.split(",") if visible else [str(i) for i in range(local_world)]
        if local_rank >= len(gpus):
            raise SystemExit(f"LOCAL_RANK={local_rank} but only {len(gpus)} GPUs are visible ({visible!r})")
        os.environ["CUDA_VISIBLE_DEVICES"] = gpus[local_rank]
    return local_world


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m posenc.runs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", choices=PROFILES, default="ci")
    parser.add_argument("--chapters", nargs="+", default=None, help=f"default: all ({', '.join(names())})")
    parser.add_argument("--tasks", nargs="+", default=None,
                        help="only runs of these tasks: a task (corpus, synthetic, ...) or a synthetic task's name "
                             "(copy, parity, ...); default: all")
    parser.add_argument("--workers", type=int, default=None, help="processes (default: one per core, 10 per GPU)")
    parser.add_argument("--deadline", type=float, default=None, help="seconds; then stop, keeping what finished")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dry-run", action="store_true", help="list what is missing and its estimated cost")
    parser.add_argument("--prune", action="store_true", help="delete stored records that no chapter declares")
    parser.add_argument("--fit", action="store_true", help="refit the cost model to the stored runs")
    parser.add_argument("--stack-seeds", action="store_true",
                        help="train the seeds of one spec as one stacked model where they can be (posenc.runs.stacked)")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="step through CUDA graphs where a run allows it (posenc.runs.graphed; off until a GPU "
                             "window shows it pays)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    chapters = args.chapters or names()
    unknown = sorted(set(chapters) - set(names()))
    if unknown:
        parser.error(f"unknown chapters {unknown}; known: {', '.join(names())}")
    if args.workers is not None and args.workers < 1:
        parser.error(f"--workers must be >= 1; got {args.workers}")
    if args.deadline is not None and not (math.isfinite(args.deadline) and args.deadline > 0):
        parser.error(f"--deadline must be a finite number of seconds > 0; got {args.deadline}")
    if args.dry_run and (args.prune or args.fit):
        parser.error("--dry-run lists what is missing; it does not combine with --prune or --fit")
    if args.prune:
        return prune(args.profile)
    if args.fit:
        return fit_report(args.profile)
    known = {t for n in chapters for _, s in plan(n, args.profile)
             for t in (s.task, s.task_kwargs.get("name"))} if args.tasks is not None else set()
    if args.tasks is not None and set(args.tasks) - known:
        parser.error(f"--tasks: {sorted(set(args.tasks) - known)} not among the tasks of these chapters' "
                     f"{args.profile} runs: {', '.join(sorted(t for t in known if t))}")
    todo = of_tasks(collect(chapters, args.profile), args.tasks)
    rank, world = _rank_and_world(parser)
    local_world = one_gpu_per_rank(world)
    todo = mine(todo, rank, world)
    store = Store(args.profile)
    if args.dry_run:
        for device in ("cpu", "cuda"):
            per: dict[str, float] = {}
            for name, spec in todo:
                per[name] = per.get(name, 0.0) + estimate_seconds(spec, device)
            total = sum(per.values())
            print(f"{device}: {len(todo)} runs missing in {store.folder}, about {total / 60:.1f} min of one "
                  f"{'CPU thread' if device == 'cpu' else 'H200 worker'}")
            for name, seconds in per.items():
                count = sum(1 for n, _ in todo if n == name)
                print(f"  {name:<28} {count:>4} runs  ~{seconds / 60:7.1f} min")
        wall = window_seconds([s for _, s in todo])
        print(f"one H200 with {WINDOW['workers']} workers: about {wall / 60:.1f} min of wall time "
              f"(the design's window: {WINDOW['seconds'] / 60:.0f} min)")
        if args.stack_seeds:
            print(stacking_summary([s for _, s in todo]))
        return 0
    try:
        pick_device(args.device)                          # the runs need it; listing them does not
    except ValueError as err:
        parser.error(f"--device: {err}")
    if not todo:
        print(f"nothing to run: every {args.profile} run of {len(chapters)} chapters is stored in {store.folder}")
        return 0
    if args.profile == "full" and args.device == "auto" and not torch.cuda.is_available():
        print("the full profile is made on a GPU (design.md) and this machine has none: nothing run "
              "(--device cpu runs it here anyway)", file=sys.stderr)
        return 2
    workers = args.workers or max(1, default_workers(args.device) // local_world)
    from .graphed import graphs_asked
    if args.cuda_graphs:
        print("--cuda-graphs: every run steps through CUDA graphs where it can; its record says what it did "
              "(cuda_graphs)", flush=True)
    with graphs_asked(args.cuda_graphs):                  # read by `train` here and in the spawned workers
        return _run(todo, store, args, workers, chapters, rank, world)


def _run(todo, store, args, workers, chapters, rank, world) -> int:
    """The runner's passes: run what is missing, plan again (a grid may declare tuned seeds), until done,
    a failure, or the deadline. 1 if a run failed, else 0."""
    t0, failed = time.monotonic(), False
    while todo:
        left = None if args.deadline is None else args.deadline - (time.monotonic() - t0)
        if left is not None and left <= 0:
            break
        t_pass = time.monotonic()
        out = run_specs([s for _, s in todo], store, workers=workers, device=args.device, deadline=left,
                        progress=not args.quiet, desc=f"{args.profile} runs", stack_seeds=args.stack_seeds)
        finished = set(out["done"])                       # the aggregate throughput of this pass, every worker
        steps = sum(s.train["steps"] for _, s in todo if s.key in finished)
        now = time.monotonic()
        print(f"{len(out['done'])} runs stored, {len(out['failed'])} failed, {len(out['abandoned'])} left for the "
              f"next call, {len(out['deferred'])} not started (estimated to end after the deadline); this pass {now - t_pass:.0f} s with {workers} workers ({now - t0:.0f} s since the call "
              f"began); {steps} training steps in this pass, {steps / max(now - t_pass, 1e-9):.1f} steps/s in all")
        for key, error in out["failed"].items():
            print(f"  failed {key}: {error}", file=sys.stderr)
        failed |= bool(out["failed"])
        if out["failed"] or out["abandoned"] or out["deferred"]:
            break
        # A plan may read the store (a learning-rate grid declares its tuned seeds once the grid is stored):
        # plan again, and go on while that declares runs not yet made.
        todo = mine(of_tasks(collect(chapters, args.profile), args.tasks), rank, world)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
