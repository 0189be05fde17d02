"""Plot helpers shared by every chapter: labelled axes, units, one style."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import torch

from .table import Table
from .analysis import metric_values


#: The book's figures: at most 7 inches wide (the page's column), drawn at 150 dpi, so that
#: 10-point text stays about 10 points on a laptop and is still legible on a phone.
PAGE_WIDTH, DPI = 7.0, 150


#: One colour and one marker per scheme across the whole book, chosen so that the schemes drawn together in
#: chapter 15 differ in hue or in lightness (any two schemes at least 20 apart in CIELAB, any two rows 15; a
#: test checks it): NoPE black, then a hue each, drawn from Paul Tol's and Okabe and Ito's sets; an option
#: row takes a lighter or darker shade of its scheme's hue.
_TOL = ["#000000", "#88CCEE", "#44AA99", "#AA4499", "#666633", "#AA7744", "#CC6677", "#882255", "#EE7733",
        "#332288", "#EE3377", "#228833", "#CCBB44", "#0077BB", "#CC3311", "#BBBBBB", "#E69F00", "#663333",
        "#225522", "#99DD55", "#EE8866", "#FFBB77", "#77AADD", "#FFAABB", "#DD88BB"]
#: Markers: every scheme its own (FIRE, KERPLE, CoPE and the GRU take the four after the first fourteen); the
#: option rows after them repeat the first ones, with colours of their own.
_MARKERS = "osD^v<>ph*Xd8P" + "x+H1"
SCHEME_STYLE = {name: (_TOL[i], _MARKERS[i % len(_MARKERS)]) for i, name in enumerate(
    ["nope", "learned", "sinusoidal", "floater", "multiplicative", "complex", "shaw", "xl", "t5", "tupe", "deberta",
     "rope", "alibi", "xpos", "fire", "kerple", "cope", "rnn",
     # options compared as rows of their own (posenc.runs.plans.comparison.VARIANTS)
     "rope (NoPE layers)", "rope (randomized)",
     # the paper tier's own option rows (posenc.runs.plans.suite.LM_VARIANTS)
     "fire (threshold L/4)", "t5 (max_distance L/2)", "xpos (scale L/2)",
     "shaw (k = 2)", "xl (per-layer u, v)"])}


#: The four hooks' colours (a scheme's `kind` in the cost tables), those of the "where position enters"
#: diagrams drawn by scripts/make_diagram.py (a test keeps the two equal).
HOOK_COLOR = {"input": "#4477AA", "q/k": "#228833", "bias": "#EE6677", "custom": "#AA3377"}


def shades(scheme: str, n: int) -> list[str]:
    """n colours for variants of `scheme` (ablations, options drawn beside it): its hue, from darker to
    lighter than its own colour, which stays the scheme's. Linear in sRGB between the colour mixed 45% with
    black and mixed 55% with white (one variant: the dark end), so that a variant reads as its scheme's
    kin and never as another scheme."""
    if scheme not in SCHEME_STYLE:
        raise ValueError(f"scheme must be one of {sorted(SCHEME_STYLE)}; got {scheme!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int; got {n!r}")
    base = np.array([int(SCHEME_STYLE[scheme][0][i:i + 2], 16) for i in (1, 3, 5)], dtype=float)
    dark, light = base * 0.55, base + (255 - base) * 0.55
    return ["#" + "".join(f"{int(round(c)):02X}" for c in dark + (light - dark) * t)
            for t in (np.linspace(0, 1, n) if n > 1 else [0.0])]


#: RoPE's context extensions (chapters 11 and 16): one colour and marker each, the same in both chapters, in
#: colours no scheme takes anywhere in the book (at least 20 apart in CIELAB from every `SCHEME_STYLE` colour;
#: RoPE keeps its own, as trained or fine-tuned). Line style tells a fine-tuned extension (solid) from one
#: applied as it is (dashed).
SCALING_STYLE = {"PI": ("#5555DD", "s"), "NTK": ("#777700", "^"), "dynamic NTK": ("#007788", "v"),
                 "YaRN": ("#FF22CC", "D"), "Llama 3": ("#BB11EE", "o"), "LongRoPE": ("#00BB11", "P")}


def scaling_style(name: str, *, fine_tuned: bool = False) -> dict:
    """Line keywords of a RoPE extension named `name` (a `SCALING_STYLE` key), or of RoPE itself ("RoPE"):
    solid when fine-tuned at the longer length, dashed when applied as it is."""
    if name == "RoPE":
        color, marker = SCHEME_STYLE["rope"]
    elif name in SCALING_STYLE:
        color, marker = SCALING_STYLE[name]
    else:
        raise ValueError(f"name must be 'RoPE' or one of {sorted(SCALING_STYLE)}; got {name!r}")
    return {"color": color, "marker": marker, "ls": "-" if fine_tuned else "--"}


#: Labels that name one of the book's schemes another way (the ViT's 2-D schemes): drawn in its style.
SAME_STYLE = {"none": "nope", "sincos2d": "sinusoidal", "rope2d": "rope"}


def style(label) -> dict:
    """Line style of a curve labelled with a scheme's name (or a `SAME_STYLE` alias): its fixed colour
    and marker; any other label keeps matplotlib's cycle (an empty dict)."""
    name = SAME_STYLE.get(str(label), str(label))
    if name in SCHEME_STYLE:
        color, marker = SCHEME_STYLE[name]
        return {"color": color, "marker": marker}
    return {}


