"""Every shared plot labels its axes (with units where there are units)."""
import math

import matplotlib
import pytest

matplotlib.use("Agg", force=True)
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from posenc import Table, plots  # noqa: E402


def labels(ax):
    return ax.get_xlabel(), ax.get_ylabel()


def test_training_curves_and_metric_vs_length_are_labelled():
    ax = plots.training_curves({"a": [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.0}]})
    assert labels(ax) == ("training step", "training loss (nats/token)")
    table = Table([{"scheme": s, "x_train": x, "seed": k, "accuracy": 0.5 + 0.1 * k}
                   for s in ("a", "b") for x in (1, 2) for k in (0, 1)])
    ax = plots.metric_vs_length(table, y="accuracy", ylabel="token accuracy")
    assert labels(ax) == ("evaluation length / training length", "token accuracy")
    lines = [l for l in ax.get_lines() if l.get_label() in ("a", "b")]
    assert [list(l.get_ydata()) for l in lines] == [[0.55, 0.55], [0.55, 0.55]]  # seed means
    plt.close("all")


@pytest.mark.parametrize("kw, match", [({"y": "bcp"}, "'bcp'"), ({"y": "accuracy", "hue": "schme"}, "'schme'"),
                                       ({"y": "accuracy", "x": "xtrain"}, "'xtrain'")])
def test_metric_vs_length_names_a_column_the_rows_do_not_have(kw, match):
    """A misspelt y used to draw an empty NaN line with a legend; a misspelt hue one line labelled None."""
    table = Table([{"scheme": "a", "x_train": x, "seed": 0, "accuracy": 0.5} for x in (1, 2)])
    with pytest.raises(ValueError, match=f"no column {match}"):
        plots.metric_vs_length(table, **kw)
    plt.close("all")


def test_metric_vs_length_takes_styles_labels_and_a_log_axis_for_groups_that_are_not_schemes():
    table = Table([{"variant": v, "x_train": x, "seed": k, "bpc": 2.0 + x / 8 + 0.01 * k}
                   for v in ("rope", "PI x4") for x in (1, 2, 4, 8) for k in (0, 1)])
    _, ax = plt.subplots()
    plots.metric_vs_length(table, y="bpc", hue="variant", ax=ax, logx=True, legend=False,
                           styles={"PI x4": {"color": "#EE7733", "ls": "--"}}, labels={"rope": "RoPE, as trained"})
    lines = {l.get_label(): l for l in ax.get_lines()}
    assert set(lines) == {"RoPE, as trained", "PI x4", "training length"}
    assert lines["RoPE, as trained"].get_color() == plots.style("rope")["color"]       # a scheme keeps its colour
    assert lines["PI x4"].get_color() == "#EE7733" and lines["PI x4"].get_linestyle() == "--"
    assert ax.get_xscale() == "log" and [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "8"]
    assert ax.get_legend() is None
    plt.close("all")


def test_metric_vs_length_by_group_draws_one_panel_per_family_on_a_shared_axis():
    from posenc.runs.plans.comparison import families
    schemes = ["nope", "learned", "rope", "alibi", "xl", "kerple", "rope (randomized)", "t5 (max_distance L/2)",
               "xpos (scale L/2)"]
    table = Table([{"scheme": s, "x_train": x, "seed": 0, "bpc": 2.0 + i + x / 8}
                   for i, s in enumerate(schemes) for x in (1, 2, 4, 8)])
    groups = families(schemes)                  # an option row sits with its scheme, the sweep's own after 2021
    assert [g for _, g in groups] == [["nope", "learned"], ["nope", "rope", "xl", "t5 (max_distance L/2)"],
                                      ["nope", "rope", "alibi", "kerple", "rope (randomized)", "xpos (scale L/2)"]]
    fig = plots.metric_vs_length_by_group(table, groups, y="bpc", ylabel="bits per character", title=", L = 64")
    axes = fig.get_axes()
    assert [ax.get_title().replace("\n", " ") for ax in axes] == [f"({letter}) {name}, L = 64"     # long ones
                                                                  for letter, (name, _) in zip("abc", groups)]  # wrap
    assert [sorted(l.get_label() for l in ax.get_lines() if l.get_label() != "training length") for ax in axes] \
        == [sorted(g) for _, g in groups]
    assert all(ax.get_xscale() == "log" for ax in axes) and axes[0].get_shared_y_axes().joined(axes[0], axes[2])
    with pytest.raises(ValueError, match="groups: no rows for the schemes of 'x'"):
        plots.metric_vs_length_by_group(table, [("x", ["fire"])], y="bpc", ylabel="bits per character")
    plt.close("all")


