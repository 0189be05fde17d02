"""python -m posenc.bench: the cost table of every scheme and the kernel benchmarks, in one process.

    python -m posenc.bench                                   # all sections, CUDA if present
    python -m posenc.bench --only schemes xt --threads 2
    python -m posenc.bench --save results/bench/cpu.json  # what the comparison chapter shows

Sections: schemes (every registered scheme / NoPE: train step, eval tokens/s,
activation memory), press (sinusoidal, rotary, T5 and ALiBi again, every round's time kept:
chapter 15's training-speed claims, judged per round), xt (our model / x-transformers' at the same sizes and scheme),
rope (apply_rope forward+backward / references and a memory-bound floor), bias (T5 and
ALiBi bias construction / references), memory (DeBERTa gather vs naive peak, Shaw
gather vs naive saved activations), gpu (the CUDA cost table, `posenc.bench.gpu`; CUDA
only), stacking (three seeds trained one by one / as one stacked model,
`posenc.bench.stacking`; fewer steps and rounds on a CPU, where a step is long), workers (the
aggregate training steps per second of 1, 6, 10 and 16 processes sharing the device,
`posenc.bench.workers`; asked for by name only, as the GPU window does), graphs (the training
step eager / replayed as a CUDA graph, in one process and in 1 and 10, `posenc.bench.graphs`; CUDA
only, by name only).
Ratios are the result; absolute times depend on the machine named in the first line.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import torch

from .costs import shaw_memory_table
from .graphs import graph_probe
from .gpu import bias_backend_costs, gpu_scheme_costs, rope_llama_times
from ..runs.train import pick_device
from ..table import Table
from .kernels import bias_times, rope_times
from .memory import deberta_memory
from .schemes import scheme_costs, xtransformers_costs
from .stacking import stacking_costs
from .workers import worker_scaling
from .timing import machine, steady_heap

SECTIONS = ("schemes", "press", "xt", "rope", "bias", "memory", "gpu", "stacking", "workers", "graphs")
#: Press et al.'s Table 1 schemes, timed again for chapter 15's speed claims over this many rounds at least:
#: each round's ratio is one replicate of the claim's effect (`posenc.bench.schemes.round_ratios`).
PRESS_SCHEMES, PRESS_ROUNDS = ("sinusoidal", "rope", "t5", "alibi"), 42
#: What runs without --only: every section but the GPU window's probes (minutes of spawned processes).
DEFAULT = tuple(s for s in SECTIONS if s not in ("workers", "graphs"))


def press_rounds(rounds: int) -> int:
    """At least PRESS_ROUNDS rounds (or `rounds`), rounded up to a multiple of the models timed (the four schemes,
    NoPE and its two controls), so that rotated rounds put every model in every place of the turn equally often."""
    models = len(PRESS_SCHEMES) + 3
    return -(-max(rounds, PRESS_ROUNDS) // models) * models


def run_sections(only, device: str, seq_len: int, rounds: int, clock: str, done=None) -> dict:
    """{section title: Table} for the requested sections, printing each as it is done and passing the
    sections so far to `done` (so that a run cut short keeps what it finished)."""
    sizes: dict[str, Any] = dict(seq_len=seq_len, d_model=128, n_heads=4, n_layers=2, batch_size=16, rounds=rounds,
                                 device=device, clock=clock)
    how = f"best of {rounds}, {clock} time"
    on_cpu = torch.device(device).type == "cpu"         # a full-size step takes most of a second there
    stack_steps, stack_rounds = (5, min(rounds, 2)) if on_cpu else (20, rounds)
    jobs = {
        "schemes": (f"cost per scheme / NoPE (d=128, 2 layers, 4 heads, batch 16, seq {seq_len}, {how})",
                    lambda: scheme_costs(**sizes)),
        "press": (f"Press et al.'s Table 1 schemes, training step per interleaved round (d=128, 2 layers, 4 heads, "
                  f"batch 16, seq {seq_len}, {press_rounds(rounds)} rounds, each started by the next model, "
                  f"{clock} time)",
                  lambda: scheme_costs(PRESS_SCHEMES, **{**sizes, "rounds": press_rounds(rounds), "rotate": True})),
        "xt": (f"our step time / x-transformers' (same sizes and scheme, {how})",
               lambda: xtransformers_costs(**sizes)),
        "rope": ("apply_rope forward+backward, q and k [8, 8, 512, 64] float32, one thread, best of 30 (CPU time)",
                 lambda: rope_times()),
        "bias": ("building a [8, 1024, 1024] bias, median of 20", lambda: bias_times()),
        "memory": ("DeBERTa c2p+p2c peak, gather vs naive (1 head, d_h 64, k 256); Shaw saved bytes",
                   lambda: {"deberta": deberta_memory(device=device), "shaw": shaw_memory_table([128, 256, 512, 1024])}),
        "gpu": ("the CUDA cost table (bf16): schemes at d=512, 8 heads, 4 layers, batch 8, seq 1024 and 4096; "
                "RoPE at LLaMA's [1, 32, n, 128], n = 2048 and 16384; ALiBi and T5 through FlexAttention or the "
                "[H, n, n] bias, batch 1, n = 4096 and 16384",
                lambda: {"rope": lambda: rope_llama_times(device=device),      # tables saved one by one,
                         "bias": lambda: bias_backend_costs(device=device),    # the quickest first
                         "schemes": lambda: gpu_scheme_costs(device=device)}),
        "stacking": (f"3 seeds of a causal LM (d=128, 4 layers, 4 heads, batch 32, seq 128, corpus) trained {stack_steps} "
                     f"steps one by one / as one stacked model (torch.func.vmap), best of {stack_rounds}, {clock} time",
                     lambda: stacking_costs(("nope", "rope", "alibi"), steps=stack_steps, rounds=stack_rounds, device=device,
                                            clock=clock)),
        "workers": ("aggregate training steps/s of W processes sharing the device, each stepping a causal LM (RoPE, "
                    "d=128, 4 layers, batch 32, seq 128, corpus) for 6 s after a barrier",
                    lambda: worker_scaling((1, 2) if on_cpu else (1, 6, 10, 16), seconds=2.0 if on_cpu else 6.0,
                                           device=device)),
        "graphs": ("the training step eager / replayed as a CUDA graph (posenc.runs.graphed): a causal LM (d=128, "
                   "4 layers, 4 heads, batch 32, seq 128, corpus, bf16), ms per step in one process, then aggregate "
                   "steps/s of 1 and 10 processes for 6 s", lambda: graph_probe(device=device)),
    }
    out: dict[str, Any] = {}
    for name in only:
        title, job = jobs[name]
        if name in ("rope", "bias") and device != "cpu":
            print(f"\n== {name}: skipped (a CPU benchmark)")
            continue
        if name in ("gpu", "graphs") and torch.device(device).type != "cuda":
            print(f"\n== {name}: skipped (a CUDA benchmark)")
            continue
        if name == "xt" and importlib.util.find_spec("x_transformers") is None:   # a GPU image may lack it
            print(f"\n== {name}: skipped (x-transformers is not installed: pip install x-transformers)")
            continue
        print(f"\n== {title}", flush=True)
        run_section(name, title, job(), out, done)
    return out


def _printable(table: Table) -> Table:
    """`table` without its list columns (every round's time): they are stored, not printed."""
    return Table({k: v for k, v in r.items() if not isinstance(v, list)} for r in table)


def run_section(name: str, title: str, result, out: dict, done=None) -> None:
    """Put section `name`'s `result` into `out` and pass `out` to `done`: a Table, a dict of Tables, or a dict
    of callables making them, each made, kept and passed to `done` in turn (a window cut short keeps those)."""
    if isinstance(result, dict) and all(callable(v) for v in result.values()):
        out[name] = {"title": title, "rows": {}}
        for sub, make in result.items():
            table = make()
            print(f"-- {sub}", table.round(3), sep="\n", flush=True)
            out[name]["rows"][sub] = list(table)
            if done is not None:
                done(out)
        return
    for sub, table in (result.items() if isinstance(result, dict) else [(None, result)]):
        print(f"-- {sub}" if sub else "", _printable(table).round(3), sep="\n" if sub else "", flush=True)
    out[name] = {"title": title, "rows": {k: list(v) for k, v in result.items()} if isinstance(result, dict)
                 else list(result)}
    if done is not None:
        done(out)


def positive_int(text: str) -> int:
    """argparse type: an int >= 1 (argparse names the option in its error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive int; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int; got {value}")
    return value


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", choices=SECTIONS, default=list(DEFAULT))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch CPU threads (default: 1 on CPU, where the CPU-time clock is steadiest on a shared machine)")
    p.add_argument("--clock", choices=["wall", "cpu"], default=None,
                   help="default: cpu (this process's CPU time) with one CPU thread, else wall")
    p.add_argument("--seq-len", type=positive_int, default=256)
    p.add_argument("--rounds", type=positive_int, default=5)
    p.add_argument("--save", type=Path, default=None,
                   help="write the tables and the machine line as JSON (sections not rerun are kept if the machine matches)")
    a = p.parse_args(argv)
    try:
        pick_device(a.device)
    except ValueError as err:
        p.error(f"--device: {err}")
    if a.save:
        problem = check_writable(a.save)
        if problem:                                   # say so before the benchmark runs, not after
            p.error(f"--save {a.save}: {problem}")
    if a.threads is None and a.device == "cpu":
        a.threads = 1
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    if a.clock is None:
        a.clock = "cpu" if a.device == "cpu" and torch.get_num_threads() == 1 else "wall"
    where = machine(a.device) + ("; glibc heap kept (no page faults)" if steady_heap() else "")
    print(where)
    keep = (lambda sections: save({"machine": where, "sections": dict(sections)}, a.save)) if a.save else None
    return {"machine": where, "sections": run_sections(a.only, a.device, a.seq_len, a.rounds, a.clock, keep)}


def check_writable(path: Path) -> str | None:
    """Why `path` cannot be written (or read, if it exists), or None."""
    path = Path(path)
    if path.exists() and (path.is_dir() or not os.access(path, os.R_OK | os.W_OK)):
        return "exists and is not a readable, writable file"
    folder = next((f for f in [path.parent, *path.parent.parents] if f.exists()), None)
    if folder is None or not folder.is_dir():
        return f"{folder} is not a folder"
    try:                                              # a real probe: permissions alone do not tell (root, /proc)
        import tempfile
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".posenc-probe-"):
            pass
    except OSError as err:
        return f"cannot create files in {folder} ({err.strerror})"
    if path.exists():
        try:
            json.loads(path.read_text())
        except ValueError as err:
            return f"holds no valid JSON ({err}); delete it or choose another file"
    return None


def save(out: dict, path: Path) -> None:
    """Write `out` as JSON atomically, keeping what an earlier file holds that was not rerun (same machine line
    only): its other sections, and of a section made of tables (gpu) the tables not made again, so that a
    window cut short does not replace a whole table with part of it."""
    from ..runs.store import atomic_write
    if path.exists():
        old = json.loads(path.read_text())
        if old.get("machine") == out["machine"]:
            merged = dict(old["sections"])
            for name, new in out["sections"].items():
                before = merged[name] if isinstance(merged.get(name), dict) else {}
                if isinstance(before.get("rows"), dict) and isinstance(new, dict) and isinstance(new.get("rows"), dict):
                    new = {**new, "rows": {**before["rows"], **new["rows"]}}
                merged[name] = new
            out["sections"] = merged
    atomic_write(path, json.dumps(out, indent=1) + "\n")
    print(f"\nsaved {path}")


if __name__ == "__main__":
    main()