def label_panels(axes) -> None:
    """Letter the panels (a), (b), ... in reading order, so that a caption's "(b)" names a panel the
    reader can find. The letter heads each panel's title: "(b)" at once, and "(b) kback" once the
    chapter titles the panel (a title that already starts with its letter is kept as it is), so the
    letter takes no place of its own that a long title could run into. A title wider than its panel
    breaks onto two lines (`fit_title`)."""
    for i, ax in enumerate(axes):
        letter = f"({chr(ord('a') + i)})"

        def lettered(label, fontdict=None, loc=None, pad=None, *, _set=ax.set_title, _letter=letter, _ax=ax,
                     **kwargs):
            if loc in (None, "center") and not str(label).startswith(_letter):
                label = f"{_letter} {label}".rstrip()
            return fit_title(_ax, _set(label, fontdict, loc, pad, **kwargs))

        ax.set_title = lettered
        ax.set_title("")


def fit_title(ax, title):
    """`title` (a Text of `ax`) on two lines, broken at the space that makes the longer line shortest, when
    on one line it is wider than the axes (`_axes_width`): matplotlib lets a long title run over its
    neighbour's and past the figure's edge, and a figure wider than the page's column is shrunk to fit
    it, every label with it. A title with a line break of its own is kept as it is. Returns `title`."""
    text = title.get_text()
    if "\n" in text or " " not in text.strip():
        return title
    renderer = ax.figure.canvas.get_renderer()

    def width(candidate: str) -> float:
        """The inches `candidate` takes as this title (set on it to be measured)."""
        title.set_text(candidate)
        return title.get_window_extent(renderer).width / ax.figure.dpi

    if width(text) <= _axes_width(ax):
        return title
    cuts = [i for i, c in enumerate(text) if c == " "]
    best = min(cuts, key=lambda i: max(width(text[:i]), width(text[i + 1:])))
    title.set_text(f"{text[:best]}\n{text[best + 1:]}")
    return title


def _check_matrix(name: str, value, expected: str) -> None:
    """ValueError unless `value` is a 2-D tensor: imshow would draw a 3-D one as an RGB(A) image."""
    if not isinstance(value, torch.Tensor) or value.dim() != 2:
        got = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        raise ValueError(f"{name} must be a 2-D tensor {expected}; got {got}")