def test_a_group_named_in_own_y_gets_its_own_y_axis_and_the_others_stay_shared():
    table = Table([{"scheme": s, "x_train": x, "seed": 0, "bpc": base + 0.01 * x}
                   for s, base in (("nope", 3.0), ("rope", 5.0), ("alibi", 2.1), ("xl", 2.12)) for x in (1, 2, 4, 8)])
    groups = [("a", ["nope", "rope"]), ("b", ["nope", "alibi"]), ("flat", ["alibi", "xl"])]
    fig = plots.metric_vs_length_by_group(table, groups, y="bpc", ylabel="bits per character", own_y=("flat",))
    a, b, flat = fig.get_axes()
    assert a.get_shared_y_axes().joined(a, b) and not a.get_shared_y_axes().joined(a, flat)
    low, high = flat.get_ylim()
    assert high - low < 0.5 < a.get_ylim()[1] - a.get_ylim()[0]     # the zoom spans its own curves only
    for bad in ("flat", ("nope",)):
        with pytest.raises(ValueError, match="own_y must name groups"):
            plots.metric_vs_length_by_group(table, groups, y="bpc", ylabel="bits per character", own_y=bad)
    plt.close("all")


def test_legends_below_side_by_side_panels_take_only_the_columns_that_fit_under_their_axes():
    long = ["rope (randomized)", "fire (threshold L/4)", "xpos (scale L/2)", "t5 (max_distance L/2)"]
    short = ["nope", "rope", "alibi", "fire", "cope", "xl"]
    fig, axes = plots.panels(4, cols=2)
    for ax, names in zip(axes, (short, long + short, long, short[:2])):
        for k, name in enumerate(names):
            ax.plot([0, 1], [k, k], label=name)
        ax.set_xlabel("evaluation length")
        plots.legend_below(ax)
    fig.canvas.draw()
    boxes = [ax.get_legend().get_window_extent() for ax in axes]
    assert all(box.width <= ax.get_window_extent().width for box, ax in zip(boxes, axes))  # or the layout shrinks ax
    assert not boxes[2].overlaps(boxes[3]) and not boxes[0].overlaps(boxes[1])
    assert [ax.get_legend()._ncols for ax in axes] == [3, 2, 1, 2]      # short labels fill three columns
    _, (narrow, empty) = plots.panels(2, cols=2, width=3.0)
    narrow.plot([0, 1], [0, 1], label="a label far wider than its panel could ever hold")
    assert plots.legend_below(narrow)._ncols == 1                      # one column, even where none fits
    assert plots.legend_below(empty) is None and empty.get_legend() is None   # nothing labelled: no legend
    plt.close("all")


def test_panels_are_lettered_in_reading_order_and_the_letter_heads_each_title():
    fig, axes = plots.panels(5, cols=2)
    axes[1].set_title("kback")
    axes[2].set(title="the LM")                       # Axes.set goes through set_title too
    axes[3].set_title("(d) already lettered")
    axes[4].set_title("left", loc="left")              # only the centred title carries the letter
    assert [ax.get_title() for ax in axes] == ["(a)", "(b) kback", "(c) the LM", "(d) already lettered", "(e)"]
    assert axes[4].get_title(loc="left") == "left" and len(fig.axes) == 5
    _, (one,) = plots.panels(1)
    one.set_title("one panel")
    _, unlettered = plots.panels(3, letters=False)
    assert one.get_title() == "one panel" and all(ax.get_title() == "" for ax in unlettered)
    plt.close("all")


