"""Every measured number a chapter's prose quotes is one its page shows.

A chapter's outputs are rebuilt from the store whenever its runs change; its paragraphs are
typed by hand. When the runs are drawn again (more seeds, other numerics, the GPU's `full`
tier), a number typed into a paragraph goes stale without a sound: the table above it says
3.269 while the reading below still says 3.24. This test reads each committed notebook and
checks that every decimal number in its prose (outside math and code) is one of the numbers
its stored outputs print, to the precision the prose gives it. Numbers in figures do not
count: a reader cannot read three decimals off a curve.

What the prose may quote without its page showing it is listed in the notebook's own metadata,
`metadata.posenc.quoted`: the words around each such number and why it is not on the page (a
paper's own result, a section of a paper, an earlier draw of the runs). Each phrase must still
be found in its chapter's prose, so the list cannot outlive its text.

The check is one-sided: a stale number that happens to round from some other number on the
page passes (more likely for numbers quoted to one decimal on a page of many tables).
"""
import json
import re
from decimal import Decimal
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
NUMBER = re.compile(r"(?<![\w.])[-+\u2212]?(\d+\.\d+)(?![\w]|\.\d)")
NOT_PROSE = [
    re.compile(r"\$\$.*?\$\$", re.S),        # display math
    re.compile(r"\$[^$\n]*\$"),               # inline math
    re.compile(r"```.*?```", re.S),           # fenced code and directives
    re.compile(r"`[^`\n]*`"),                 # inline code, roles' targets
    re.compile(r"\]\([^)]*\)"),               # link targets
]

def prose(cell):
    """The readable text of a markdown cell: math, code and link targets removed."""
    text = "".join(cell["source"])
    for pattern in NOT_PROSE:
        text = pattern.sub(" ", text)
    return text


def shown(notebook):
    """Every decimal number the notebook's stored outputs print, as strings ("0.010", not 0.01)."""
    numbers = set()
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []):
            texts = [output.get("text", "")] + [value for kind, value in output.get("data", {}).items()
                                                 if kind.startswith("text/")]
            for text in texts:
                numbers.update(NUMBER.findall("".join(text)))
    return numbers


def is_shown(quoted, numbers):
    """True where some shown number rounds to `quoted` at the precision it is quoted with.

    A shown 3.855 may stand for 3.8549 or 3.8551, so either neighbour of a tie is accepted;
    signs are not compared, since prose states them in words ("0.011 *above*").
    """
    places = -Decimal(quoted).as_tuple().exponent
    half = Decimal(5) / Decimal(10) ** (places + 1)
    return any(abs(abs(Decimal(quoted)) - abs(Decimal(number))) <= half
               and -Decimal(number).as_tuple().exponent >= places for number in numbers)


def quoted(notebook):
    """The phrases whose numbers the prose quotes from outside the page: {phrase: why}."""
    return {q["phrase"]: q["why"] for q in notebook["metadata"].get("posenc", {}).get("quoted", [])}


def unshown(path):
    """(cell id, number, context) for each number in the prose that no output shows."""
    notebook = json.loads(path.read_text())
    numbers = shown(notebook)
    allowed = sorted(quoted(notebook), key=len, reverse=True)
    missing = []
    for cell in notebook["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        text = prose(cell)
        for phrase in allowed:
            text = text.replace(phrase, " ")
        for match in NUMBER.finditer(text):
            if not is_shown(match.group(1), numbers):
                context = " ".join(text[max(0, match.start() - 60):match.end() + 30].split())
                missing.append((cell.get("id"), match.group(1), context))
    return missing


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_number_in_the_prose_is_on_the_page(path):
    missing = unshown(path)
    assert not missing, f"{path.name}: prose quotes numbers its outputs do not show:\n" + "\n".join(
        f"  cell {cell}: {number}   ...{context}..." for cell, number, context in missing)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_each_quoted_phrase_is_still_in_its_chapter_and_says_why(path):
    notebook = json.loads(path.read_text())
    text = [prose(c) for c in notebook["cells"] if c["cell_type"] == "markdown"]
    phrases = quoted(notebook)
    gone = [phrase for phrase in phrases if not any(phrase in t for t in text)]
    assert not gone, f"{path.name}: metadata.posenc.quoted lists phrases its prose no longer has: {gone}"
    assert all(NUMBER.search(p) for p in phrases), f"{path.name}: a quoted phrase holds no number"
    assert all(why.strip() for why in phrases.values()), f"{path.name}: a quoted phrase does not say why"


def test_the_check_finds_a_stale_number_and_accepts_a_rounded_one():
    numbers = {"3.269", "-0.088", "2.27", "3.855", "0.01", "0.010"}
    assert is_shown("3.27", numbers) and is_shown("3.3", numbers) and is_shown("0.088", numbers)
    assert is_shown("3.85", numbers) and is_shown("3.86", numbers)     # a tie: either neighbour
    assert not is_shown("3.24", numbers)                               # stale
    assert not is_shown("2.270", numbers)                              # more places than shown
    assert not is_shown("0.09", {"0.1"})
    assert is_shown("0.010", numbers)                                  # 0.01 printed too: both kept
