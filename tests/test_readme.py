"""The README's Python examples run as written (the training example writes to the test session's ci store)."""
import doctest
import pathlib
import re

import posenc

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_every_python_block_of_the_readme_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) >= 2
    for block in blocks:
        exec(compile(block, str(README), "exec"), {})


def test_the_package_docstring_example_runs():
    result = doctest.testmod(posenc, verbose=False, report=False)
    assert result.attempted >= 2 and result.failed == 0
