"""The chapters' Colab copies (scripts/colab_notebooks.py): current, the chapters' code, and plain Markdown."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import colab_notebooks  # noqa: E402

CHAPTERS = sorted((ROOT / "notebooks").glob("*.ipynb"))
#: What Colab would show as raw text: a role, a directive's fence, a target label, an equation label.
MYST = re.compile(r"\{[\w:-]+\}`|^(?:```+|:::+)\{|^\([\w:-]+\)=|\$\$[ \t]*\([\w:-]+\)", re.M)


def test_every_copy_is_current():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "colab_notebooks.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: p.stem)
def test_a_copy_runs_its_chapters_code_and_shows_no_myst(chapter):
    book, copy = (json.loads(p.read_text()) for p in (chapter, ROOT / "notebooks" / "colab" / chapter.name))
    code = [(c["source"], c["metadata"].get("tags")) for c in book["cells"] if c["cell_type"] == "code"
            and "injected-parameters" not in c["metadata"].get("tags", [])]
    assert [(c["source"], c["metadata"].get("tags")) for c in copy["cells"] if c["cell_type"] == "code"] == code
    assert all(c["outputs"] == [] and c["execution_count"] is None for c in copy["cells"] if c["cell_type"] == "code")
    markdown = "\n".join("".join(c["source"]) for c in copy["cells"] if c["cell_type"] == "markdown")
    assert not MYST.search(markdown), MYST.search(markdown)
    assert "colab-badge" not in markdown and "glue:" not in markdown


def _chapter(tmp_path, name, cells):
    path = tmp_path / f"{name}.ipynb"
    nb = {"cells": [{"cell_type": kind, "id": f"c{i}", "metadata": meta, "source": text,
                     **({"outputs": [{"output_type": "stream", "name": "stdout", "text": "x"}],
                         "execution_count": 3} if kind == "code" else {})}
                    for i, (kind, text, meta) in enumerate(cells)],
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                       "language_info": {"name": "python", "version": "3.11.7"}},
          "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(nb))
    return path


DEMO = """# A demo chapter

[![Open In Colab](../book/images/colab-badge.svg)](https://colab.research.google.com/github/a/b/blob/main/notebooks/colab/03_demo.ipynb)

:::{admonition} Key result
:class: tip
```{glue:md} key_result
:format: myst
```
:::

Vaswani et al. {cite}`vaswani2017attention` used sines; see also {cite}`vaswani2017attention,su2021roformer`.

```{figure} ../book/images/hooks/qk.svg
:alt: The diagram
:name: fig-demo

Where position enters, $R_i$.
```

$$
a = b
$$ (eq-demo)

By {eq}`eq-demo` and {numref}`fig-demo` (and {numref}`Figure %s <fig-drawn>`), as in {doc}`04_other`.

(sec-demo)=
## The section

Back to {ref}`sec-demo`; {ref}`other-sec`.

:::{dropdown} Details
:open:
Folded text.
:::

```{figure} ../book/images/hooks/qk.svg
:alt: not numbered: no caption
```

In chapter 04, {eq}`eq-other`.
"""


def test_myst_becomes_plain_markdown_with_the_books_numbers(tmp_path):
    demo = _chapter(tmp_path, "03_demo", [
        ("markdown", DEMO, {}),
        ("code", 'profile = "ci"', {"tags": ["injected-parameters", "remove-cell"]}),
        ("code", "plot()", {"mystnb": {"figure": {"caption": "Drawn, as in {numref}`fig-demo`.", "name": "fig-drawn"}},
                            "tags": ["hide-input"]}),
    ])
    other = _chapter(tmp_path, "04_other", [("markdown", "# The other chapter\n\n(other-sec)=\n### Far away\n\n"
                                                         "$$\nc = d\n$$ (eq-other)\n", {})])
    book = colab_notebooks.Book([demo, other])
    nb = book.copy("03_demo")
    kinds = [c["cell_type"] for c in nb["cells"]]
    assert kinds == ["markdown", "code", "markdown"]                    # the drawn figure's caption follows its cell
    text = "".join(nb["cells"][0]["source"])
    colab = "https://colab.research.google.com/github/posenc/posenc/blob/main/notebooks/colab/04_other.ipynb"
    assert text.startswith("# A demo chapter\n\nVaswani et al. [[2017](https://arxiv.org/abs/1706.03762)] used sines")
    assert ("see also [[Vaswani et al., 2017](https://arxiv.org/abs/1706.03762); "
            "[Su et al., 2021](https://arxiv.org/abs/2104.09864)].") in text
    assert ("![The diagram](https://cdn.jsdelivr.net/gh/posenc/posenc@main/book/images/hooks/qk.svg)\n\n"
            "**Fig. 3.1.** Where position enters, $R_i$.") in text
    assert "$$\na = b\n\\tag{3.1}\n$$" in text
    assert f"By (3.1) and Fig. 3.1 (and Figure 3.2), as in [The other chapter]({colab})." in text
    assert "## The section\n\nBack to *The section*; [Far away](" + colab + ")." in text
    assert "**Details**\n\nFolded text.\n" in text and ":open:" not in text
    assert text.endswith("![not numbered: no caption](https://cdn.jsdelivr.net/gh/posenc/posenc@main/book/images/"
                         f"hooks/qk.svg)\n\nIn chapter 04, [(4.1)]({colab}).\n")
    assert "Key result" not in text and "colab-badge" not in text
    assert "".join(nb["cells"][2]["source"]) == "**Fig. 3.2.** Drawn, as in Fig. 3.1.\n"
    code = nb["cells"][1]
    assert code["outputs"] == [] and code["execution_count"] is None and code["metadata"]["tags"] == ["hide-input"]
    assert "version" not in nb["metadata"]["language_info"]


@pytest.mark.parametrize("markdown, message", [
    ("# T\n\n{term}`x`", r"role \{term\}"),
    ("# T\n\n```{note}\nhi\n```", "MyST that has no plain form"),
    ("# T\n\n{cite}`nobody2099`", "no reference 'nobody2099'"),
    ("# T\n\n{eq}`missing`", "no equation labelled 'missing'"),
    ("# T\n\n{doc}`99_none`", "no chapter '99_none'"),
])
def test_what_has_no_plain_form_stops_the_script_with_the_cell_named(tmp_path, markdown, message):
    book = colab_notebooks.Book([_chapter(tmp_path, "03_demo", [("markdown", "# Title\n", {}),
                                                                 ("markdown", markdown, {})])])
    with pytest.raises(ValueError, match=message) as err:
        book.copy("03_demo")
    assert "03_demo.ipynb cell 1 (c1)" in str(err.value)


def test_every_badge_opens_the_chapters_copy():
    for chapter in CHAPTERS:
        first = "".join(json.loads(chapter.read_text())["cells"][0]["source"])
        assert f"/notebooks/colab/{chapter.name})" in first, chapter.name
