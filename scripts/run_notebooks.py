"""Execute the book's notebooks in place with papermill and tidy them for committing.

Usage:
    python scripts/run_notebooks.py                      # every notebooks/*.ipynb
    python scripts/run_notebooks.py notebooks/03_rope.ipynb --profile ci

Each notebook runs with kernel ``python3`` and cwd ``notebooks/``, receiving the
parameter ``profile`` (``auto`` picks ``full`` on CUDA and ``ci`` otherwise). After a
run the notebook is post-processed so the book and the diffs stay clean:

* the ``injected-parameters`` cell gets the ``remove-cell`` tag and a fixed cell id
  (papermill rewrites that cell, dropping the tag and drawing a new id, every run);
* volatile metadata is stripped: papermill's notebook- and cell-level
  ``metadata.papermill``, cell ``metadata.execution`` timings and widget state
  (``kernelspec`` and ``language_info`` are kept);
* the file is written by nbformat with Jupyter's 1-space indent.

A notebook that raises makes the script exit non-zero, naming it (the remaining
notebooks still run). Wall times per notebook are printed as a table at the end.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
import papermill as pm

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


def clean(path: Path) -> None:
    """Re-tag the injected-parameters cell and strip volatile metadata, in place."""
    nb = nbformat.read(path, as_version=4)
    nb.metadata.pop("papermill", None)
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.metadata.pop("papermill", None)
        cell.metadata.pop("execution", None)
        tags = cell.metadata.pop("tags", [])  # papermill adds empty lists: drop them
        if "injected-parameters" in tags:
            tags = [t for t in tags if t != "remove-cell"] + ["remove-cell"]
            cell.id = "injected-parameters"  # papermill draws a random id each run
        if tags:
            cell.metadata["tags"] = tags
        for output in cell.get("outputs", []):
            output.get("data", {}).pop("application/vnd.jupyter.widget-view+json", None)
    nbformat.write(nb, path)  # nbformat writes indent=1, like Jupyter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to run (default: notebooks/*.ipynb)")
    parser.add_argument("--profile", default="auto", choices=["auto", "ci", "full"],
                        help="value of the notebooks' `profile` parameter (default: auto)")
    args = parser.parse_args(argv)

    paths = [p.resolve() for p in args.notebooks] or sorted(NOTEBOOKS.glob("*.ipynb"))
    if not paths:
        parser.error(f"no notebooks found in {NOTEBOOKS}")
    times: dict[str, float] = {}
    failed: list[str] = []
    for path in paths:
        name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        print(f"running {name} (profile={args.profile}) ...", flush=True)
        start = time.perf_counter()
        try:
            pm.execute_notebook(
                str(path), str(path),
                parameters={"profile": args.profile},
                kernel_name="python3",
                cwd=str(NOTEBOOKS),
                log_output=False,
                progress_bar=False,
            )
        except Exception as exc:  # papermill raises PapermillExecutionError and others
            print(f"FAILED: {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
            failed.append(str(name))
        finally:
            times[str(name)] = time.perf_counter() - start
            if path.exists():
                clean(path)

    width = max(len(n) for n in times)
    print(f"\n{'notebook':<{width}}  wall time (s)  [profile={args.profile}]")
    for name, seconds in times.items():
        status = "  FAILED" if name in failed else ""
        print(f"{name:<{width}}  {seconds:13.1f}{status}")
    print(f"{'total':<{width}}  {sum(times.values()):13.1f}")
    if failed:
        print(f"\n{len(failed)} notebook(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
