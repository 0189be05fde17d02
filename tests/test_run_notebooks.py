"""scripts/run_notebooks.py: paths are checked before anything runs, and a failing notebook keeps its outputs."""
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

import posenc

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "run_notebooks.py"


def notebook(path: Path, code: str, stored_output: str) -> Path:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(code, execution_count=1)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=stored_output)]
    params = nbformat.v4.new_code_cell('profile = "auto"', metadata={"tags": ["parameters"]})
    nb.cells = [params, cell]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_every_path_is_checked_before_any_notebook_runs(tmp_path):
    good = notebook(tmp_path / "good.ipynb", "print('ran')", "stored\n")
    before = good.read_text()
    out = subprocess.run([sys.executable, str(SCRIPT), str(good), str(tmp_path / "missing.ipynb"),
                          str(ROOT / "README.md")], capture_output=True, text=True)
    assert out.returncode == 2 and "missing.ipynb: no such file" in out.stderr and "not a notebook" in out.stderr
    assert good.read_text() == before                               # nothing ran


def test_a_failing_notebook_keeps_its_stored_outputs_and_names_the_cell(tmp_path):
    bad = notebook(tmp_path / "bad.ipynb", "raise RuntimeError('boom')", "the stored output\n")
    before = bad.read_text()
    out = subprocess.run([sys.executable, str(SCRIPT), str(bad)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "boom" in out.stderr and "unchanged" in out.stderr
    assert bad.read_text() == before
    assert not list(tmp_path.glob(".*.running.ipynb"))              # the temporary copy is gone


def test_clean_merges_a_print_the_kernel_flushed_in_pieces(tmp_path):
    path = notebook(tmp_path / "pieces.ipynb", "print('a'); print('b')", "a\n")
    nb = nbformat.read(path, as_version=4)
    out = nbformat.v4.new_output
    nb.cells[1].outputs = [out("stream", name="stdout", text="a\n"), out("stream", name="stdout", text="b\n"),
                           out("stream", name="stderr", text="w\n"), out("stream", name="stdout", text="c\n"),
                           out("execute_result", data={"text/plain": "1"}, execution_count=1),
                           out("stream", name="stdout", text="d\n")]
    nbformat.write(nb, path)
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from run_notebooks import clean
    finally:
        sys.path.remove(str(SCRIPT.parent))
    clean(path)
    kept = [(o.output_type, o.get("name"), o.get("text")) for o in nbformat.read(path, as_version=4).cells[1].outputs]
    assert kept == [("stream", "stdout", "a\nb\n"), ("stream", "stderr", "w\n"), ("stream", "stdout", "c\n"),
                    ("execute_result", None, None), ("stream", "stdout", "d\n")]   # only neighbours on one stream


def test_save_results_is_atomic_and_stays_in_its_folder(tmp_path):
    posenc.save_results("bench/x", {"a": 1}, tmp_path)
    assert json.loads((tmp_path / "bench" / "x.json").read_text())["a"] == 1
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    for name in ("../../escape", "/abs/path"):
        with pytest.raises(ValueError, match="outside"):
            posenc.save_results(name, {"a": 1}, tmp_path)
    with pytest.raises(ValueError, match="outside"):
        posenc.save_claim("../x", "ci", "c", "m", True, results_dir=tmp_path)


def test_clean_tags_a_cell_full_width_exactly_when_its_figure_is_drawn_at_the_pages_width(tmp_path):
    """After a run, a cell whose PNG is at least PAGE_WIDE px wide carries `full-width` (the book shows it
    across the margin on a laptop); one whose figure narrowed, or that draws none, loses the tag."""
    import base64
    import importlib.util
    import struct
    import zlib
    spec = importlib.util.spec_from_file_location("run_notebooks", SCRIPT)
    run_notebooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_notebooks)

    def png(width: int) -> str:
        chunk = lambda kind, data: (struct.pack(">I", len(data)) + kind + data
                                    + struct.pack(">I", zlib.crc32(kind + data)))
        raw = chunk(b"IHDR", struct.pack(">IIBBBBB", width, 1, 8, 0, 0, 0, 0))
        return base64.b64encode(b"\x89PNG\r\n\x1a\n" + raw).decode()

    nb = nbformat.v4.new_notebook()
    wide, narrow, stale = (nbformat.v4.new_code_cell("", execution_count=1) for _ in range(3))
    wide.outputs = [nbformat.v4.new_output("display_data", data={"image/png": png(1055)})]
    narrow.outputs = [nbformat.v4.new_output("display_data", data={"image/png": png(600)})]
    narrow.metadata["tags"] = ["full-width", "hide-input"]
    stale.metadata["tags"] = ["full-width"]
    nb.cells = [wide, narrow, stale]
    path = tmp_path / "figures.ipynb"
    nbformat.write(nb, path)
    run_notebooks.clean(path)
    cells = nbformat.read(path, as_version=4).cells
    assert [c.metadata.get("tags", []) for c in cells] == [["full-width"], ["hide-input"], []]
    assert [run_notebooks.figure_width(c) for c in cells] == [1055, 600, 0]