def test_a_panels_title_wider_than_the_panel_breaks_onto_two_lines_that_fit():
    """matplotlib lets a long title run over the next panel and past the figure's edge (the figure is then
    shrunk to the page's column, all its text with it): a lettered panel's title breaks at the space that
    makes its longer line shortest, and each line then fits the panel."""
    fig, axes = plots.panels(2)
    long = "relative, in the source articles: kback, trained on n <= 12"
    axes[0].set_title(long, fontsize=9)
    axes[1].set_title("kback")
    renderer = fig.canvas.get_renderer()
    first, second = axes[0].get_title().split("\n")
    assert f"{first} {second}" == f"(a) {long}"
    assert max(len(first), len(second)) < 0.7 * len(long)            # broken near the middle, not after "(a)"
    for line in (first, second):
        text = axes[0].text(0, 0, line, fontsize=9)
        assert text.get_window_extent(renderer).width / fig.dpi <= plots._axes_width(axes[0])
        text.remove()
    assert axes[1].get_title() == "(b) kback"                      # a title that fits is kept on one line
    fig.canvas.draw()                                                # and the figure keeps to its width
    assert fig.get_tightbbox(renderer).width <= plots.PAGE_WIDTH + 0.05
    axes[1].set_title("its own\nbreak, kept as the chapter wrote it although it is far wider than a panel")
    assert axes[1].get_title().count("\n") == 1
    plt.close("all")


def test_no_figure_text_is_set_below_eight_points():
    """The book's smallest text: 8 pt, which a 7-inch figure (`PAGE_WIDTH`) shrunk into a laptop's column
    (660 px at 1280 px wide) draws at 10.5 px. A size set by number anywhere in the package or a chapter
    is at least that."""
    import json
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    sources = [(str(p.relative_to(root)), p.read_text()) for p in sorted((root / "posenc").rglob("*.py"))]
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        sources += [(f"{path.name} cell {i}", "".join(c["source"])) for i, c in enumerate(cells)
                    if c["cell_type"] == "code"]
    size = re.compile(r"\b(?:fontsize|labelsize|title_fontsize)\s*=\s*(\d+(?:\.\d+)?)\b")
    small = [f"{where}: {m.group(0)}" for where, text in sources for m in size.finditer(text)
             if float(m.group(1)) < 8]
    assert len(sources) > 300 and not small, small


def test_heatmaps_are_labelled_and_cosine_is_bounded():
    ax = plots.attention_map(torch.softmax(torch.randn(5, 5), -1))
    assert labels(ax) == ("key position j", "query position i")
    ax = plots.position_similarity(torch.randn(7, 4))
    img = ax.get_images()[0].get_array()
    assert img.shape == (7, 7) and abs(img.max() - 1) < 1e-6 and img.min() >= -1 - 1e-6
    plt.close("all")


def test_table_html_escapes_its_cells():
    from posenc import Table
    html = Table([{"claim <x>": "a <= b & c"}])._repr_html_()
    assert "<th>claim &lt;x&gt;</th>" in html and "<td>a &lt;= b &amp; c</td>" in html


def test_every_scheme_has_one_style_and_other_labels_keep_the_cycle():
    import posenc
    from posenc.plots import SCHEME_STYLE, style
    assert set(posenc.SCHEMES) <= set(SCHEME_STYLE)
    assert len({c for c, _ in SCHEME_STYLE.values()}) == len(SCHEME_STYLE)          # one colour each
    assert len({SCHEME_STYLE[s][1] for s in posenc.SCHEMES}) == len(posenc.SCHEMES)  # and each scheme a marker
    assert style("rope") == {"color": SCHEME_STYLE["rope"][0], "marker": SCHEME_STYLE["rope"][1]}
    assert style("RoPE + PI x4") == {} and style("k=4") == {}
    assert style("rope2d") == style("rope") and style("sincos2d") == style("sinusoidal") and style("none") == style("nope")


