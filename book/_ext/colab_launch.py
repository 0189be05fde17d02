"""Sphinx extension: the header's "Launch on Colab" button opens the chapter's Colab copy.

sphinx-book-theme builds the button from the page's path (notebooks/11_rope.ipynb), which on Colab shows
the chapter's MyST (roles, directives, labelled equations) as raw text. The badge at the top of each
chapter opens notebooks/colab/11_rope.ipynb instead (scripts/colab_notebooks.py); this points the
header's button at the same copy, after the theme has added it (html-page-context, priority 501).
"""
import re

#: A Colab link to a chapter of the book: .../blob/<branch>/notebooks/<chapter>.ipynb
CHAPTER = re.compile(r"^(https://colab\.research\.google\.com/github/[^/]+/[^/]+/blob/[^/]+/notebooks/)"
                     r"(?!colab/)([^/]+\.ipynb)$")


def colab_copy(url: str) -> str:
    """The Colab copy's address for a chapter's Colab address; any other address unchanged."""
    return CHAPTER.sub(r"\1colab/\2", url)


def point_at_copies(app, pagename, templatename, context, doctree):
    for group in context.get("header_buttons", []):
        for button in group.get("buttons", []) if group.get("label") == "launch-buttons" else []:
            if button.get("url"):
                button["url"] = colab_copy(button["url"])


def setup(app):
    app.connect("html-page-context", point_at_copies, priority=502)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
