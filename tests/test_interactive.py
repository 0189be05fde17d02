"""The interactive figure: one curve per scheme and task, intervals around the means, no CDN."""
import importlib.util
from pathlib import Path

import pytest

import posenc
from posenc.interactive import SITE_PLOTLY, SiteFigure, length_curves

pytest.importorskip("plotly")


def rows():
    out = posenc.Table()
    for scheme in ("rope", "alibi"):
        for seed in range(3):
            for x in (1.0, 2.0, 4.0):
                out.append({"scheme": scheme, "task": "lm", "seed": seed, "x_train": x,
                            "bpc": 3.0 + x * (scheme == "rope") + 0.01 * seed})
                out.append({"scheme": scheme, "task": "kback", "seed": seed, "x_train": x,
                            "accuracy": 1.0 / x + 0.01 * seed})
    return out


def test_one_trace_per_scheme_and_task_with_the_first_task_shown_and_a_menu_for_the_rest():
    fig = length_curves(rows())
    assert [t.name for t in fig.data] == ["rope", "alibi", "rope", "alibi"]
    assert [t.visible for t in fig.data] == [True, True, False, False]
    buttons = fig.layout.updatemenus[0].buttons
    assert [b.label for b in buttons] == ["lm", "kback"]
    assert list(buttons[1].args[0]["visible"]) == [False, False, True, True]
    rope = fig.data[0]
    assert list(rope.x) == [1.0, 2.0, 4.0]
    assert rope.y[0] == pytest.approx(4.01)                       # mean of 4.00, 4.01, 4.02
    assert all(v >= 0 for v in list(rope.error_y.array) + list(rope.error_y.arrayminus))
    lo, hi = posenc.analysis.bootstrap_ci([4.00, 4.01, 4.02])          # the bars are the interval's two arms
    assert rope.error_y.array[0] == pytest.approx(hi - 4.01, abs=1e-4)
    assert rope.error_y.arrayminus[0] == pytest.approx(4.01 - lo, abs=1e-4)
    assert rope.line.color == posenc.plots.SCHEME_STYLE["rope"][0]


def test_schemes_can_start_in_the_legend_only_on_every_panel():
    fig = length_curves(rows(), start_hidden=("alibi",))
    assert [t.visible for t in fig.data] == [True, "legendonly", False, False]
    buttons = fig.layout.updatemenus[0].buttons
    assert list(buttons[1].args[0]["visible"]) == [False, False, True, "legendonly"]
    with pytest.raises(ValueError, match=r"start_hidden names schemes with no rows: \['xpos'\]"):
        length_curves(rows(), start_hidden=("xpos",))
    with pytest.raises(TypeError, match="not one str"):
        length_curves(rows(), start_hidden="alibi")
    hidden = length_curves(rows(), start_hidden=(s for s in ["alibi"]))        # a generator is read once, fully
    assert [t.visible for t in hidden.data] == [True, "legendonly", False, False]


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="rows is empty"):
        length_curves(posenc.Table())
    with pytest.raises(ValueError, match="no rows"):
        length_curves(rows(), panels=(("copy", "accuracy", "copy"),))
    with pytest.raises(ValueError, match="div_id"):
        SiteFigure(length_curves(rows()), "bad id!")


def test_the_page_loads_plotly_from_the_site_and_nothing_from_another_host():
    fig = SiteFigure(length_curves(rows()), "fig-test")
    html = fig._repr_mimebundle_()["text/html"]
    assert html.startswith(f'<script src="{SITE_PLOTLY}"')
    assert 'id="fig-test"' in html
    assert "http://" not in html.replace("http://www.w3.org", "") and "https://" not in html
    assert fig._repr_mimebundle_() == fig._repr_mimebundle_()      # the same output on every run


def test_the_book_extension_copies_plotly_js_into_the_static_folder(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "plotly_static", Path(__file__).resolve().parent.parent / "book" / "_ext" / "plotly_static.py")
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)

    class App:
        outdir = str(tmp_path)
        builder = type("B", (), {"format": "html"})()
    ext.copy_plotly(App(), None)
    copied = tmp_path / "_static" / "plotly.min.js"
    assert copied.stat().st_size > 1_000_000
