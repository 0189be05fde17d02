"""Run specs, in this process or in worker processes, storing each record the moment it ends.

Every CPU run uses one torch thread, whoever runs it (a notebook, the runner, a worker):
the numbers of a spec then do not depend on how many runs share the machine, and a run
is bit-identical wherever it is repeated on the same kind of CPU. Parallelism comes from
worker processes, one job each: a run, or with `stack_seeds` the seeds of one spec trained as
one stacked model (`posenc.runs.stacked`; equal to the runs alone up to rounding, not bit for bit).
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import subprocess
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch

with warnings.catch_warnings():  # tqdm.auto warns when ipywidgets is absent, then falls back to text bars
    warnings.simplefilter("ignore")
    from tqdm.auto import tqdm

from . import costs
from .recipes import get_recipe
from .spec import RunSpec, key_of
from .store import Record, Store

_VERSION: dict | None = None


def code_version() -> dict:
    """posenc's version and, in a git checkout, the commit (with '+dirty' for uncommitted changes)."""
    global _VERSION
    if _VERSION is None:
        from .. import __version__
        repo = Path(__file__).resolve().parents[2]
        commit = None
        if (repo / ".git").exists():
            try:
                commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True,
                                        text=True, timeout=10).stdout.strip() or None
                dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", "posenc"],
                                       capture_output=True, text=True, timeout=10).stdout.strip()
                commit = f"{commit}+dirty" if commit and dirty else commit
            except (OSError, subprocess.SubprocessError):
                commit = None
        _VERSION = {"posenc": __version__, "commit": commit}
    return _VERSION


