"""Sphinx extension: a figure drawn by a notebook gets its caption as alt text.

A glued matplotlib figure is an image whose only alt text is its file name ("../_images/2b73e6....png"),
which a screen reader reads out. Every image inside a captioned figure that has no alt text of its own, or
only its file name, gets the caption's words instead (its math as written, without the "Fig. 11.2" that the
HTML writer adds).
"""
from docutils import nodes


def caption_alt(figure: nodes.figure) -> str | None:
    """The figure's caption as one line of plain text, or None when it has none."""
    caption = next(iter(figure.findall(nodes.caption)), None)
    return " ".join(caption.astext().split()) if caption is not None else None


def needs_alt(image: nodes.image) -> bool:
    """Whether the image's alt text is missing or is only its own file name."""
    alt, uri = image.get("alt", ""), image.get("uri", "")
    return not alt or alt == uri or alt.rsplit("/", 1)[-1] == uri.rsplit("/", 1)[-1]


def add_alt(app, doctree, docname) -> None:
    for figure in doctree.findall(nodes.figure):
        text = caption_alt(figure)
        if text:
            for image in figure.findall(nodes.image):
                if needs_alt(image):
                    image["alt"] = text


def setup(app):
    app.connect("doctree-resolved", add_alt)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
