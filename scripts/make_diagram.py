"""Draw the book's "where position enters attention" diagram as SVG.

One head's generalised attention, typeset with SVG <text>/<tspan> (no fonts, no
MathJax, no scripts), with the terms of each `posenc.Scheme` hook in a rounded box of
the hook's colour (Paul Tol's "bright" set, as in `posenc.plots`):

    a_ij = ((x_i + p_i) W_q R_i)((x_j + p_j) W_k R_j)^T / sqrt(d_h) + b(j - i) + e_ij(q_i, k_j)
    o_i  = sum_j softmax_j(a_ij) (v_j + r_ij)

Writes book/images/where-position-enters.svg (equation and legend) and
book/images/hooks/<variant>.svg (the equation with one hook highlighted, for the top
of each chapter). Every glyph run is placed at an explicit x, centred on its width in
a Times-metric table (Liberation Serif = Times New Roman = Tinos), so a wider fallback
font only widens glyphs about their centres; the output is the same bytes every run.

Usage: python scripts/make_diagram.py [--check]
    --check  write nothing; exit 1 naming every file on disk that differs.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
from xml.sax.saxutils import escape

ROOT = pathlib.Path(__file__).resolve().parent.parent
IMAGES = ROOT / "book" / "images"

SERIF = "'Times New Roman', 'Liberation Serif', Tinos, 'Nimbus Roman', Times, serif"
SANS = "system-ui, -apple-system, 'Segoe UI', 'Liberation Sans', Arial, sans-serif"
MONO = "'DejaVu Sans Mono', Menlo, Consolas, 'Liberation Mono', monospace"
INK, GREY_INK, GREY_LINE = "#222222", "#9A9A9A", "#DDDDDD"
FS = 22  # equation font size (user units); every drawing is 640 units wide
SUB = 0.7  # sub/superscript size, relative to FS

#: Advance widths in 1/1000 em of Liberation Serif (Times metrics), upright and italic.
UPRIGHT = {"(": 333, ")": 333, "+": 564, "−": 564, "=": 564, ",": 250, "/": 278, "√": 549, "Σ": 582,
           "⊤": 640, "a": 444, "e": 444, "f": 333, "m": 778, "o": 500, "s": 389, "t": 278, "x": 500}
ITALIC = {"R": 611, "W": 833, "a": 500, "b": 500, "d": 500, "e": 444, "h": 500, "i": 278, "j": 278,
          "k": 444, "o": 500, "p": 500, "q": 500, "r": 389, "v": 444, "x": 444}

#: hook -> (colour, name, `Scheme` methods, example schemes); Tol's bright blue, green, red, purple.
HOOKS = {
    "input": ("#4477AA", "input", "embed, layer_input",
              "learned, sinusoidal, multiplicative, FLOATER, complex order"),
    "qk": ("#228833", "q/k transform", "transform_qk", "RoPE, xPos"),
    "bias": ("#EE6677", "logit bias", "logit_bias, layer_logit_bias", "T5, ALiBi, KERPLE, FIRE"),
    "extra": ("#AA3377", "extra logits / values", "extra_logits, extra_values",
              "Shaw, Transformer-XL, TUPE, DeBERTa, CoPE"),
}


#: The value term r_ij belongs to the extra hook (its colour, `extra_values`), but a chapter highlights it only
#: where its scheme adds to the values (Shaw et al.): XL, TUPE, DeBERTa and CoPE add logits alone.
VALUES = "values"


def hook_text(hook: str, hooks) -> tuple[str, str]:
    """(name, methods) of `hook` as a drawing that highlights `hooks` shows it: the extra hook without
    VALUES is named for its logits alone."""
    _, name, methods, _ = HOOKS[hook]
    if hook == "extra" and VALUES not in hooks:
        return "extra logits", "extra_logits"
    return name, methods


# -- the equation as tokens ----------------------------------------------------------
def it(s):
    return [("it", s)]


def rm(s):
    return [("rm", s)]


def sub(s):
    return [("sub", s)]


def gap(em):
    return [("gap", em)]


def op(s):
    """A binary operator or relation with medium math space on both sides."""
    return gap(0.2) + rm(s) + gap(0.2)


def var(name, index=""):
    """An italic variable with an italic subscript, tucked under a capital's overhang."""
    tuck = gap(-0.08) if name in "WR" else []
    return it(name) + (tuck + sub(index) if index else [])