def panels(n: int, *, cols: int = 2, row_height: float = 2.9, width: float = PAGE_WIDTH, letters: bool = True,
           **subplot_kw):
    """A figure of `n` panels, at most `cols` to a row and `width` inches wide: (fig, list of n axes).

    Rows of panels are stacked rather than squeezed side by side, so a figure never needs
    more than the page's width; extra cells of the last row are removed. With more than one
    panel, each is lettered (a), (b), ... in reading order (`label_panels`; letters=False: none).
    """
    for arg, value in (("n", n), ("cols", cols)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{arg} must be a positive int; got {value!r}")
    if width > PAGE_WIDTH:
        raise ValueError(f"width must be at most {PAGE_WIDTH} inches (the page's column); got {width}")
    cols = min(cols, n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width, row_height * rows), dpi=DPI, layout="constrained",
                             squeeze=False, **subplot_kw)
    fig.get_layout_engine().set(w_pad=6 / 72)      # 6 pt between side-by-side panels' labels (default 3)
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.remove()
    if letters and n > 1:
        label_panels(flat[:n])
    return fig, flat[:n]


def legend_below(ax, *, fontsize: float = 8, ncol: int | None = None):
    """The axes' legend under its x label, in up to three columns and without a frame: a legend inside
    the axes ("best") can still cover the min-max bands and the far ends of the curves, which matplotlib
    does not count as data when it places one. It hangs a fixed distance in points below the axes (room for
    the tick labels and the x label), whatever the axes' height. Without `ncol`, it takes the most columns
    (3, 2, else 1) whose legend, as matplotlib lays it out, fits under the axes (`_axes_width`). Returns the
    legend (None when nothing in the axes has a label)."""
    from matplotlib.transforms import offset_copy
    handles, _ = ax.get_legend_handles_labels()
    if not handles:                      # nothing labelled: no legend (matplotlib would warn and draw an empty one)
        return None
    below = offset_copy(ax.transAxes, fig=ax.figure, y=-(30 if ax.get_xlabel() else 16), units="points")
    place = lambda k: ax.legend(fontsize=fontsize, ncol=k, loc="upper center", bbox_to_anchor=(0.5, 0.0),
                                bbox_transform=below, frameon=False)
    if ncol is not None:
        return place(ncol)
    renderer = ax.figure.canvas.get_renderer()
    for k in range(min(3, len(handles)), 1, -1):
        legend = place(k)
        if legend.get_window_extent(renderer).width / ax.figure.dpi <= _axes_width(ax):
            return legend
    return place(1)


def _axes_width(ax) -> float:
    """About the width in inches the axes will have once a constrained layout has run: its grid cell's share
    of the figure's width less 0.6 inches for the y tick labels and y label. A legend much wider than its
    axes makes the constrained layout shrink the axes."""
    spec = ax.get_subplotspec()
    if spec is None:
        return ax.get_position().width * ax.figure.get_figwidth()
    return ax.figure.get_figwidth() * len(spec.colspan) / spec.get_gridspec().ncols - 0.6


def _axes(ax, figsize=(6, 3.5)):
    if ax is None:
        _, ax = plt.subplots(figsize=figsize, dpi=DPI, layout="constrained")
    return ax


def training_curves(histories: dict, *, metric: str = "loss", ylabel: str = "training loss (nats/token)",
                    ax=None, logy: bool = False, styles: dict | None = None):
    """One line per run: {label: history list of {"step", metric}}; `styles` as in `metric_vs_length`
    (a label's own line keywords; a scheme's name keeps its colour), without markers."""
    ax = _axes(ax)
    for label, history in histories.items():
        kw = {**style(label), **(styles or {}).get(label, {})}
        kw.pop("marker", None)
        ax.plot([h["step"] for h in history], [h[metric] for h in history], label=label, **kw)
    ax.set(xlabel="training step", ylabel=ylabel)
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    legend_below(ax)
    return ax


