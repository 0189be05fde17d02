"""Write each chapter as Colab shows it: notebooks/colab/<chapter>.ipynb, plain Markdown and no outputs.

    python scripts/colab_notebooks.py            # after a chapter's text or code changes
    python scripts/colab_notebooks.py --check    # exit 1 if a copy is missing or stale (a test runs this)

The book's notebooks are written in MyST: `{cite}`, `{eq}` and `{doc}` roles, figure and admonition
directives, labelled equations. Jupyter Book renders them; Colab's Markdown shows them as raw text. The
*Open in Colab* badges open these copies instead, in which every cell is the book's, in the same order,
with the Markdown made plain:

- citations become author-year links ("Su et al., 2021"), `{doc}` links open the other chapter's copy on
  Colab, `{ref}` becomes the section's title;
- figures, equations and their references get the book's numbers ("Fig. 11.1", "(11.3)", per chapter,
  as `book/_ext/chapter_numbers.py` numbers them; another chapter's equation links its copy), each
  diagram an image from the repository (through jsDelivr, which serves an SVG as an image);
- a captioned figure drawn by a code cell gets its caption in a Markdown cell after it;
- the key-result box and the badge are dropped (the key-result cell prints the key result);
  dropdowns become a bold title and their text.

Code cells are the book's, without outputs and without papermill's injected-parameters cell (which would
override the `profile` a reader sets): a reader runs them (the install cell clones the repository and
the chapter reads its committed runs). Markdown that this script cannot make plain (a role or
directive it does not know) stops it with the cell named, so a new construct is handled here, not shown
raw on Colab.
"""
from __future__ import annotations

import argparse
import copy
import functools
import importlib.util
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
OUT = NOTEBOOKS / "colab"
sys.path.insert(0, str(ROOT / "scripts"))
from set_repository import BADGE_RE, colab_url, repository  # noqa: E402


@functools.cache
def _numbering():
    """The Sphinx extension that numbers the book (book/_ext/chapter_numbers.py), loaded once."""
    spec = importlib.util.spec_from_file_location("chapter_numbers", ROOT / "book/_ext/chapter_numbers.py")
    if spec is None or spec.loader is None:
        raise ImportError("book/_ext/chapter_numbers.py cannot be loaded")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _chapter_number(docname: str) -> str | None:
    """The book's per-chapter prefix ("11", "7b", "S")."""
    return _numbering().chapter_number(docname)


# --------------------------------------------------------------------------------------- references
def citations() -> dict[str, tuple[str, str | None]]:
    """{key: ("Su et al., 2021", url or None)} from book/references.bib."""
    from pybtex.database import parse_file
    out = {}
    for key, entry in parse_file(str(ROOT / "book/references.bib")).entries.items():
        names = [" ".join(p.last_names).strip("{}") for p in entry.persons.get("author", [])]
        who = (names[0] if len(names) == 1 else f"{names[0]} and {names[1]}" if len(names) == 2
               else f"{names[0]} et al.")
        doi = entry.fields.get("doi")
        url = entry.fields.get("url") or (f"https://doi.org/{doi}" if doi else None)
        out[key] = (f"{who}, {entry.fields.get('year', 'n.d.')}", url)
    return out


def _markdown(cell) -> str:
    return "".join(cell["source"])


def _title(nb: dict) -> str:
    """A notebook's first heading."""
    for cell in nb["cells"]:
        m = re.search(r"^# (.+)$", _markdown(cell), re.M) if cell["cell_type"] == "markdown" else None
        if m:
            return m.group(1).strip()
    raise ValueError("a notebook without a '# ' title")


FIGURE_RE = re.compile(r"^(?P<fence>```+|:::+)\{(?P<kind>figure|glue:figure)\}[ \t]*(?P<arg>\S*)[ \t]*\n"
                       r"(?P<options>(?:[ \t]*:[\w-]+:[^\n]*\n)*)\n?(?P<caption>.*?)\n?^(?P=fence)[ \t]*$",
                       re.M | re.S)
EQUATION_RE = re.compile(r"\$\$[ \t]*\((?P<label>[\w:-]+)\)[ \t]*$", re.M)
LABEL_RE = re.compile(r"^\((?P<label>[\w:-]+)\)=[ \t]*\n", re.M)


def _options(block: str) -> dict:
    return dict(re.findall(r"^[ \t]*:([\w-]+):[ \t]*(.*)$", block, re.M))