def box(hook, *parts):
    return [("box", hook, [t for p in parts for t in p])]


def cat(*parts):
    return [t for p in parts for t in p]


def logit_rhs():
    """((x_i + p_i) W_q R_i)((x_j + p_j) W_k R_j)^T / sqrt(d_h) + b(j - i) + e_ij(q_i, k_j)."""
    def side(i, proj):
        return cat(rm("(("), var("x", i), op("+"), box("input", var("p", i)), rm(")"), gap(0.08),
                   var("W", proj), gap(0.08), box("qk", var("R", i)), rm(")"))
    return cat(side("i", "q"), gap(0.05), side("j", "k"), [("sup", "⊤")], gap(0.12), rm("/"), gap(0.04),
               [("sqrt", cat(var("d", "h")))], op("+"),
               box("bias", it("b"), rm("("), it("j"), op("−"), it("i"), rm(")")), op("+"),
               box("extra", var("e", "ij"), rm("("), var("q", "i"), rm(","), gap(0.17), var("k", "j"), rm(")")))


def output_rhs():
    """sum_j softmax_j(a_ij) (v_j + r_ij)."""
    return cat(rm("Σ"), sub("j"), gap(0.17), rm("softmax"), sub("j"), rm("("), var("a", "ij"), rm(")"),
               gap(0.17), rm("("), var("v", "j"), op("+"), box(VALUES, var("r", "ij")), rm(")"))


EQUATION = [(var("a", "ij"), logit_rhs()), (var("o", "i"), output_rhs())]


# -- layout --------------------------------------------------------------------------
def num(v: float) -> str:
    """A coordinate with at most one decimal, the same string on every machine."""
    s = f"{v:.1f}"
    return s[:-2] if s.endswith(".0") else s


def run_width(kind: str, text: str) -> float:
    table = ITALIC if kind in ("it", "sub") else UPRIGHT
    scale = SUB if kind in ("sub", "sup") else 1.0
    return sum(table[c] for c in text) / 1000 * FS * scale


def width(tokens) -> float:
    return layout(tokens, 0.0, 0.0, lambda hook: None)[0]


PAD = 0.14 * FS  # space between a box's edge and its term
MARGIN = 0.13 * FS  # space between a box's edge and its neighbours


def layout(tokens, x: float, y: float, paint):
    """Place `tokens` from x on baseline y: (end x, boxes, texts, lines), each a list of SVG elements.

    `paint(hook)` is (stroke, fill, text colour) for a highlighted hook, or None for a grey one.
    """
    boxes, texts, lines = [], [], []
    for k, tok in enumerate(tokens):
        kind = tok[0]
        if kind == "gap":
            x += tok[1] * FS
        elif kind == "box":  # a margin keeps the box off its neighbours, unless a gap already does
            spaced = (k > 0 and tokens[k - 1][0] == "gap", k + 1 < len(tokens) and tokens[k + 1][0] == "gap")
            x, b, t, l = layout_box(tok[1], tok[2], x, y, paint, spaced)
            boxes += b
            texts += t
            lines += l
        elif kind == "sqrt":
            x, t, l = layout_sqrt(tok[1], x, y, paint)
            texts += t
            lines += l
        else:
            w = run_width(kind, tok[1])
            texts.append(glyphs(kind, tok[1], x + w / 2, y, w, INK))
            x += w
    return x, boxes, texts, lines


