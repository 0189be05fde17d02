"""`Table`: a list of flat dict rows that prints cleanly (no pandas dependency)."""
from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any, Iterable


class Table(list):
    """Rows of {column: value}; `print(t)` aligns columns, `t.round(3)` rounds floats."""

    @property
    def columns(self) -> list[str]:
        cols: dict[str, None] = {}
        for row in self:
            cols.update(dict.fromkeys(row))
        return list(cols)

    def column(self, name: str) -> list:
        return [row.get(name) for row in self]

    def require(self, names: str | Iterable[str], what: str = "columns") -> "Table":
        """Self, after checking that every one of `names` is a column (a misspelt name would read as None
        in every row and pool or blank everything silently); an empty table has nothing to check."""
        names = (names,) if isinstance(names, str) else tuple(names)
        have = self.columns
        absent = [n for n in names if n not in have]
        if self and absent:
            raise ValueError(f"{what}: no column {', '.join(map(repr, absent))}; the rows have {have}")
        return self

    def where(self, **equal: Any) -> "Table":
        return Table(r for r in self if all(r.get(k) == v for k, v in equal.items()))

    def round(self, digits: int) -> "Table":
        """Every float rounded to `digits` places; one that rounds to zero becomes 0.0, never -0.0 (printed "-0")."""
        return Table({k: round(v, digits) + 0.0 if isinstance(v, float) else v for k, v in r.items()} for r in self)

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(list(self), indent=1)
        if path is not None:                     # through a temporary file and a rename: never half written
            from .runs.store import atomic_write
            atomic_write(Path(path), text + "\n")
        return text

    def __str__(self) -> str:
        cols = self.columns
        cells = [cols] + [[_fmt(r.get(c)) for c in cols] for r in self]
        widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
        lines = ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in cells]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        cols = self.columns
        head = "".join(f"<th>{_header(c)}</th>" for c in cols)
        body = "".join("<tr>" + "".join(_td(_fmt(r.get(c))) for c in cols) + "</tr>" for r in self)
        # A wide table scrolls inside its own box, so the page never overflows on a phone.
        return (f'<div style="overflow-x: auto; max-width: 100%"><table class="posenc-table"><thead><tr>{head}</tr></thead>'
                f"<tbody>{body}</tbody></table></div>")


#: A value followed by its interval, as `posenc.analysis` writes them: "3.208 [3.198, 3.215]".
_WITH_INTERVAL = re.compile(r"^(\S+)( \[[^\[\]]+\])$")


#: A cell longer than this, with a space in it, is prose (a claim, what was measured, why): it wraps.
PROSE_CHARS = 40


def _header(name) -> str:
    """A column's name, free to break after `_` and `/` (`final_loss_spread`, `train/nope`): a header
    of joined words would otherwise set its column's width and widen the table past the page."""
    return html.escape(str(name)).replace("_", "_<wbr>").replace("/", "/<wbr>")


def _td(text: str) -> str:
    """One cell: numbers and short labels stay on one line; prose (over `PROSE_CHARS` characters, with a
    space) gets the class `posenc-text`, which the book's stylesheet lets wrap within a readable width,
    so a claims table fits the page's column instead of scrolling sideways for a sentence."""
    prose = len(text) > PROSE_CHARS and " " in text
    return f'<td class="posenc-text">{_html_cell(text)}</td>' if prose else f"<td>{_html_cell(text)}</td>"


def _html_cell(text: str) -> str:
    """A cell's text, escaped; a trailing interval in a span of class `posenc-ci`, which the book's
    stylesheet sets on a line of its own in smaller type (so interval columns stay narrow), and which
    reads as before wherever that stylesheet is absent."""
    m = _WITH_INTERVAL.match(text)
    if m is None:
        return html.escape(text)
    return f'{html.escape(m[1])}<span class="posenc-ci">{html.escape(m[2])}</span>'


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)

