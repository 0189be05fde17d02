"""Rehearse the `full` tier's chapters on a CPU, before a GPU window spends its minutes on it.

    python scripts/rehearse_full.py                          # every chapter with missing `full` runs
    python scripts/rehearse_full.py --chapters 07_t5 14_alibi --keep /tmp/rehearsal
    python scripts/rehearse_full.py --chapters 07_t5 --forget  # its stored runs set aside in the copy first

In a throwaway copy of the repository, every missing `full` run is trained for 3 steps (its
fine-tunes for 2) on the CPU and stored under its real key, its machine line saying REHEARSAL.
The chapters are then executed with `auto`, which now picks `full`, so every line of a chapter
that only runs on `full` records runs once. The numbers mean nothing; what counts is that every
chapter executes. The copy is deleted unless --keep names a folder for it, and nothing is written
to this checkout. It exits non-zero when a chapter fails. The whole tier takes about an hour on
two cores (its evaluations at 8L dominate); one chapter takes seconds to minutes.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("posenc", "scripts", "notebooks", "results", "book", "_config.yml", "_toc.yml")
STEPS, FINE_TUNE_STEPS = 3, 2
MARK = "REHEARSAL (a 3-step CPU run stored under a full spec's key)"


def shrunk(spec):
    """`spec` with 3 training steps (warm-up 1, a loss every step) and 2 steps for any fine-tune or recovery chunk."""
    train = dict(spec.train, steps=STEPS, warmup=1, log_every=1)
    options = {k: (FINE_TUNE_STEPS if k in ("ft_steps", "chunk") else v) for k, v in spec.options.items()}
    return spec.replace(train=train, options=options)


def fill(chapters) -> int:
    """Train each missing `full` run of `chapters` shrunk and store it under its real key (in this process's
    repository: the copy). Returns how many were stored."""
    import torch
    from posenc.runs.__main__ import collect
    from posenc.runs.execute import execute
    from posenc.runs.store import Store
    store, scratch = Store("full"), Store("full", tempfile.mkdtemp(prefix="posenc-rehearsal-"))
    todo = collect(chapters, "full")
    for i, (chapter, spec) in enumerate(todo, 1):
        small = shrunk(spec)
        record = execute(small, scratch, "cpu")
        kept = {k: v for k, v in record.items() if k not in ("key", "spec", "profile", "_weights_path")}
        state = torch.load(scratch.weights_path(small), weights_only=True) if spec.keep_weights else None
        store.put(spec, {**kept, "machine": MARK}, state)
        print(f"[{i}/{len(todo)}] {chapter}: {spec.scheme} {spec.task} ({spec.recipe})", flush=True)
    return len(todo)


def forget(chapters) -> int:
    """Delete the stored `full` records (and weights) of `chapters` in this process's repository (the copy), so that a
    chapter whose runs a GPU made can be rehearsed again. Returns how many records went."""
    from posenc.runs.plans import plan
    from posenc.runs.store import Store
    store, gone = Store("full"), 0
    for chapter in chapters:
        for _, spec in plan(chapter, "full"):
            for path in (store.path(spec), store.weights_path(spec)):
                if path.exists():
                    path.unlink()
                    gone += path.suffix == ".json"
    return gone


def notebooks_of(chapters) -> list[str]:
    """The notebooks that show `chapters`, the findings page last. A plan without a notebook of its own is shown
    by the notebook of its number (15_length_generalisation by 15_comparison, 16_passkey by 16_rope_extension)."""
    found = set()
    for c in chapters:
        own = ROOT / "notebooks" / f"{c}.ipynb"
        found.add(own if own.exists() else sorted((ROOT / "notebooks").glob(f"{c.split('_')[0]}_*.ipynb"))[0])
    return [f"notebooks/{p.name}" for p in sorted(found)] + ["notebooks/findings.ipynb"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chapters", nargs="+", default=None, help="default: every chapter with missing full runs")
    parser.add_argument("--keep", type=Path, default=None, help="an empty or new folder to keep the copy in")
    parser.add_argument("--forget", action="store_true",
                        help="in the copy, delete the chapters' stored full runs first, and rehearse them all")
    parser.add_argument("--fill-only", action="store_true", help=argparse.SUPPRESS)    # the copy's own step
    args = parser.parse_args(argv)
    if args.fill_only:
        from posenc.runs.plans import names
        if args.forget:
            forget(args.chapters or names())
        fill(args.chapters or names())
        return 0
    from posenc.runs.__main__ import collect
    from posenc.runs.plans import names
    chapters = args.chapters or sorted({c for c, _ in collect(names(), "full")})
    unknown = sorted(set(chapters) - set(names()))
    if unknown:
        parser.error(f"--chapters: unknown {unknown}; choose from {', '.join(names())}")
    if args.keep is not None and args.keep.exists() and any(args.keep.iterdir()):
        parser.error(f"--keep {args.keep}: the folder is not empty")
    copy = args.keep or Path(tempfile.mkdtemp(prefix="posenc-rehearsal-repo-"))
    try:
        for name in COPIED:
            src, dst = ROOT / name, copy / name
            if src.is_dir():
                shutil.copytree(src, dst, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "_build"))
            else:
                shutil.copy2(src, dst)
        env = {**os.environ, "PYTHONPATH": str(copy)}           # the copy's posenc, hence the copy's store
        script = copy / "scripts" / "rehearse_full.py"
        subprocess.run([sys.executable, str(script), "--fill-only", *(["--forget"] if args.forget else []),
                        "--chapters", *chapters], cwd=copy, env=env, check=True)
        notebooks = notebooks_of(chapters)
        run = subprocess.run([sys.executable, "scripts/run_notebooks.py", *notebooks], cwd=copy, env=env)
        # a chapter names the machine of the runs it shows: the rehearsal's mark means it read the `full` records
        not_full = [nb for nb in notebooks[:-1] if "REHEARSAL" not in (copy / nb).read_text()]
        print(f"rehearsal of {len(chapters)} chapter(s) in {copy}: "
              + ("some notebooks FAILED (above)" if run.returncode else
                 f"{', '.join(not_full)} did not show the full runs" if not_full else
                 "every chapter executed and showed its full runs"))
        return run.returncode or int(bool(not_full))
    finally:
        if args.keep is None:
            shutil.rmtree(copy, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
