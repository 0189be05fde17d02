"""Execute the book's notebooks with papermill and tidy them for committing.

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
* consecutive stream outputs of one cell to the same stream are merged into one (the
  kernel flushes a long print in pieces, at points that vary from run to run);
* a cell whose figure is drawn at the page's width (`figure_width` at least `PAGE_WIDE` px) gets the
  tag ``full-width``, which it loses when its figure narrows: on a laptop the book shows such a figure
  across the text column and the margin (book/static/posenc.css);
* the file is written by nbformat with Jupyter's 1-space indent.

Each notebook executes into a temporary copy beside it, which replaces it only when
every cell ran: a failing cell, Ctrl-C or SIGTERM leaves the stored notebook (and its
outputs) untouched, and the failing cell is named. Every path is checked before any
notebook runs. A notebook that raises makes the script exit non-zero (the remaining
notebooks still run). Wall times per notebook are printed as a table at the end.
When every chapter run succeeded, their Colab copies (notebooks/colab/, plain Markdown, no outputs)
are written again where they changed (scripts/colab_notebooks.py).
"""

from __future__ import annotations

import argparse
import base64
import os
import signal
import struct
import sys
import time
from pathlib import Path

import nbformat
import papermill as pm

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
COLAB = NOTEBOOKS / "colab"
sys.path.insert(0, str(ROOT / "scripts"))


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
        tags = [t for t in tags if t != "full-width"] + (["full-width"] if figure_width(cell) >= PAGE_WIDE else [])
        if tags:
            cell.metadata["tags"] = tags
        for output in cell.get("outputs", []):
            output.get("data", {}).pop("application/vnd.jupyter.widget-view+json", None)
        if "outputs" in cell:
            cell.outputs = merge_streams(cell.outputs)
    nbformat.write(nb, path)


#: A figure at least this wide (px) was drawn at the page's width (`posenc.plots.PAGE_WIDTH`, 7 inches at
#: 150 dpi: about 1050 px); a single heatmap (4 inches) is 600.
PAGE_WIDE = 900


def figure_width(cell) -> int:
    """The width in pixels of the widest PNG among a cell's outputs (0: none), read from its header."""
    widths = [struct.unpack(">I", base64.b64decode(out["data"]["image/png"][:100])[16:20])[0]
              for out in cell.get("outputs", []) if "image/png" in out.get("data", {})]
    return max(widths, default=0)


def merge_streams(outputs: list) -> list:
    """`outputs` with each run of consecutive stream outputs to one stream (stdout, stderr) joined."""
    merged: list = []
    for output in outputs:
        last = merged[-1] if merged else None
        if (output.get("output_type") == "stream" and last is not None and last.get("output_type") == "stream"
                and last.get("name") == output.get("name")):
            last["text"] = "".join(last["text"]) + "".join(output["text"])
        else:
            merged.append(output)
    return merged  # nbformat writes indent=1, like Jupyter


def check_paths(paths: list[Path]) -> list[str]:
    """Problems with the requested paths (missing, not a notebook, not JSON), before anything runs."""
    problems = []
    for path in paths:
        if not path.is_file():
            problems.append(f"{path}: no such file")
        elif path.suffix != ".ipynb":
            problems.append(f"{path}: not a notebook (.ipynb)")
        elif path.resolve().parent == COLAB:
            problems.append(f"{path}: a Colab copy, written by scripts/colab_notebooks.py; run its chapter")
        else:
            try:
                nbformat.read(path, as_version=4)
            except Exception as exc:  # nbformat raises several kinds for unreadable files
                problems.append(f"{path}: unreadable notebook ({type(exc).__name__}: {exc})")
    return problems


def execute(path: Path, profile: str) -> None:
    """Run `path` into a temporary copy; replace `path` with it only if every cell succeeded."""
    tmp = path.with_name(f".{path.stem}.running.ipynb")
    try:
        pm.execute_notebook(str(path), str(tmp), parameters={"profile": profile}, kernel_name="python3",
                            cwd=str(NOTEBOOKS), log_output=False, progress_bar=False)
        clean(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _sigterm(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="notebooks to run (default: notebooks/*.ipynb)")
    parser.add_argument("--profile", default="auto", choices=["auto", "ci", "paper", "full"],
                        help="value of the notebooks' `profile` parameter (default: auto)")
    args = parser.parse_args(argv)

    paths = [p.resolve() for p in args.notebooks] or sorted(NOTEBOOKS.glob("*.ipynb"))
    if not paths:
        parser.error(f"no notebooks found in {NOTEBOOKS}")
    problems = check_paths(paths)
    if problems:
        parser.error("nothing was run:\n  " + "\n  ".join(problems))
    signal.signal(signal.SIGTERM, _sigterm)
    times: dict[str, float] = {}
    failed: list[str] = []
    for path in paths:
        name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        print(f"running {name} (profile={args.profile}) ...", flush=True)
        start = time.perf_counter()
        try:
            execute(path, args.profile)
        except KeyboardInterrupt:
            print(f"interrupted during {name}: its stored outputs are unchanged", file=sys.stderr)
            return 130
        except Exception as exc:  # papermill raises PapermillExecutionError (it names the cell) and others
            print(f"FAILED: {name} (stored notebook unchanged): {type(exc).__name__}: {exc}", file=sys.stderr)
            failed.append(str(name))
        finally:
            times[str(name)] = time.perf_counter() - start

    width = max(len(n) for n in times)
    print(f"\n{'notebook':<{width}}  wall time (s)  [profile={args.profile}]")
    for name, seconds in times.items():
        status = "  FAILED" if name in failed else ""
        print(f"{name:<{width}}  {seconds:13.1f}{status}")
    print(f"{'total':<{width}}  {sum(times.values()):13.1f}")
    if failed:
        print(f"\n{len(failed)} notebook(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    if all(p.parent == NOTEBOOKS for p in paths):         # the book's chapters: their Colab copies follow them
        import colab_notebooks
        colab_notebooks.main([])
    return 0


if __name__ == "__main__":
    sys.exit(main())
