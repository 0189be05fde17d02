"""Sphinx extension: a figure drawn by a notebook gets its caption as alt text.

A glued matplotlib figure is an image whose only alt text is its file name ("../_images/2b73e6....png"),
which a screen reader reads out. Every image inside a captioned figure that has no alt text of its own, or
only its file name, gets the caption's words instead (its math as written, without the "Fig. 11.2" that the
HTML writer adds). A screen reader cannot read LaTeX, so the caption's math is spelt in Unicode
(`\\theta'_i/\\theta_i` becomes "θ'_i/θ_i", `\\langle R_m q, R_n k \\rangle` "⟨R_m q, R_n k⟩").
"""
import re
import unicodedata

from docutils import nodes

#: LaTeX commands the captions use, and their Unicode (Greek letters are looked up by name).
SYMBOLS = {"le": "≤", "leq": "≤", "ge": "≥", "geq": "≥", "ne": "≠", "neq": "≠", "approx": "≈", "pm": "±",
           "cdot": "·", "times": "×", "dots": "…", "ldots": "…", "cdots": "⋯", "infty": "∞", "to": "→",
           "sum": "Σ", "prod": "Π", "langle": "⟨", "rangle": "⟩", "odot": "⊙", "in": "∈", "sqrt": "√",
           "left": "", "right": "", "quad": " ", "qquad": " ", ",": " ", ";": " ", "!": "", " ": " "}
GROUP = r"\{([^{}]*)\}"


def _command(match: re.Match) -> str:
    name = match.group(1)
    if name in SYMBOLS:
        return SYMBOLS[name]
    try:
        return unicodedata.lookup(f"GREEK {'CAPITAL' if name[0].isupper() else 'SMALL'} LETTER {name.upper()}")
    except KeyError:
        return name                                     # \log, \sin, \exp: their names


def plain_math(latex: str) -> str:
    """LaTeX as a screen reader can read it: symbols in Unicode, fractions with a slash, no braces."""
    text = re.sub(r"\\(?:mathrm|text|mathbf|mathit|operatorname|boldsymbol)\s*" + GROUP, r"\1", latex)
    for _ in range(3):                                  # \frac{1}{d/2}: "1/(d/2)"; innermost first
        text = re.sub(r"\\frac\s*" + GROUP + r"\s*" + GROUP,
                      lambda m: "/".join(p if re.fullmatch(r"\w+", p) else f"({p})" for p in m.groups()), text)
    text = re.sub(r"\\([A-Za-z]+|[,;! ])", _command, text)
    text = re.sub(r"([_^])" + GROUP, r"\1\2", text).replace("{", "").replace("}", "")
    return re.sub(r"\s+⟩", "⟩", re.sub(r"⟨\s+", "⟨", " ".join(text.split())))


def _text(node: nodes.Node) -> str:
    return plain_math(node.astext()) if isinstance(node, nodes.math) else (
        node.astext() if isinstance(node, nodes.Text) else "".join(_text(child) for child in node.children))


def caption_alt(figure: nodes.figure) -> str | None:
    """The figure's caption as one line of plain text, or None when it has none."""
    caption = next(iter(figure.findall(nodes.caption)), None)
    return " ".join(_text(caption).split()) if caption is not None else None


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
