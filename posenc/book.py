"""What a chapter hands to the book's build: values glued for another page to show (myst-nb), and
listings of the package's source.

On Colab or in a plain Jupyter there is no build to hand them to, and myst-nb is not installed:
`glue` then does nothing and says so, and the chapter runs on.
"""
from __future__ import annotations

import inspect
import re
import textwrap


def glue(name: str, value) -> bool:
    """Store `value` under `name` for the book's pages (`myst_nb.glue`, not displayed here). False, and
    nothing stored, where myst-nb is not installed (Colab, a plain Jupyter): no page reads it there."""
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        return False
    myst_glue(name, value, display=False)
    return True


class Listing:
    """The source of functions, classes and methods, shown as highlighted Python.

    A chapter ends a cell with `listing(solve_positions, Floater)` to show the implementation it
    derived. Where outputs render Markdown (the book, Jupyter, Colab) it is a fenced ```python block,
    so the page highlights it; its plain text (`repr`, what nbval compares) is the source itself.
    Each object is dedented (a method starts at column 0); two blank lines separate them.
    """

    def __init__(self, *objects):
        if not objects:
            raise ValueError("listing needs at least one function, class or method to show")
        parts = []
        for i, obj in enumerate(objects):
            try:
                parts.append(textwrap.dedent(inspect.getsource(obj)).rstrip("\n"))
            except (TypeError, OSError) as err:
                raise TypeError(f"listing: objects[{i}] must be a function, class or method defined in a "
                                f"source file; got {type(obj).__name__} {obj!r:.60} ({err})") from None
        self.text = "\n\n\n".join(parts) + "\n"

    def _repr_markdown_(self) -> str:
        fence = "`" * max(3, 1 + max(map(len, re.findall("`+", self.text)), default=0))   # longer than any run inside
        return f"{fence}python\n{self.text}{fence}\n"

    def __repr__(self) -> str:
        return self.text


def listing(*objects) -> Listing:
    """`Listing(*objects)`: the source of `objects`, for a chapter to show (see `Listing`)."""
    return Listing(*objects)