def glyphs(kind: str, text: str, cx: float, y: float, w: float, colour: str) -> str:
    """One <tspan> centred on cx; sub/superscripts are smaller and moved off the baseline."""
    dy = {"sub": 0.24, "sup": -0.4}.get(kind, 0.0) * FS
    attrs = f'x="{num(cx)}" y="{num(y + dy)}"'
    if kind == "it" or kind == "sub":
        attrs += ' font-style="italic"'
    if kind in ("sub", "sup"):
        attrs += f' font-size="{num(FS * SUB * (0.85 if kind == "sup" else 1))}"'
    if len(text) > 2:  # a word keeps its width in a wider fallback font
        attrs += f' textLength="{num(w)}" lengthAdjust="spacingAndGlyphs"'
    if colour != INK:
        attrs += f' fill="{colour}"'
    return f"<tspan {attrs}>{escape(text)}</tspan>"


def layout_box(hook, tokens, x, y, paint, spaced=(False, False)):
    """A term in a rounded box: the hook's colours if highlighted, light grey otherwise.

    `spaced`: whether a gap already separates the box from its (left, right) neighbour.
    """
    x += 0 if spaced[0] else MARGIN
    end, boxes, texts, lines = layout(tokens, x + PAD, y, paint)
    colours = paint(hook)
    stroke, fill, ink = colours if colours else (GREY_LINE, "none", GREY_INK)
    if ink != INK:
        texts = [t.replace("<tspan ", f'<tspan fill="{ink}" ', 1) for t in texts]
    top, bottom = y - 0.86 * FS, y + 0.44 * FS
    rect = (f'<rect x="{num(x)}" y="{num(top)}" width="{num(end + PAD - x)}" height="{num(bottom - top)}" '
            f'rx="5" fill="{fill}" stroke="{stroke}" stroke-width="1.5"/>')
    return end + PAD + (0 if spaced[1] else MARGIN), [rect] + boxes, texts, lines


def layout_sqrt(tokens, x, y, paint):
    """√ followed by its radicand under a rule drawn at the height of the radical's top."""
    w = run_width("rm", "√")
    texts = [glyphs("rm", "√", x + w / 2, y, w, INK)]
    end, _, inner, lines = layout(tokens, x + w + 0.03 * FS, y, paint)
    top = y - 0.775 * FS
    rule = (f'<line x1="{num(x + w - 0.04 * FS)}" y1="{num(top)}" x2="{num(end + 0.04 * FS)}" y2="{num(top)}" '
            f'stroke="{INK}" stroke-width="{num(0.045 * FS)}"/>')
    return end + 0.04 * FS, texts + inner, lines + [rule]


def equation(x_eq: float, y0: float, pitch: float, paint) -> list[str]:
    """The two lines of the equation, their "=" signs at x_eq, baselines y0 and y0 + pitch."""
    eq_w = run_width("rm", "=")
    boxes, texts, lines = [], [], []
    for row, (lhs, rhs) in enumerate(EQUATION):
        y = y0 + row * pitch
        placed = [layout(lhs, x_eq - 0.28 * FS - width(lhs), y, paint),
                  layout(rm("="), x_eq, y, paint),
                  layout(rhs, x_eq + eq_w + 0.28 * FS, y, paint)]
        for _, b, t, l in placed:
            boxes += b
            texts += t
            lines += l
    text = f'<text font-family="{SERIF}" font-size="{FS}" text-anchor="middle" fill="{INK}">'
    return boxes + [text] + ["  " + t for t in texts] + ["</text>"] + lines


def equation_span() -> tuple[float, float]:
    """(width left of "=", width from "=" to the end of the longest line)."""
    eq_w = run_width("rm", "=") + 0.28 * FS
    return (max(width(lhs) + 0.28 * FS for lhs, _ in EQUATION),
            max(eq_w + width(rhs) for _, rhs in EQUATION))


