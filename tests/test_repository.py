"""The repository address lives in _config.yml alone: badges, install cells and the README agree with it."""
import inspect
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import posenc

ROOT = Path(__file__).resolve().parent.parent


def test_every_badge_and_install_cell_uses_the_configured_repository():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "set_repository.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_the_colab_badge_image_is_shipped_with_the_book():
    assert (ROOT / "book" / "images" / "colab-badge.svg").is_file()
    first = (ROOT / "notebooks" / "02_sinusoidal.ipynb").read_text()
    assert "../book/images/colab-badge.svg" in first and "colab-badge.svg)" in first
    assert "colab.research.google.com/assets" not in first          # no hot-linked image


# What a Colab kernel does with the install cell, without the network: `git clone` is replaced by a copy of the
# package beside the committed store, `pip` by nothing. The kernel must then import posenc from the clone, find
# the clone's results/ as its store, and read a chapter that trains nothing (chapter 15) from the committed runs.
COLAB = r'''
import importlib.util, json, os, shutil, subprocess, sys
root, cell = sys.argv[1], open(sys.argv[2]).read()
calls, real_find, real_run = [], importlib.util.find_spec, subprocess.run

def run(cmd, check=False, **kw):
    calls.append(cmd)
    if cmd[:2] == ["git", "clone"]:
        shutil.copytree(os.path.join(root, "posenc"), os.path.join(cmd[-1], "posenc"))
        os.symlink(os.path.join(root, "results"), os.path.join(cmd[-1], "results"))
    return subprocess.CompletedProcess(cmd, 0)

importlib.util.find_spec = lambda name, *a: None if name == "posenc" else real_find(name, *a)
subprocess.run = run
exec(cell.split("\n\n")[0])                     # the install lines, before the chapter's own imports
importlib.util.find_spec, subprocess.run = real_find, real_run
import posenc, posenc.runs
from posenc.runs.store import results_root
runs = posenc.runs.chapter("15_comparison", "auto", load_only=True)
print(json.dumps({"calls": calls, "file": posenc.__file__, "results": str(results_root()), "profile": runs.profile,
                  "records": len(runs)}))
'''


def test_the_install_cell_clones_the_repository_and_the_chapter_reads_its_committed_runs(tmp_path):
    import json
    import yaml
    nb = json.loads((ROOT / "notebooks" / "15_comparison.ipynb").read_text())
    cell = next("".join(c["source"]) for c in nb["cells"] if "find_spec(\"posenc\")" in "".join(c["source"]))
    (tmp_path / "cell.py").write_text(cell)
    (tmp_path / "colab.py").write_text(COLAB)
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("PYTHONPATH", "POSENC_CI_STORE")}
    out = subprocess.run([sys.executable, str(tmp_path / "colab.py"), str(ROOT), str(tmp_path / "cell.py")],
                         cwd=tmp_path, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    config = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]
    clone = tmp_path / "posenc-book"
    assert seen["calls"] == [["git", "clone", "-q", "--depth", "1", "--branch", config.get("branch", "main"),
                              config["url"].rstrip("/"), "posenc-book"],
                             [sys.executable, "-m", "pip", "install", "-q", "-e", "posenc-book[notebooks]"]]
    assert seen["file"] == str(clone / "posenc" / "__init__.py")          # the clone's package, not this checkout's
    assert seen["results"] == str(clone / "results")                       # and the clone's committed store
    assert seen["profile"] in ("ci", "paper", "full") and seen["records"] > 0


# A chapter's glue for the book's pages does nothing where myst-nb is absent (Colab): the findings page runs there
def test_glue_stores_for_the_book_and_does_nothing_without_myst_nb(monkeypatch):
    import myst_nb
    from posenc.book import glue
    stored = []
    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display=True: stored.append((name, value, display)))
    assert glue("a", 1) is True and stored == [("a", 1, False)]       # glued, not displayed in the chapter
    monkeypatch.setitem(sys.modules, "myst_nb", None)                  # `import myst_nb` now fails, as on Colab
    assert glue("b", 2) is False and stored == [("a", 1, False)]


def _chapter_cells():
    """("<notebook> cell <i>", cell) for every cell of every chapter, in order."""
    import json
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            yield f"{path.name} cell {i}", cell


def _wide(where: str, text: str) -> list[str]:
    return [f"{where}: {line}" for line in text.splitlines() if len(line) > 79]


def test_no_code_line_a_reader_can_open_is_wider_than_the_pages_column():
    """The book's CSS fits 79 characters of code in a laptop's text column (book/static/posenc.css); a longer
    line scrolls sideways, in a shown cell or a folded (hide-input) one once unfolded, and in the Colab copy.
    Only removed cells, which no page shows, may be wider."""
    wide = []
    for where, cell in _chapter_cells():
        if cell["cell_type"] == "code" and not set(cell["metadata"].get("tags", [])) & {"remove-input", "remove-cell"}:
            wide += _wide(where, "".join(cell["source"]))
    assert not wide, "\n".join(wide)


def test_printed_text_a_page_shows_wraps_or_fits_the_pages_column():
    """A shown cell whose printed text runs past 79 characters is tagged `wrap-output` (book/static/posenc.css
    wraps it at the page's width); otherwise its last words hide behind a scrollbar. Folded outputs (printed
    tables, which keep their columns and scroll in their own box) are exempt."""
    unwrapped = []
    for where, cell in _chapter_cells():
        tags = set(cell["metadata"].get("tags", []))
        if cell["cell_type"] == "code" and not tags & {"wrap-output", "hide-output", "hide-cell", "remove-output", "remove-cell"}:
            unwrapped += _wide(where, "".join("".join(out["text"]) for out in cell.get("outputs", [])
                                              if out["output_type"] == "stream"))
    assert not unwrapped, "\n".join(unwrapped)