def metric_vs_length(table: Table, *, y: str, hue: str = "scheme", x: str = "x_train", ax=None,
                     ylabel: str | None = None, xlabel: str = "evaluation length / training length",
                     train_mark: float | None = 1.0, logy: bool = False, logx: bool = False,
                     styles: dict | None = None, labels: dict | None = None, legend: bool = True):
    """Mean of `y` against `x` per `hue` group, with min-max bands over seeds.

    styles: {group: line keywords} for groups that are not scheme names (a scheme keeps its own
    colour and marker, `style`); labels: {group: legend label}; logx: a log axis ticked at the
    lengths measured; legend=False leaves the legend to the caller (a figure-wide one, say).
    """
    table = Table(table).require((y, hue, x), "metric_vs_length's y, hue and x")
    ax = _axes(ax)
    styles, labels = styles or {}, labels or {}
    ticks = set()
    for group in dict.fromkeys(table.column(hue)):
        rows = table.where(**{hue: group})
        xs = sorted(set(rows.column(x)))
        ticks.update(xs)
        vals = [np.array(metric_values(rows.where(**{x: v}), y)) for v in xs]   # a None or NaN: refused
        mean = [v.mean() for v in vals]
        line, = ax.plot(xs, mean, **{"marker": "o", **style(group), **styles.get(group, {})},
                        label=labels.get(group, str(group)))
        if any(len(v) > 1 for v in vals):
            ax.fill_between(xs, [v.min() for v in vals], [v.max() for v in vals], alpha=0.2, color=line.get_color())
    if train_mark is not None:
        ax.axvline(train_mark, color="grey", ls=":", lw=1, label="training length")
    ax.set(xlabel=xlabel, ylabel=ylabel or y)
    if logx:
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(sorted(ticks), [f"{t:g}" for t in sorted(ticks)])
    if logy:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    if legend:
        legend_below(ax)
    return ax


def metric_vs_length_by_group(table: Table, groups, *, y: str, ylabel: str, title: str = "",
                              row_height: float = 3.4, axes=None, own_y=()):
    """One panel per (name, schemes) of `groups`, sharing the y axis: `metric_vs_length` of the rows of those
    schemes against a log length axis, titled with the group's name and `title`, its legend below it.
    `own_y`: names of groups drawn on their own y axis instead, e.g. a zoom on curves that a shared axis
    would stack on one another. `axes`: draw into these (one per group, e.g. a slice of a larger `panels`
    figure) instead of a new figure. Returns the figure."""
    names = [name for name, _ in groups]
    unknown = [name for name in own_y if name not in names]
    if isinstance(own_y, str) or unknown:
        raise ValueError(f"own_y must name groups among {names}; got {own_y!r}")
    if axes is None:
        fig, axes = panels(len(groups), row_height=row_height)
    else:
        if len(axes) != len(groups):
            raise ValueError(f"axes must hold one axes per group ({len(groups)}); got {len(axes)}")
        fig = axes[0].figure
    shared = [ax for ax, name in zip(axes, names) if name not in own_y]
    for ax in shared[1:]:
        if not shared[0].get_shared_y_axes().joined(shared[0], ax):    # `axes` may come shared already
            ax.sharey(shared[0])
    for ax, (name, schemes) in zip(axes, groups):
        rows = Table(r for r in table if r["scheme"] in schemes)
        if not rows:
            raise ValueError(f"groups: no rows for the schemes of {name!r} ({', '.join(map(str, schemes))})")
        metric_vs_length(rows, y=y, ax=ax, ylabel=ylabel, logx=True, legend=False)
        ax.set_title(f"{name}{title}", fontsize=9)
        legend_below(ax)
    return fig


def ratio_bars(ratios: dict, *, xlabel: str, marks=(1.0, 2.0), ax=None, title: str = ""):
    """One horizontal bar per label, sorted, {label: ratio}: e.g. each scheme's loss at 8L over its loss at
    L, where a long list of curves on one axis would hide the small differences. Bars take the scheme's
    colour (grey for other labels); dotted lines mark `marks` (1: flat, 2: doubled)."""
    if not ratios:
        raise ValueError("ratios must hold at least one {label: value}")
    order = sorted(ratios, key=lambda label: ratios[label])
    ax = _axes(ax, figsize=(PAGE_WIDTH, 0.22 * len(order) + 1.0))
    colors = [style(label).get("color", "#888888") for label in order]
    ax.barh(range(len(order)), [ratios[k] for k in order], color=colors)
    ax.set_yticks(range(len(order)), [str(k) for k in order], fontsize=8)
    for x in marks:
        ax.axvline(x, color="grey", ls=":", lw=1)
    for i, k in enumerate(order):
        ax.text(ratios[k], i, f" {ratios[k]:.2f}", va="center", fontsize=8)
    ax.set(xlabel=xlabel, title=title, xlim=(0, max(ratios.values()) * 1.12))
    ax.grid(axis="x", alpha=0.3)
    return ax


