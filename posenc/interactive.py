"""Interactive figures for the book's pages: plotly, with plotly.js served by the site itself.

The book is read offline and from a static host, so a figure may not load JavaScript from a
CDN. `SiteFigure` displays a plotly figure as HTML that loads the site's own copy of plotly.js
(copied into `_static/` by `book/_ext/plotly_static.py` at build time), and as plotly's MIME
type for Jupyter front ends, which draw it themselves. On Colab it uses Colab's renderer.
"""
from __future__ import annotations

import sys

from .analysis import bootstrap_ci
from .plots import SCHEME_STYLE
from .table import Table

#: Where the book's pages (one folder below the site root) find plotly.js.
SITE_PLOTLY = "../_static/plotly.min.js"

#: matplotlib marker -> plotly symbol, so a scheme keeps its marker in interactive figures.
_SYMBOLS = {"o": "circle", "s": "square", "D": "diamond", "^": "triangle-up", "v": "triangle-down",
            "<": "triangle-left", ">": "triangle-right", "p": "pentagon", "h": "hexagon", "*": "star",
            "X": "x", "d": "diamond-tall", "8": "octagon", "P": "cross"}

#: (task, metric, axis title) of the panels `length_curves` offers by default.
LENGTH_PANELS = (("lm", "bpc", "bits per character (lower is better)"),
                 ("kback", "accuracy", "kback token accuracy (higher is better)"))


def _curve(rows: Table, task: str, metric: str, scheme: str) -> dict:
    """x: evaluation length / training length; y: mean over seeds; lo, hi: 95% bootstrap interval."""
    xs = sorted({r["x_train"] for r in rows if r["task"] == task and r["scheme"] == scheme})
    out: dict[str, list[float]] = {"x": [], "y": [], "lo": [], "hi": []}
    for x in xs:
        values = [r[metric] for r in rows if r["task"] == task and r["scheme"] == scheme and r["x_train"] == x]
        lo, hi = bootstrap_ci(values)
        mean = sum(values) / len(values)
        out["x"].append(x)
        out["y"].append(round(mean, 4))
        out["lo"].append(round(mean - lo, 4))
        out["hi"].append(round(hi - mean, 4))
    return out


def length_curves(rows: Table, panels=LENGTH_PANELS, *, title: str | None = None, start_hidden=()):
    """Metric against evaluation length (as a multiple of the training length L), one curve per scheme.

    Each point is the mean over seeds with its 95% percentile-bootstrap interval as error bars.
    A menu picks the task of `panels` ((task, metric, axis title) triples); clicking a scheme
    in the legend hides or shows it, and a double click shows it alone. The schemes in
    `start_hidden` start in the legend only (a click draws them), so that a phone's small plot
    opens on the main curves.
    """
    import plotly.graph_objects as go
    rows = Table(rows)
    if not len(rows):
        raise ValueError("rows is empty: nothing to draw")
    missing = [t for t, _, _ in panels if not any(r["task"] == t for r in rows)]
    if missing:
        raise ValueError(f"panels name tasks with no rows: {missing}; rows have {sorted({r['task'] for r in rows})}")
    schemes = list(dict.fromkeys(r["scheme"] for r in rows))
    if isinstance(start_hidden, str):
        raise TypeError(f"start_hidden must be a collection of scheme names, not one str; got {start_hidden!r}")
    start_hidden = tuple(start_hidden)                   # a generator would be used up by the check below
    unknown = sorted(set(start_hidden) - set(schemes))
    if unknown:
        raise ValueError(f"start_hidden names schemes with no rows: {unknown}")
    shown = lambda scheme, on: ("legendonly" if scheme in start_hidden else True) if on else False
    fig = go.Figure()
    for k, (task, metric, _) in enumerate(panels):
        for scheme in schemes:
            c = _curve(rows, task, metric, scheme)
            color, marker = SCHEME_STYLE.get(scheme, ("#555555", "o"))
            fig.add_trace(go.Scatter(
                x=c["x"], y=c["y"], name=scheme, legendgroup=scheme, visible=shown(scheme, k == 0), mode="lines+markers",
                line={"color": color, "width": 2}, marker={"symbol": _SYMBOLS.get(marker, "circle"), "size": 8},
                error_y={"type": "data", "symmetric": False, "array": c["hi"], "arrayminus": c["lo"],
                         "thickness": 1, "width": 3},
                hovertemplate=f"{scheme}<br>%{{x}} x L: %{{y:.3f}}<extra></extra>"))
    n = len(schemes)
    menu = [{"label": task, "method": "update",
             "args": [{"visible": [shown(schemes[j % n], j // n == k) for j in range(n * len(panels))]},
                      {"yaxis.title.text": axis}]}
            for k, (task, _, axis) in enumerate(panels)]
    fig.update_layout(
        template="simple_white", height=600, margin={"l": 60, "r": 10, "t": 60, "b": 10},
        title={"text": title, "x": 0.5} if title else None, font={"size": 13},
        # The ticks name the lengths (L, 2L, ...) so the axis needs no title: on a phone the legend's many rows
        # below the plot would otherwise run into it.
        xaxis={"type": "log", "tickvals": [1, 2, 3, 4, 8], "ticktext": ["L", "2L", "3L", "4L", "8L"]},
        yaxis={"title": panels[0][2]},
        legend={"orientation": "h", "y": -0.14, "yanchor": "top", "x": 0, "font": {"size": 12}},
        updatemenus=[{"buttons": menu, "direction": "down", "x": 0, "xanchor": "left", "y": 1.12,
                      "yanchor": "bottom", "showactive": True}])
    return fig


class SiteFigure:
    """Display a plotly figure offline: the site's own plotly.js on the book's pages, Colab's
    renderer on Colab. Elsewhere (a local Jupyter) the HTML says to call `fig.show()`, which
    uses Jupyter's renderer. `div_id` fixes the element's id, so the stored output is the same
    on every run."""

    def __init__(self, fig, div_id: str):
        if not isinstance(div_id, str) or not div_id.replace("-", "").isalnum():
            raise ValueError(f"div_id must be letters, digits and hyphens; got {div_id!r}")
        self.fig, self.div_id = fig, div_id

    def html(self) -> str:
        """The figure as an HTML fragment that loads plotly.js from the site (no CDN)."""
        body = self.fig.to_html(full_html=False, include_plotlyjs=False, div_id=self.div_id,
                                config={"displaylogo": False, "responsive": True, "displayModeBar": False})
        note = (f'<p id="{self.div_id}-missing"></p><script>if (typeof Plotly === "undefined") '
                f'document.getElementById("{self.div_id}-missing").textContent = "This interactive figure '
                f'uses the book\'s copy of plotly.js; in a notebook, run fig.show() to draw it.";</script>')
        return f'<script src="{SITE_PLOTLY}" charset="utf-8"></script>\n{note}\n{body}'

    def _repr_mimebundle_(self, include=None, exclude=None):
        if "google.colab" in sys.modules:
            import plotly.io as pio
            return pio.renderers["colab"].to_mimebundle(self.fig)
        return {"text/html": self.html(),
                "text/plain": f"<interactive figure {self.div_id}: {len(self.fig.data)} curves>"}