def _fenced_code(markdown: str) -> str:
    """The lines inside fenced code; a fence opening a directive (`{figure}`, `{eval-rst}`, `{glue:md}`, ...)
    holds no code."""
    code, fence = [], None                                   # the open fence's info string, or None
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fence = line.strip()[3:] if fence is None else None
        elif fence is not None and not fence.startswith("{"):
            code.append(line)
    return "\n".join(code)


def test_code_blocks_of_the_books_pages_fit_the_pages_column():
    """Fenced code in book/*.md (the opening page's commands and example) and in a chapter's Markdown scrolls
    sideways past 79 characters like a code cell."""
    wide = [line for path in sorted((ROOT / "book").rglob("*.md")) for line in _wide(path.name, _fenced_code(path.read_text()))]
    for where, cell in _chapter_cells():
        if cell["cell_type"] == "markdown":
            wide += _wide(where, _fenced_code("".join(cell["source"])))
    assert not wide, "\n".join(wide)


def test_package_source_a_chapter_lists_fits_the_pages_column():
    """A chapter shows its scheme's implementation with `listing(...)` (posenc.book), in a folded output; those
    objects are laid out within 79 characters in the package so the listing does not scroll sideways either
    (nbval keeps the stored listing equal to the package's source)."""
    wide, cells = [], 0
    for where, cell in _chapter_cells():
        if cell["cell_type"] != "code" or "listing(" not in "".join(cell["source"]):
            continue
        shown = ["".join(out["data"]["text/plain"]) for out in cell.get("outputs", [])
                 if "text/markdown" in out.get("data", {})]
        assert shown, f"{where} lists source but has no stored listing"
        assert cell["metadata"].get("mystnb", {}).get("code_prompt_show") == "Show the source", \
            f"{where}: its fold should say what it holds (mystnb code_prompt_show)"
        cells += 1
        wide += _wide(where, "".join(shown))
    assert cells >= 20 and not wide, "\n".join(wide)


def test_every_fold_says_what_it_holds():
    """A folded cell (hide-input, hide-output, hide-cell) opens with a button that names its content ("Show the
    code for this figure", "Show every verdict with its numbers"), not myst-nb's generic "Show code cell source",
    and closes with the same words after "Hide"."""
    generic = {f"Show code cell {kind}" for kind in ("source", "outputs", "content")}
    bad, folds = [], 0
    for where, cell in _chapter_cells():
        if not any(tag.startswith("hide-") for tag in cell["metadata"].get("tags", [])):
            continue
        folds += 1
        prompts = cell["metadata"].get("mystnb", {})
        show, hide = prompts.get("code_prompt_show", ""), prompts.get("code_prompt_hide", "")
        if not show.startswith("Show ") or show in generic or hide != "Hide " + show[len("Show "):]:
            bad.append(f"{where}: show {show!r}, hide {hide!r}")
    assert folds >= 150 and not bad, "\n".join(bad)


def test_a_listing_shows_the_objects_source_as_python_markdown_and_refuses_what_has_none():
    from posenc.alibi import ALiBi, alibi_slopes
    from posenc.book import listing
    shown = listing(alibi_slopes, ALiBi.score_mod)
    first, method = inspect.getsource(alibi_slopes), inspect.getsource(ALiBi.score_mod)
    assert repr(shown) == first.rstrip("\n") + "\n\n\n" + textwrap.dedent(method)   # the method starts at column 0
    assert shown._repr_markdown_() == "```python\n" + repr(shown) + "```\n"
    with_fence = listing(posenc.book.Listing)                        # its docstring holds a ``` run: a longer fence
    assert with_fence._repr_markdown_().startswith("````python\n") and with_fence._repr_markdown_().endswith("\n````\n")
    with pytest.raises(ValueError, match="at least one"):
        listing()
    with pytest.raises(TypeError, match=r"objects\[1\] must be a function, class or method.*got int 3"):
        listing(alibi_slopes, 3)


def test_a_figure_drawn_at_the_pages_width_takes_the_margin_on_a_laptop():
    """A cell whose figure is drawn at `PAGE_WIDTH` (about 1050 px at 150 dpi) is tagged `full-width`: on a
    laptop it spans the text column and the right margin (book/static/posenc.css), so its 8-pt text shows at
    14 px instead of 10.5. A narrower figure (a single heatmap) keeps the column, and so does any other cell.
    scripts/run_notebooks.py sets the tag from the figure's width (`figure_width`) when it runs a chapter."""
    import importlib.util
    import json
    spec = importlib.util.spec_from_file_location("run_notebooks", ROOT / "scripts" / "run_notebooks.py")
    run_notebooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_notebooks)
    wide, tagged = [], []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            if run_notebooks.figure_width(cell) >= run_notebooks.PAGE_WIDE:
                wide.append(f"{path.name} cell {i}")
            if "full-width" in cell.get("metadata", {}).get("tags", []):
                tagged.append(f"{path.name} cell {i}")
    assert len(wide) >= 40 and wide == tagged
    css = (ROOT / "book" / "static" / "posenc.css").read_text()
    assert "div.cell.tag_full-width { width: 100%; max-width: 100%; }" in css     # not between 992 and 1200 px
