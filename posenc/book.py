"""What a chapter hands to the book's build: values glued for another page to show (myst-nb).

On Colab or in a plain Jupyter there is no build to hand them to, and myst-nb is not installed:
`glue` then does nothing and says so, and the chapter runs on.
"""
from __future__ import annotations


def glue(name: str, value) -> bool:
    """Store `value` under `name` for the book's pages (`myst_nb.glue`, not displayed here). False, and
    nothing stored, where myst-nb is not installed (Colab, a plain Jupyter): no page reads it there."""
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        return False
    myst_glue(name, value, display=False)
    return True