@contextmanager
def one_thread():
    """torch.set_num_threads(1) for the duration of a run (restored after), on every device.

    On the CPU a run is timed on one thread, and the runner's workers take a core each. On a GPU the
    host's share of a step is launches and small ops: ten workers each keeping PyTorch's default of one
    OpenMP thread per core would put 160 threads on an H200 machine's 16 cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def execute(spec: RunSpec, store: Store, device: str = "auto") -> Record:
    """Run one spec with its recipe and write its record (and weights) to `store`."""
    from .train import pick_device
    from ..bench.timing import machine
    from .graphed import graph_log, graphs_wanted, summary
    dev = pick_device(device)
    with one_thread(), graph_log() as log:
        made_on = machine(dev)                          # the thread count the run is trained with
        t0 = time.perf_counter()
        out = get_recipe(spec.recipe)(spec, str(dev))
        seconds = time.perf_counter() - t0
    graphs = {"cuda_graphs": summary(log)} if graphs_wanted() else {}     # what `--cuda-graphs` did to this run
    return _store(spec, out, store, made_on, seconds, **graphs)


def _store(spec: RunSpec, out: dict, store: Store, made_on: str, seconds: float, **extra) -> Record:
    """Write a recipe's output as `spec`'s record (`made_on`: the machine line, read while the run's thread
    setting held; code version, wall time, `extra`), with its weights when the spec keeps them."""
    record = {"table": out["table"], "history": out["history"], "final_loss": out["final_loss"],
              "machine": made_on, "version": code_version(), "seconds": round(seconds, 2), **extra}
    state = {k: v.detach().cpu() for k, v in out["model"].state_dict().items()} if spec.keep_weights else None
    return store.put(spec, record, state)


def execute_stacked(specs: list, store: Store, device: str = "auto") -> list[Record]:
    """Run several seeds of one spec as one stacked model (`posenc.runs.stacked`) and store each record.

    Each record is the one `execute` would write, up to rounding, with "stacked": the number of
    seeds trained together; its "seconds" is the group's wall time shared equally. ValueError
    (`recipes.stack_refusal`) for specs that cannot be stacked.
    """
    from .recipes import run_stacked, stack_refusal
    from .train import pick_device
    why = stack_refusal(specs)
    if why is not None:
        raise ValueError(f"these {len(specs)} specs cannot be stacked: {why}")
    from ..bench.timing import machine
    dev = pick_device(device)
    with one_thread():
        made_on = machine(dev)
        t0 = time.perf_counter()
        outs = run_stacked(specs, str(dev))
        seconds = (time.perf_counter() - t0) / len(specs)
    return [_store(spec, out, store, made_on, seconds, stacked=len(specs)) for spec, out in zip(specs, outs)]


def execute_group(specs: list, store: Store, device: str = "auto", report=None) -> None:
    """Run `specs` (seeds of one spec, or one spec), stacked when they can be, else one by one; call
    `report(key, seconds, error)` as each ends. A stacked attempt that fails (an operation without a
    vmap rule on this device, say) falls back to one by one, the error noted in the log."""
    report = report or (lambda *a: None)
    from .recipes import stack_refusal
    if len(specs) > 1 and stack_refusal(specs) is None:
        try:
            for spec, record in zip(specs, execute_stacked(specs, store, device)):
                report(spec.key, record["seconds"], None)
            return
        except Exception as err:  # noqa: BLE001 - any failure of the stacked path: the plain one still runs
            print(f"stacking {len(specs)} seeds of {specs[0].scheme}/{specs[0].task} failed "
                  f"({type(err).__name__}: {err}); training them one by one", flush=True)
    for spec in specs:
        try:
            record = execute(spec, store, device)
            report(spec.key, record["seconds"], None)
        except Exception as err:  # reported by the parent with the spec's key
            report(spec.key, None, f"{type(err).__name__}: {err}")


def seed_groups(specs, stack: bool) -> list[list]:
    """`specs` as jobs: with `stack`, the seeds of one spec together (in the order of their first seed);
    else one spec per job."""
    if not stack:
        return [[s] for s in specs]
    groups: dict[str, list] = {}
    for s in specs:
        groups.setdefault(s.replace(seed=0).key, []).append(s)
    return list(groups.values())


#: With a deadline, a job estimated to need at least this share of it starts first, longest first: a run that
#: needs most of a call and starts late is abandoned at the deadline, and its worker's time with it.
LONG_SHARE = 0.25
#: A worker's first job may be estimated to end this much past the deadline (the estimates are rough, and the
#: longest jobs must be tried); a job estimated longer than that is certain to be cut off, and never starts.
FIRST_JOB_SLACK = 1.25
#: What a worker reports, in place of an error, for a job it did not start because its estimate ends after the
#: deadline: the next call runs it, and the worker takes a shorter one.
DEFERRED = "deferred: estimated to end after the deadline"


def deadline_order(estimates: list, deadline: float | None) -> list[int]:
    """The order (indices into the jobs, whose estimated seconds are `estimates`) in which workers take them:
    with a deadline, the jobs estimated at LONG_SHARE of it or more (but within FIRST_JOB_SLACK of it) first,
    longest first, then the rest in their given (priority) order, and last those too long for the deadline
    (which the workers then defer); without one, the given order."""
    if deadline is None:
        return list(range(len(estimates)))
    fits = [e <= FIRST_JOB_SLACK * deadline for e in estimates]
    long = sorted((i for i, e in enumerate(estimates) if fits[i] and e >= LONG_SHARE * deadline),
                  key=lambda i: -estimates[i])
    return (long + [i for i, e in enumerate(estimates) if fits[i] and e < LONG_SHARE * deadline]
            + [i for i in range(len(estimates)) if not fits[i]])


def starts(estimate: float, now: float, end: float | None, first: bool) -> bool:
    """Whether a worker starts a job estimated at `estimate` seconds at `now` (time.monotonic()) with the
    deadline at `end`: always without a deadline; a worker's first job if it ends within FIRST_JOB_SLACK
    of the time left; a later job only if it ends before the deadline."""
    if end is None:
        return True
    return estimate <= (FIRST_JOB_SLACK if first else 1.0) * (end - now)


def _worker(jobs, done, profile: str, root: str, device: str, end: float | None = None) -> None:
    """A worker process: run groups of specs from `jobs` until a None arrives; report (key, seconds or error).

    Each job comes with its estimated seconds. A worker does not start one that `starts` says would end after
    `end` (time.monotonic(), the parent's clock too): it reports each spec as DEFERRED and takes the next.
    Its first job may overrun a little, so the longest jobs, queued first, are tried. A job whose specs cannot
    be rebuilt here (a recipe registered in the parent alone, not in an importable module) is reported as
    failed, by key."""
    store = Store(profile, root)
    first = True
    while True:
        item = jobs.get()
        if item is None:
            return
        try:
            specs, estimate = [RunSpec.from_dict(d) for d in item[0]], item[1]
        except Exception as err:  # noqa: BLE001 (reported to the parent, which names the spec)
            for d in item[0]:
                done.put((key_of(d), None, f"the worker cannot rebuild this spec ({type(err).__name__}: "
                          f"{err}); a recipe must be registered in an importable module, not only in __main__"))
            continue
        if not starts(estimate, time.monotonic(), end, first):
            for spec in specs:
                done.put((spec.key, None, DEFERRED))
            continue
        first = False
        execute_group(specs, store, device,
                      report=lambda key, seconds, error: done.put((key, seconds, error)))


def default_workers(device: str = "auto") -> int:
    """One worker per core on the CPU (each runs one thread); 10 per GPU (small models leave it idle; an
    H200 machine has 16 cores, one per worker), but never more workers than cores: each drives its GPU
    from a core of its own, and a Colab runtime (two cores, one T4) would otherwise start ten processes,
    each with its own CUDA context, on two cores."""
    cores = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    if device != "cpu" and torch.cuda.is_available():
        return min(10 * torch.cuda.device_count(), cores)
    return cores


def run_specs(specs, store: Store, *, workers: int = 1, device: str = "auto", deadline: float | None = None,
              progress: bool = True, desc: str = "runs", stack_seeds: bool = False) -> dict:
    """Run `specs` (none of them stored yet), storing each as it ends.

    workers == 1 and no deadline: in this process. Otherwise worker processes (spawned);
    at `deadline` (seconds from now) they are killed: what finished is stored, runs in
    flight are abandoned and the next call starts them again; the longest jobs start first, and a job whose
    estimate (`posenc.runs.costs`) ends after the deadline is deferred, not started (`deadline_order`,
    `starts`). Specs left unfinished by a worker that died before the deadline (killed for memory, a crash)
    are reported as failed, with its exit code. With `stack_seeds`, the seeds of one spec are one job,
    trained as one stacked model where they can be (`execute_group`). Returns {"done", "failed",
    "abandoned", "deferred"} (the last two: keys for the next call).
    """
    specs = list(specs)
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int; got {workers!r}")
    bar = tqdm(total=len(specs), desc=desc, disable=not progress or not specs, unit="run")
    done: list[str] = []
    failed: dict[str, str] = {}
    if workers == 1 and deadline is None and not stack_seeds:
        for spec in specs:
            try:
                execute(spec, store, device)
            except Exception as err:
                if hasattr(err, "add_note"):                        # Python 3.11 and later
                    err.add_note(f"while running spec {spec.key} ({spec.scheme} on {spec.task}, seed {spec.seed}); "
                                 "the runs before it are stored")
                raise
            done.append(spec.key)
            bar.update()
        bar.close()
        return {"done": done, "failed": failed, "abandoned": [], "deferred": []}
    groups = seed_groups(specs, stack_seeds)
    if workers == 1 and deadline is None:
        def report(key, seconds, error):
            (failed.__setitem__(key, error) if error else done.append(key))
            bar.update()
        for group in groups:
            execute_group(group, store, device, report)
        bar.close()
        return {"done": done, "failed": failed, "abandoned": [], "deferred": []}
    end = None if deadline is None else time.monotonic() + deadline
    from .train import pick_device
    kind = "cuda" if pick_device(device).type == "cuda" else "cpu"
    estimates = [sum(costs.estimate_seconds(s, kind) for s in group) for group in groups]
    ctx = mp.get_context("spawn")
    jobs, results = ctx.Queue(), ctx.Queue()
    for i in deadline_order(estimates, deadline):
        jobs.put(([spec.to_dict() for spec in groups[i]], estimates[i]))
    n = min(workers, len(groups))
    for _ in range(n):
        jobs.put(None)
    procs = [ctx.Process(target=_worker, args=(jobs, results, store.profile, str(store.root), device, end),
                         daemon=True) for _ in range(n)]
    deferred: list[str] = []
    ended_early, killed = False, set()
    for p in procs:
        p.start()
    try:
        while len(done) + len(failed) + len(deferred) < len(specs):
            if end is not None and time.monotonic() >= end:
                break
            if not any(p.is_alive() for p in procs) and results.empty():
                ended_early = True
                break
            try:
                key, seconds, error = results.get(timeout=0.5 if end is None else max(0.05, min(0.5, end - time.monotonic())))
            except queue.Empty:
                continue
            if error == DEFERRED:
                deferred.append(key)
                continue
            (failed.__setitem__(key, error) if error else done.append(key))
            bar.update()
    finally:
        for p in procs:
            if p.is_alive():
                killed.add(p.pid)
                p.kill()
            p.join()
        for q in (jobs, results):          # specs never taken must not hold this process open at exit
            q.cancel_join_thread()
            q.close()
        bar.close()
    # A run may have been stored in the instant before its worker was stopped, its message unread:
    # the store, not the messages, says what finished (a record it can read, not merely a file).
    finished = set(done) | set(failed)
    done += [s.key for s in specs if s.key not in finished and store.path(s).exists() and store.get(s) is not None]
    finished = set(done) | set(failed) | set(deferred)
    left = [s.key for s in specs if s.key not in finished]
    died = sorted({code for p in procs if p.pid not in killed and (code := p.exitcode)})    # joined: each is set
    if left and died and ended_early:                     # not the deadline: every worker had stopped
        failed.update({key: f"its worker process died (exit code {', '.join(map(str, died))}): out of memory, "
                            "or a crash; its error is on stderr. Exit code 1 at once is often a script with "
                            "no `if __name__ == \"__main__\":` guard, which each spawned worker imports again"
                            for key in left})
        left = []
    return {"done": done, "failed": failed, "deferred": deferred, "abandoned": left}
