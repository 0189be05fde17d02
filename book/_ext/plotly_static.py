"""Sphinx extension: serve plotly.js from the site, so interactive figures work offline.

Copies the plotly.min.js that ships inside the installed `plotly` package to `_static/` of
the HTML build once the pages are written. Only pages whose stored outputs hold a
`posenc.interactive.SiteFigure` load it (through a <script src="../_static/plotly.min.js">);
nothing is injected into other pages, and nothing is fetched from a CDN.
"""
import shutil
from pathlib import Path


def copy_plotly(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    import plotly
    source = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not source.exists():
        raise FileNotFoundError(f"{source} is missing: reinstall plotly (pip install plotly)")
    target = Path(app.outdir) / "_static" / "plotly.min.js"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


def setup(app):
    app.connect("build-finished", copy_plotly)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