# -- colours, swatches, legend -------------------------------------------------------
def tint(colour: str, amount: float = 0.16) -> str:
    """`colour` mixed with white, as a light fill behind dark text."""
    rgb = [int(colour[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(255 - amount * (255 - c)):02X}" for c in rgb)


def painter(highlight):
    """paint(hook) for the hooks in `highlight`: (stroke, light fill, text colour), else None."""
    def paint(hook):
        colour = HOOKS["extra" if hook == VALUES else hook][0]
        return (colour, tint(colour), INK) if hook in highlight else None
    return paint


def swatch(hook: str, x: float, y: float, size: float = 16) -> str:
    colour = HOOKS[hook][0]
    return (f'<rect x="{num(x)}" y="{num(y - size + 2)}" width="{num(size)}" height="{num(size)}" rx="4" '
            f'fill="{tint(colour)}" stroke="{colour}" stroke-width="1.5"/>')


def hook_label(hook: str, x: float, y: float, size: float, hooks=tuple(HOOKS) + (VALUES,)) -> list[str]:
    """Swatch, bold hook name and its `Scheme` methods in code type, on one line."""
    name, methods = hook_text(hook, hooks)
    return [swatch(hook, x, y, size - 1),
            f'<text x="{num(x + size + 8)}" y="{num(y)}" font-family="{SANS}" font-size="{num(size)}" fill="{INK}">'
            f'<tspan font-weight="bold">{escape(name)}</tspan>'
            f'<tspan font-family="{MONO}" font-size="{num(size * 0.9)}" dx="10">{escape(methods)}</tspan></text>']


def legend(x: float, y: float, size: float = 19, pitch: float = 54) -> list[str]:
    """One entry per hook: swatch, name and methods; below them, schemes that use the hook."""
    out = []
    for k, hook in enumerate(HOOKS):
        top = y + k * pitch
        out += hook_label(hook, x, top, size)
        out.append(f'<text x="{num(x + size + 8)}" y="{num(top + 1.25 * size)}" font-family="{SANS}" '
                   f'font-size="{num(size)}" fill="#444444">{escape(HOOKS[hook][3])}</text>')
    return out


# -- documents -----------------------------------------------------------------------
def svg(width: float, height: float, ident: str, title: str, desc: str, body: list[str]) -> str:
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {num(width)} {num(height)}" width="100%" '
            f'role="img" aria-labelledby="{ident}-title {ident}-desc">')
    return "\n".join([head, f'<title id="{ident}-title">{escape(title)}</title>',
                      f'<desc id="{ident}-desc">{escape(desc)}</desc>',
                      f'<rect width="{num(width)}" height="{num(height)}" fill="#FFFFFF"/>', *body, "</svg>", ""])


EQ_TEXT = ("a_ij = ((x_i + p_i) W_q R_i) ((x_j + p_j) W_k R_j)^T / sqrt(d_h) + b(j - i) + e_ij(q_i, k_j); "
           "o_i = sum over j of softmax_j(a_ij) (v_j + r_ij).")


def main_diagram() -> str:
    """The equation, every hook coloured, and the legend: 640 x 324 units."""
    width, height = 640, 324
    left, right = equation_span()
    x_eq = (width - left - right) / 2 + left
    body = equation(x_eq, 40, 46, painter(set(HOOKS) | {VALUES})) + legend(24, 130)
    desc = ("Attention of one head: " + EQ_TEXT + " Boxes mark where position enters: "
            + "; ".join(f"{n} ({m}): {e}" for _, n, m, e in HOOKS.values()) + ".")
    return svg(width, height, "where-position", "Where position enters attention", desc, body)


NONE_NOTE = "no position: NoPE"


def hook_names(hooks: tuple, x: float, y: float, size: float) -> list[str]:
    """Swatch and bold name of each hook, side by side on one line (a chapter whose schemes use several)."""
    out = []
    for hook in (h for h in hooks if h != VALUES):
        name = hook_text(hook, hooks)[0]
        out += [swatch(hook, x, y, size - 1),
                f'<text x="{num(x + size + 8)}" y="{num(y)}" font-family="{SANS}" font-size="{num(size)}" '
                f'font-weight="bold" fill="{INK}">{escape(name)}</text>']
        x += size + 8 + 0.6 * size * len(name) + 22      # a bold sans glyph is about 0.6 em wide
    return out


def variant(hooks: tuple) -> str:
    """The equation alone with the terms of `hooks` coloured (empty: all grey, NoPE): 640 x 120 units."""
    width, height = 640, 120
    left, right = equation_span()
    x_eq = (width - left - right) / 2 + left
    if not hooks:
        label = [f'<text x="12" y="22" font-family="{SANS}" font-size="17" fill="#555555">{NONE_NOTE}</text>']
        title, desc = "Attention without position (NoPE)", "No position term is used: " + EQ_TEXT
    else:
        shown = [h for h in hooks if h != VALUES]
        label = hook_label(shown[0], 12, 22, 17, hooks) if len(shown) == 1 else hook_names(hooks, 12, 22, 17)
        names = " and ".join(hook_text(h, hooks)[0] for h in shown)
        title = f"Where position enters: {names}"
        desc = "; ".join(f"Hook {hook_text(h, hooks)[0]} ({hook_text(h, hooks)[1]}), used by {HOOKS[h][3]}"
                         for h in shown)
        desc += ", highlighted in: " + EQ_TEXT
    body = label + equation(x_eq, 62, 42, painter(set(hooks)))
    return svg(width, height, f"hook-{'-'.join(hooks) or 'none'}", title, desc, body)


#: The chapters' diagrams, named by their hooks in alphabetical order: one hook each, or several where a
#: chapter's schemes enter at more than one (ViT's learned and 2-D sinusoidal tables at the input and axial
#: RoPE at q/k; chapter 07b's Shaw and Transformer-XL extra terms beside T5's bias; TUPE's position bias and
#: its BERT-A^d ablation's cross terms; DeBERTa's c2p/p2c logits and the EMD's absolute positions; chapter
#: 17's KERPLE and FIRE biases, CoPE's extra logits, and randomized positions given to RoPE). `values`:
#: the extra hook's value term is highlighted too (Shaw et al.).
VARIANTS = {"input": ("input",), "qk": ("qk",), "bias": ("bias",), "extra": ("extra",), "none": (),
            "extra-values": ("extra", VALUES), "extra-input": ("input", "extra"), "input-qk": ("input", "qk"),
            "bias-extra": ("bias", "extra"), "bias-extra-values": ("bias", "extra", VALUES),
            "bias-extra-qk": ("bias", "extra", "qk")}


def render() -> dict[pathlib.Path, str]:
    """Every file the script owns -> its text."""
    files = {IMAGES / "where-position-enters.svg": main_diagram()}
    for name, hooks in VARIANTS.items():
        files[IMAGES / "hooks" / f"{name}.svg"] = variant(hooks)
    return files


def stale(files: dict[pathlib.Path, str]) -> list[pathlib.Path]:
    """The paths whose bytes on disk differ from `files` (or that are missing)."""
    return [p for p, text in files.items() if not p.exists() or p.read_bytes() != text.encode("utf-8")]


def check() -> list[str]:
    """Messages naming each stale diagram; empty when every file is up to date."""
    return [f"{p.relative_to(ROOT)} is stale: run python scripts/make_diagram.py" for p in stale(render())]


def main(argv=None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--check", action="store_true", help="exit 1 if a file on disk differs")
    if args.parse_args(argv).check:
        problems = check()
        print("\n".join(problems) or "diagrams are up to date", file=sys.stderr if problems else sys.stdout)
        return 1 if problems else 0
    for path, text in render().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode("utf-8"))
        print(path.relative_to(ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