def _cielab(hex_colour: str) -> tuple:
    """sRGB '#RRGGBB' -> CIE L*a*b* (D65)."""
    rgb = [int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    r, g, b = (c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb)
    xyz = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047, 0.2126 * r + 0.7152 * g + 0.0722 * b, \
        (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883
    fx, fy, fz = (t ** (1 / 3) if t > 216 / 24389 else (24389 / 27 * t + 16) / 116 for t in xyz)
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def test_the_schemes_colours_are_far_enough_apart_to_tell_apart():
    """Chapter 15 draws every scheme in one panel: any two schemes' colours differ by a CIELAB distance of at
    least 20, and any two rows (option rows included) by 15 (about 2.3 is a just-noticeable difference)."""
    import itertools
    import math
    import posenc
    from posenc.plots import SCHEME_STYLE
    assert _cielab("#FFFFFF")[0] == pytest.approx(100, abs=0.01) and _cielab("#000000")[0] == 0
    def closest(names):
        return min(math.dist(_cielab(SCHEME_STYLE[a][0]), _cielab(SCHEME_STYLE[b][0]))
                   for a, b in itertools.combinations(names, 2))
    assert closest(sorted(posenc.SCHEMES)) >= 20
    assert closest(list(SCHEME_STYLE)) >= 15


def test_import_posenc_leaves_the_drawing_and_ode_libraries_unloaded_until_used():
    """A training process (a runner's worker) imports posenc and never draws: matplotlib, plotly's helpers and
    torchdiffeq (with scipy) load on first use, and `posenc.plots` still works once asked for."""
    import subprocess
    import sys
    code = ("import sys, posenc; heavy = ('matplotlib', 'torchdiffeq', 'scipy', 'posenc.plots', 'posenc.interactive'); "
            "print(sorted(m for m in heavy if m in sys.modules)); posenc.plots.style('rope'); "
            "print('matplotlib' in sys.modules, 'plots' in dir(posenc))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "[]" and out[1] == "True True"


def test_ratio_bars_sorts_and_colours_each_scheme():
    import matplotlib.pyplot as plt
    from posenc.plots import ratio_bars, style
    ax = ratio_bars({"rope": 2.27, "alibi": 0.99, "an option": 1.35}, xlabel="8L / L")
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["alibi", "an option", "rope"]                          # sorted, smallest at the bottom
    bars = ax.patches
    assert [round(b.get_width(), 2) for b in bars] == [0.99, 1.35, 2.27]
    assert bars[2].get_facecolor()[:3] == pytest.approx(plt.matplotlib.colors.to_rgb(style("rope")["color"]))
    with pytest.raises(ValueError, match="ratios"):
        ratio_bars({}, xlabel="x")
    plt.close("all")


def test_heatmaps_refuse_what_imshow_would_draw_as_a_colour_image():
    """A [heads, n, n] map of 3 or 4 heads was drawn as an RGB(A) picture; a [1, N, D] table failed in a
    matmul; a float grid in a view(); cols=0 in a ZeroDivisionError. Each now names its argument."""
    with pytest.raises(ValueError, match=r"weights must be a 2-D tensor \[query, key\].*\(4, 4, 4\)"):
        plots.attention_map(torch.rand(4, 4, 4))
    with pytest.raises(ValueError, match=r"table must be a 2-D tensor \[positions, dim\].*\(1, 8, 6\)"):
        plots.position_similarity(torch.rand(1, 8, 6))
    with pytest.raises(ValueError, match="grid must be \\(rows, columns\\) of positive ints"):
        plots.patch_similarity_grid(torch.rand(16, 8), (4.0, 4.0))
    with pytest.raises(ValueError, match="cols must be a positive int; got 0"):
        plots.panels(3, cols=0)
    ax = plots.attention_map(torch.rand(4, 4))                        # one head: drawn
    assert ax.images[0].get_array().shape == (4, 4)
    plt.close("all")


def test_a_curve_refuses_a_missing_value_instead_of_dropping_its_point():
    """A None at 1x made that mean NaN, and matplotlib left the point out of the curve without a word."""
    rows = Table([{"scheme": "rope", "seed": 0, "x_train": 1.0, "acc": None},
                  {"scheme": "rope", "seed": 1, "x_train": 1.0, "acc": 0.4},
                  {"scheme": "rope", "seed": 0, "x_train": 2.0, "acc": 0.45}])
    with pytest.raises(ValueError, match="metric 'acc' must hold numbers"):
        plots.metric_vs_length(rows, y="acc")
    rows[0]["acc"] = 0.5
    ax = plots.metric_vs_length(rows, y="acc")
    assert list(ax.lines[0].get_ydata()) == pytest.approx([0.45, 0.45])
    plt.close("all")


def test_patch_similarity_grid_puts_each_patchs_own_map_on_its_own_tile():
    """ViT's Figure 7 layout: tile (r, c) of the mosaic is patch (r, c)'s similarity with every patch, so with
    orthogonal embeddings its one bright cell sits at (r, c) inside the tile; the ticks count patches from 0."""
    ax = plots.patch_similarity_grid(torch.eye(6), (2, 3))
    mosaic = ax.get_images()[0].get_array()
    assert mosaic.shape == (2 * 3 - 1, 3 * 4 - 1)
    for r in range(2):
        for c in range(3):
            tile = mosaic[r * 3:r * 3 + 2, c * 4:c * 4 + 3]
            assert tile[r, c] == pytest.approx(1) and (abs(tile).sum() - 1) == pytest.approx(0), (r, c)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "2"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0", "1"]
    plt.close("all")


def test_metric_vs_length_draws_the_mean_over_seeds_and_training_curves_draw_no_markers():
    """A point of metric_vs_length is the mean of its seeds (0, 0, 3 give 1, where a median would give 0), with
    the min-max band around it; training curves are lines only, however many points a history has."""
    rows = Table({"scheme": "rope", "x_train": x, "seed": s, "bpc": v} for x in (1, 2) for s, v in enumerate((0.0, 0.0, 3.0)))
    ax = plots.metric_vs_length(rows, y="bpc")
    assert list(ax.lines[0].get_ydata()) == [1.0, 1.0]
    ax = plots.training_curves({"rope": [{"step": i, "loss": 1.0 / (i + 1)} for i in range(5)]})
    assert ax.lines[0].get_marker() == "None" and ax.lines[0].get_color() == plots.SCHEME_STYLE["rope"][0]
    plt.close("all")


def test_tables_print_four_significant_digits_right_aligned_and_round_only_floats():
    """Table's text: floats to four significant digits, every column right-aligned under its header; round()
    rounds floats and leaves ints and booleans as they are (a verdict column stays True/False)."""
    assert "1.235" in str(Table([{"x": 1.23456}])) and "1.2346" not in str(Table([{"x": 1.23456}]))
    assert str(Table([{"a": 1}, {"a": 100}])).splitlines() == ["  a", "---", "  1", "100"]
    rounded = Table([{"b": True, "n": 7, "x": 1.23456}]).round(2)[0]
    assert rounded["b"] is True and rounded["n"] == 7 and rounded["x"] == 1.23
    near_zero = Table([{"r2": -0.0004}, {"r2": 0.0004}]).round(3)          # printed "0", not "-0" (chapter 12)
    assert str(near_zero).split()[2:] == ["0", "0"] and math.copysign(1, near_zero[0]["r2"]) == 1


def test_rope_extensions_have_one_style_in_both_chapters_and_no_schemes_colour():
    """Chapters 11 and 16 draw RoPE's extensions beside RoPE and its kin: each extension's colour is at least 20
    (CIELAB) from the others and from every scheme's colour in the book (orange is T5's everywhere, never PI's)."""
    import itertools
    import math
    from posenc.plots import SCALING_STYLE, SCHEME_STYLE, scaling_style
    colours = [c for c, _ in SCALING_STYLE.values()]
    assert min(math.dist(_cielab(a), _cielab(b)) for a, b in itertools.combinations(colours, 2)) >= 20
    assert min(math.dist(_cielab(c), _cielab(s)) for c in colours for s, _ in SCHEME_STYLE.values()) >= 20
    assert scaling_style("YaRN", fine_tuned=True) == {"color": SCALING_STYLE["YaRN"][0], "marker": "D", "ls": "-"}
    assert scaling_style("RoPE")["color"] == SCHEME_STYLE["rope"][0] and scaling_style("RoPE")["ls"] == "--"
    with pytest.raises(ValueError, match="name must be 'RoPE' or one of"):
        scaling_style("yarn")


def test_variants_take_shades_of_their_schemes_hue_never_its_colour():
    """shades(scheme, n): n colours from darker to lighter, each distinct from the scheme's own colour and from
    each other, in the scheme's hue (a variant reads as its scheme's kin, not as another scheme)."""
    import math
    from posenc.plots import SCHEME_STYLE, shades
    for scheme in ("deberta", "tupe", "learned", "complex"):
        got = shades(scheme, 4)
        lab = [_cielab(c) for c in got]
        assert [l for l, _, _ in lab] == sorted(l for l, _, _ in lab)               # darker to lighter
        own = _cielab(SCHEME_STYLE[scheme][0])
        assert all(math.dist(c, own) > 5 for c in lab) and len(set(got)) == 4
        hue = lambda c: math.atan2(c[2], c[1])
        assert all(abs(math.remainder(hue(c) - hue(own), 2 * math.pi)) < 0.35 for c in lab)  # the same hue
    with pytest.raises(ValueError, match="scheme must be one of"):
        shades("DeBERTa", 2)
    with pytest.raises(ValueError, match="n must be a positive int"):
        shades("tupe", 0)