def _colorbar(im, ax, label: str):
    """A slim colour bar beside `ax`, its label at 8 pt: at the default size, the label of a left panel's bar
    reached the y label of the panel to its right."""
    bar = plt.colorbar(im, ax=ax, fraction=0.046)
    bar.set_label(label, fontsize=8)
    bar.ax.tick_params(labelsize=8)
    return bar


def attention_map(weights: torch.Tensor, *, ax=None, title: str = "", tick_labels=None):
    """Heatmap of one head's attention weights [query, key]."""
    _check_matrix("weights", weights, "[query, key] (one head: weights[b, h])")
    ax = _axes(ax, figsize=(4, 4))
    im = ax.imshow(weights.detach().float().cpu().numpy(), cmap="viridis", vmin=0)
    ax.set(xlabel="key position j", ylabel="query position i", title=title)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.yaxis.get_major_locator().set_params(integer=True)
    if tick_labels is not None:
        ax.set_xticks(range(len(tick_labels)), tick_labels, fontsize=8, rotation=90)
        ax.set_yticks(range(len(tick_labels)), tick_labels, fontsize=8)
    _colorbar(im, ax, "attention weight")
    return ax


def position_similarity(table: torch.Tensor, *, ax=None, title: str = "", cosine: bool = True):
    """Heatmap of <p_i, p_j> (cosine by default) for a [positions, dim] table."""
    _check_matrix("table", table, "[positions, dim] (drop a leading batch axis: table[0])")
    ax = _axes(ax, figsize=(4, 4))
    p = table.detach().float().cpu()
    if cosine:
        p = torch.nn.functional.normalize(p, dim=-1)
    im = ax.imshow((p @ p.T).numpy(), cmap="RdBu_r", vmin=-1 if cosine else None, vmax=1 if cosine else None)
    ax.set(xlabel="position j", ylabel="position i", title=title)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.yaxis.get_major_locator().set_params(integer=True)
    _colorbar(im, ax, "cosine similarity" if cosine else "dot product")
    return ax


def patch_similarity_grid(table: torch.Tensor, grid, *, ax=None, title: str = ""):
    """ViT's Figure 7: for each patch (r, c) of an h x w grid, its cosine similarity with every
    patch's embedding, drawn as a small h x w map at tile (r, c) of an (h*h) x (w*w) mosaic."""
    _check_matrix("table", table, "[h*w, dim]")
    if not (isinstance(grid, (tuple, list)) and len(grid) == 2
            and all(isinstance(g, int) and not isinstance(g, bool) and g >= 1 for g in grid)):
        raise ValueError(f"grid must be (rows, columns) of positive ints; got {grid!r}")
    h, w = grid
    if table.shape[0] != h * w:
        raise ValueError(f"table has {table.shape[0]} rows but grid={grid!r} needs {h * w}")
    ax = _axes(ax, figsize=(4.5, 4.5))
    p = torch.nn.functional.normalize(table.detach().float().cpu(), dim=-1)
    sim = (p @ p.T).view(h, w, h, w)                        # [r, c, r', c']
    mosaic = torch.full((h * (h + 1) - 1, w * (w + 1) - 1), float("nan"))
    for r in range(h):
        for c in range(w):
            mosaic[r * (h + 1):r * (h + 1) + h, c * (w + 1):c * (w + 1) + w] = sim[r, c]
    im = ax.imshow(mosaic.numpy(), cmap="RdBu_r", vmin=-1, vmax=1)
    ax.set_xticks([c * (w + 1) + (w - 1) / 2 for c in range(w)], range(w))              # counted from 0, as r = n // w
    ax.set_yticks([r * (h + 1) + (h - 1) / 2 for r in range(h)], range(h))
    ax.set(xlabel="input patch column", ylabel="input patch row", title=title)
    _colorbar(im, ax, "cosine similarity")
    return ax