class Book:
    """What the references of the chapters point to: titles, section labels, figure and equation numbers."""

    def __init__(self, paths: list[Path]):
        self.url, self.slug, self.branch = repository()
        self.cites = citations()
        self.notebooks = {p.stem: json.loads(p.read_text()) for p in paths}
        self.titles = {name: _title(nb) for name, nb in self.notebooks.items()}
        self.sections, self.figures, self.equations, self.number = {}, {}, {}, {}
        for name, nb in self.notebooks.items():
            prefix = _chapter_number(f"notebooks/{name}")
            self.number[name] = number = (lambda n, prefix=prefix: f"{prefix}.{n}" if prefix else str(n))
            figures = equations = 0
            for cell in nb["cells"]:
                text = _markdown(cell)
                if cell["cell_type"] == "markdown":
                    for m in LABEL_RE.finditer(text):
                        heading = re.match(r"#+ (.+)", text[m.end():].lstrip("\n"))
                        self.sections[m["label"]] = (name, heading.group(1).strip() if heading else m["label"])
                    for m in FIGURE_RE.finditer(text):
                        if not m["caption"].strip():
                            continue
                        figures += 1
                        self.figures[_options(m["options"]).get("name") or f"{name}#{figures}"] = number(figures)
                    for m in EQUATION_RE.finditer(text):
                        equations += 1
                        self.equations[m["label"]] = (name, number(equations))
                elif cell.get("metadata", {}).get("mystnb", {}).get("figure", {}).get("caption"):
                    figures += 1
                    figure = cell["metadata"]["mystnb"]["figure"]
                    self.figures[figure.get("name") or f"{name}#{figures}"] = number(figures)

    def colab(self, name: str) -> str:
        return colab_url(self.slug, self.branch, f"{name}.ipynb")

    def raw(self, path: str) -> str:
        """A repository file by address: jsDelivr's mirror of the repository, which serves an SVG as an image
        (raw.githubusercontent.com serves it as text/plain, which a browser will not draw)."""
        return f"https://cdn.jsdelivr.net/gh/{self.slug}@{self.branch}/{path}"

    # ------------------------------------------------------------------------------- one role
    def role(self, name: str, kind: str, body: str, where: str, before: str = "") -> str:
        text, target = (m.group(1).strip(), m.group(2)) if (m := re.fullmatch(r"(.*?)\s*<(.+)>", body, re.S)) \
            else (None, body)
        if kind in ("cite", "cite:p", "cite:t"):
            parts = []
            keys = [k.strip() for k in target.split(",")]
            for key in keys:
                if key not in self.cites:
                    raise ValueError(f"{where}: no reference {key!r} in book/references.bib")
                label, url = self.cites[key]
                who, year = label.rsplit(", ", 1)
                if len(keys) == 1 and re.search(re.escape(who) + r"\s*$", before):
                    label = year                          # "Sun et al. [2023]", not "Sun et al. [Sun et al., 2023]"
                parts.append(f"[{label}]({url})" if url else label)
            return f"[{'; '.join(parts)}]"          # the book's brackets: "[SLP+21]" there
        if kind == "eq":
            if target not in self.equations:
                raise ValueError(f"{where}: no equation labelled {target!r}")
            chapter, number = self.equations[target]
            return f"({number})" if chapter == name else f"[({number})]({self.colab(chapter)})"
        if kind == "numref":
            if target not in self.figures:
                raise ValueError(f"{where}: no figure named {target!r}")
            return (text or "Fig. %s").replace("%s", self.figures[target]).replace("{number}", self.figures[target])
        if kind == "doc":
            other = Path(target).name
            if other not in self.titles:
                raise ValueError(f"{where}: no chapter {target!r}")
            return f"[{text or self.titles[other]}]({self.colab(other)})"
        if kind == "ref":
            if target not in self.sections:
                raise ValueError(f"{where}: no section labelled {target!r}")
            chapter, heading = self.sections[target]
            heading = text or heading
            return f"*{heading}*" if chapter == name else f"[{heading}]({self.colab(chapter)})"
        raise ValueError(f"{where}: the role {{{kind}}} has no plain form (add one to scripts/colab_notebooks.py)")

    # ------------------------------------------------------------------------------- one cell
    def plain(self, text: str, name: str, where: str) -> str:
        """A Markdown cell's MyST made plain Markdown."""
        text = BADGE_RE.sub("", text)
        text = re.sub(r"^:::+\{admonition\} Key result\n.*?^```\n:::+[ \t]*\n?", "", text, flags=re.M | re.S)
        text = LABEL_RE.sub("", text)
        text = re.sub(r"^(:::+|```+)\{dropdown\}[ \t]*([^\n]*)\n(?:[ \t]*:[\w-]+:[^\n]*\n)*(.*?)\n^\1[ \t]*$",
                      r"**\2**\n\n\3", text, flags=re.M | re.S)

        def figure(m):
            options = _options(m["options"])
            caption = (f"**Fig. {self._next_figure(name)}.** {m['caption'].strip()}" if m["caption"].strip()
                       else "")                           # Sphinx numbers captioned figures only
            if m["kind"] == "glue:figure":
                return caption                      # the figure is the output of the cell that glues it
            if "://" in m["arg"]:
                return f"![{options.get('alt', '')}]({m['arg']})\n\n{caption}"
            local = (NOTEBOOKS / m["arg"]).resolve()
            if not local.is_file():
                raise ValueError(f"{where}: no image {m['arg']!r}")
            path = local.relative_to(ROOT).as_posix()
            return f"![{options.get('alt', '')}]({self.raw(path)})\n\n{caption}"

        text = FIGURE_RE.sub(figure, text)
        text = EQUATION_RE.sub(lambda m: f"\\tag{{{self.equations[m['label']][1]}}}\n$$", text)
        text = re.sub(r"\{([\w:-]+)\}`([^`]*)`",
                      lambda m: self.role(name, m[1], m[2], where, m.string[max(0, m.start() - 60):m.start()]), text)
        leftover = re.search(r"\{[\w:-]+\}`|^(?:```+|:::+)\{[\w:-]+\}|^\([\w:-]+\)=", text, re.M)
        if leftover:
            line = text[leftover.start():].splitlines()[0]
            raise ValueError(f"{where}: MyST that has no plain form: {line!r} (add it to scripts/colab_notebooks.py)")
        text = re.sub(r"\n{3,}", "\n\n", text)
        return text.strip("\n") + "\n" if text.strip() else ""

    def _next_figure(self, name: str) -> str:
        """The number of the chapter's next figure: figures are numbered in the order the page shows them."""
        self._figures += 1
        return self.number[name](self._figures)

    # ------------------------------------------------------------------------------- one notebook
    def copy(self, name: str) -> dict:
        """The chapter's Colab copy."""
        nb = copy.deepcopy(self.notebooks[name])
        self._figures = 0
        cells = []
        for i, cell in enumerate(nb["cells"]):
            where = f"notebooks/{name}.ipynb cell {i} ({cell.get('id')})"
            if cell["cell_type"] == "markdown":
                cell["source"] = self.plain(_markdown(cell), name, where).splitlines(keepends=True)
                cell.pop("attachments", None)
                if cell["source"]:
                    cells.append(cell)
                continue
            if "injected-parameters" in cell.get("metadata", {}).get("tags", []):
                continue                 # papermill's last run: it would override the reader's `profile`
            if cell["cell_type"] == "code":
                cell["outputs"], cell["execution_count"] = [], None
                cell["metadata"].pop("execution", None)
                cell["metadata"].pop("papermill", None)
            cells.append(cell)
            figure = cell.get("metadata", {}).get("mystnb", {}).get("figure", {})
            if figure.get("caption"):
                caption = self.plain(f"**Fig. {self._next_figure(name)}.** {figure['caption']}", name, where)
                cells.append({"cell_type": "markdown", "id": f"{cell['id']}-caption"[:64], "metadata": {},
                              "source": caption.splitlines(keepends=True)})
        nb["cells"] = cells
        nb["metadata"] = {"kernelspec": nb["metadata"].get("kernelspec", {}),     # no versions: they drift
                          "language_info": {"name": "python"}}
        nb["metadata"]["colab"] = {"provenance": [], "toc_visible": True}
        return nb


def render(nb: dict) -> str:
    """The repository's notebook format (as nbformat writes it)."""
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a copy is missing or stale")
    args = parser.parse_args(argv)
    book = Book(sorted(NOTEBOOKS.glob("*.ipynb")))
    wanted = {f"{name}.ipynb": render(book.copy(name)) for name in book.notebooks}
    stale = [n for n, text in wanted.items() if not (OUT / n).exists() or (OUT / n).read_text() != text]
    extra = sorted(p.name for p in OUT.glob("*.ipynb") if p.name not in wanted) if OUT.exists() else []
    if args.check:
        for n in stale:
            print(f"notebooks/colab/{n} is missing or stale")
        for n in extra:
            print(f"notebooks/colab/{n} has no chapter")
        if stale or extra:
            print("run: python scripts/colab_notebooks.py")
        return 1 if stale or extra else 0
    OUT.mkdir(exist_ok=True)
    for n in stale:
        tmp = OUT / f".{n}.tmp"
        tmp.write_text(wanted[n])
        tmp.replace(OUT / n)
    for n in extra:
        (OUT / n).unlink()
    print(f"notebooks/colab: {len(stale)} written, {len(extra)} removed, {len(wanted) - len(stale)} unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
