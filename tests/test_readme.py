"""The README's and the book's opening page's Python examples run as written (the training example writes to
the test session's ci store)."""
import doctest
import pathlib
import re

import posenc

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
INTRO = README.parent / "book" / "intro.md"


def test_every_python_block_of_the_readme_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 2
    for block in blocks:
        exec(compile(block, str(README), "exec"), {})


def test_the_python_block_of_the_books_opening_page_runs():
    """book/intro.md's "In your own code" example: every name it uses is defined in it."""
    [block] = re.findall(r"```python\n(.*?)```", INTRO.read_text(), re.S)
    scope = {}
    exec(compile(block, str(INTRO), "exec"), scope)
    assert scope["logits"].shape == (*scope["tokens"].shape, 100)


def test_the_package_docstring_example_runs():
    result = doctest.testmod(posenc, verbose=False, report=False)
    assert result.attempted >= 2 and result.failed == 0
