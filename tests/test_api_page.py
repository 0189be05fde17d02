"""The package page (book/api.md) documents every contract function and every registered scheme."""
import re
from pathlib import Path

import posenc
import posenc.functional

PAGE = (Path(__file__).resolve().parent.parent / "book" / "api.md").read_text()


def test_every_contract_function_has_an_entry():
    documented = re.findall(r"^\.\. autofunction:: posenc\.functional\.(\w+)$", PAGE, re.M)
    assert documented == list(posenc.functional.__all__)          # each once, in the module's order


def test_every_registered_scheme_has_a_row_and_an_entry():
    rows = dict(re.findall(r"^\| `(\w+)` \| \{py:class\}`~([\w.]+)` \|", PAGE, re.M))
    entries = re.findall(r"^\.\. autoclass:: (posenc\.schemes\.[\w.]+)$", PAGE, re.M)
    classes = {name: f"{cls.__module__}.{cls.__qualname__}" for name, cls in posenc.SCHEMES.items()
               if cls.__module__.startswith("posenc.")}           # not a test's own scheme
    assert rows == classes
    assert sorted(entries) == sorted(classes.values())
