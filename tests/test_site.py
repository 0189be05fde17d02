"""The built book, as a reader sees it.

Every page of _toc.yml is opened from file:// in headless Chromium, at a desktop and at a
phone width, and checked after MathJax has typeset it: no MathJax error, no raw TeX left
in the visible text, every image loaded, nothing wider than the screen, and no request to
another host. Chromium is driven through the DevTools protocol over a websocket (tornado,
which Jupyter already installs); without Chromium the test skips.
"""
import asyncio
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from tornado.websocket import websocket_connect

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 30          # seconds: the longest any wait on Chromium may take (start, command, page load)
MATHJAX_TIMEOUT = 20  # seconds for MathJax to start and finish typesetting one page


def toc_pages(toc_file=ROOT / "_toc.yml"):
    """The book's pages in _toc.yml order, as paths of their HTML files ('notebooks/02_sinusoidal')."""
    toc = yaml.safe_load(toc_file.read_text())
    pages = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                pages.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk({k: v for k, v in toc.items() if k != "root"})
    return [str(Path(p).with_suffix("")) if Path(p).suffix in {".md", ".ipynb", ".rst"} else p
            for p in pages]


PAGES = toc_pages()
# The phone is emulated as such (mobile=True: the page's viewport meta tag applies, as on a
# phone). The pixel ratio is left at 1: layout in CSS pixels does not depend on it.
VIEWPORTS = {
    "desktop": {"width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": False},
    # between the theme's two breakpoints (992, 1200): no margin beside the text, where a `full-width`
    # figure once widened the page by up to 270 px
    "small laptop": {"width": 1100, "height": 800, "deviceScaleFactor": 1, "mobile": False},
    "phone": {"width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": True},
}
ALLOWED_SCHEMES = {"file", "data", "blob", "about"}
# A display equation wider than a phone's column scrolls inside its own box. A few pixels are
# MathJax's margins; more means a line the reader has to swipe to finish.
PHONE_EQUATION_SCROLL = 16    # px, at the phone viewport (390 px)
# Keys' kernel needs `w(u) = `, its cubic and a condition side by side: about 420 px in any
# layout with the conditions beside the cases (a column of about 360 px), so it alone may scroll.
WIDE_EQUATIONS = {"notebooks/13_vit": {"equation-eq-bicubic"}}
RAW_TEX = ["$$", "\\[", "\\(", "\\begin{", "\\frac"]


# ---------------------------------------------------------------------------------------
# A small Chrome DevTools Protocol client


class CDP:
    """One websocket to Chromium: `send` a command and await its reply; events are kept."""

    def __init__(self, ws):
        self.ws = ws
        self.ids = itertools.count(1)
        self.events = []          # every event received, in order, until cleared
        self.session = None       # the attached tab's session id (flat mode)

    @classmethod
    async def connect(cls, url):
        ws = await asyncio.wait_for(websocket_connect(url, max_message_size=256 << 20), TIMEOUT)
        return cls(ws)

    async def _read(self):
        raw = await self.ws.read_message()
        if raw is None:
            raise ConnectionError("Chromium closed the DevTools connection")
        message = json.loads(raw)
        if "method" in message:
            self.events.append(message)
        return message

    async def send(self, method, timeout=TIMEOUT, **params):
        """Run one command in the attached tab (or the browser before attaching); return its result."""
        id_ = next(self.ids)
        message = {"id": id_, "method": method, "params": params}
        if self.session:
            message["sessionId"] = self.session

        async def reply():
            await self.ws.write_message(json.dumps(message))
            while True:
                answer = await self._read()
                if answer.get("id") == id_:
                    return answer

        try:
            answer = await asyncio.wait_for(reply(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"no reply to {method} within {timeout}s") from None
        if "error" in answer:
            raise RuntimeError(f"{method} failed: {answer['error']}")
        return answer["result"]

    async def wait_for_event(self, method, timeout=TIMEOUT):
        """The first kept event called `method`, reading more messages until it arrives."""
        async def arrived():
            seen = 0
            while True:
                for event in self.events[seen:]:
                    if event["method"] == method:
                        return event
                seen = len(self.events)
                await self._read()

        try:
            return await asyncio.wait_for(arrived(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"no {method} event within {timeout}s") from None

    async def evaluate(self, expression, timeout=TIMEOUT):
        """The JSON value of a JavaScript expression in the page, awaiting it if it is a promise."""
        result = await self.send("Runtime.evaluate", timeout=timeout, expression=expression,
                                 awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise RuntimeError(f"JavaScript error: {text}")
        return result["result"].get("value")

    def close(self):
        self.ws.close()


class Browser:
    """Headless Chromium with one tab, driven from a private event loop."""

    def __init__(self, executable, profile):
        self.loop = asyncio.new_event_loop()
        self.log = profile / "chromium.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [executable, "--headless", "--no-sandbox", "--disable-gpu",
                 "--remote-debugging-port=0", f"--user-data-dir={profile / 'profile'}",
                 "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--mute-audio", "about:blank"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True)           # its own process group: killed as one
        self.cdp = None

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def log_tail(self, lines=30):
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def devtools_url(self):
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            found = re.search(r"DevTools listening on (ws://\S+)", self.log.read_text(errors="replace"))
            if found:
                return found.group(1)
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        pytest.fail(f"Chromium gave no DevTools address within {TIMEOUT}s "
                    f"(exit code {self.proc.poll()}):\n{self.log_tail()}")

    async def open_tab(self):
        self.cdp = await CDP.connect(self.devtools_url())
        target = await self.cdp.send("Target.createTarget", url="about:blank")
        attached = await self.cdp.send("Target.attachToTarget", targetId=target["targetId"], flatten=True)
        self.cdp.session = attached["sessionId"]
        for domain in ("Page", "Runtime", "Network"):
            await self.cdp.send(f"{domain}.enable")

    def close(self):
        """Ask Chromium to quit (it then reaps its own helpers); kill its process group if it does not."""
        if self.cdp is not None and self.proc.poll() is None:
            self.cdp.session = None                       # a browser command, not the tab's
            try:
                self.run(self.cdp.send("Browser.close", timeout=5))
            except Exception:                             # it may hang up before it replies
                pass
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:             # killed below
                pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=TIMEOUT)
        if self.cdp is not None:
            self.cdp.close()
        self.loop.close()


# ---------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        pytest.skip("Chromium is not installed (neither `chromium` nor `chromium-browser` on PATH); "
                    "the rendered site is not checked")
    chromium = Browser(executable, tmp_path_factory.mktemp("chromium"))
    try:
        chromium.run(chromium.open_tab())
        yield chromium
    finally:
        chromium.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The book built into a temporary directory; its HTML folder."""
    out = tmp_path_factory.mktemp("book")
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    command = [str(jupyter_book) if jupyter_book.exists() else "jupyter-book",
               "build", str(ROOT), "--path-output", str(out), "-W", "--keep-going"]
    build = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if build.returncode != 0:
        log = re.sub(r"\x1b\[[0-9;]*m", "", build.stdout + build.stderr).splitlines()
        problems = [line for line in log if "WARNING" in line or "ERROR" in line]
        pytest.fail(f"`{' '.join(command)}` failed ({build.returncode}):\n" + "\n".join(problems[:30])
                    + "\n...\n" + "\n".join(log[-15:]))
    return out / "_build" / "html"


# ---------------------------------------------------------------------------------------
# What is checked in the page, once it is loaded and typeset

WAIT_FOR_MATHJAX = """
(async () => {
  const started = Date.now();
  const script = document.querySelector('script[src*="tex-chtml"], script[src*="mathjax" i]');
  while (!(window.MathJax && MathJax.startup && MathJax.startup.promise)) {
    if (!script) return 'no MathJax';
    if (Date.now() - started > %(ms)d)
      throw new Error('MathJax did not start within %(ms)d ms (' + script.src + ')');
    await new Promise(resolve => setTimeout(resolve, 25));
  }
  await MathJax.startup.promise;
  return 'typeset';
})()
"""

INSPECT = r"""
((tokens) => {
  const describe = (el) => {
    let s = el.tagName.toLowerCase();
    if (el.id) s += '#' + el.id;
    if (typeof el.className === 'string' && el.className.trim())
      s += '.' + el.className.trim().split(/\s+/).join('.');
    return s;
  };
  const out = {};

  out.mathErrors = [...document.querySelectorAll('mjx-merror, .MathJax_Error')].map(el =>
    describe(el) + ': ' + (el.getAttribute('data-mjx-error') || el.textContent).trim().slice(0, 160));
  // An undefined macro makes no error element: MathJax shows its name in red in the math
  // (<mtext mathcolor="red">\name</mtext> in the MathML of the typeset expressions).
  if (window.MathJax && MathJax.startup && MathJax.startup.document && MathJax.startup.toMML)
    for (const math of MathJax.startup.document.math)
      for (const m of MathJax.startup.toMML(math.root).matchAll(/<mtext mathcolor="red">(\\[A-Za-z]+)<\/mtext>/g))
        out.mathErrors.push(`undefined macro ${m[1]} in ${JSON.stringify(math.math.slice(0, 80))}`);

  out.brokenImages = [...document.images].filter(img => !(img.complete && img.naturalWidth > 0))
    .map(img => (img.getAttribute('src') || '').slice(0, 160) + (img.alt ? ` (alt "${img.alt.slice(0, 60)}")` : ''));

  // Interactive figures drew (plotly.js loaded from the site) and every output figure has a
  // numbered caption.
  out.blankInteractive = [...document.querySelectorAll('.plotly-graph-div')]
    .filter(d => !(window.Plotly && d.querySelector('svg.main-svg'))).map(describe);
  out.uncaptioned = [...document.querySelectorAll('.cell_output img')]
    .filter(img => { const f = img.closest('figure');
                     return !(f && f.querySelector('figcaption .caption-number')); })
    .map(img => (img.getAttribute('src') || '').slice(0, 100));

  // The width the page may use: the viewport less any scrollbar. Not innerWidth alone: on a
  // phone Chromium widens the layout viewport (and innerWidth) to fit content that sticks out.
  const limit = Math.min(window.innerWidth, document.documentElement.clientWidth);
  out.width = limit;
  out.innerWidth = window.innerWidth;
  out.scrollWidth = document.documentElement.scrollWidth;
  out.overflowing = [];
  if (out.scrollWidth > limit + 1) {
    // The elements that stick out past the right edge of the screen: not clipped or
    // scrolled by an ancestor, not fixed, and whose parent does not stick out itself.
    const sticksOut = (el) => {
      const r = el.getBoundingClientRect();
      if (r.width === 0 || r.right <= limit + 1) return false;
      for (let a = el; a && a !== document.documentElement; a = a.parentElement) {
        const cs = getComputedStyle(a);
        if (cs.position === 'fixed' || cs.display === 'none' || cs.visibility === 'hidden') return false;
        if (a !== el && cs.overflowX !== 'visible') return false;
      }
      return true;
    };
    const culprits = [...document.body.querySelectorAll('*')]
      .filter(el => sticksOut(el) && !(el.parentElement && el.parentElement !== document.body && sticksOut(el.parentElement)));
    culprits.sort((a, b) => b.getBoundingClientRect().right - a.getBoundingClientRect().right);
    out.overflowing = culprits.slice(0, 8).map(el => {
      const r = el.getBoundingClientRect();
      const text = (el.innerText || el.textContent || '').trim().replace(/\s+/g, ' ').slice(0, 60);
      return `${describe(el)} spans x=${Math.round(r.left)}..${Math.round(r.right)}px` + (text ? ` ("${text}")` : '');
    });
  }

  // Display equations that scroll sideways inside their box, and by how much.
  out.wideMath = [...document.querySelectorAll('div.math')].map(m => {
    const c = m.querySelector('mjx-container');
    return c ? [m.id || describe(m), c.scrollWidth - c.clientWidth,
                c.textContent.replace(/\s+/g, ' ').slice(0, 50)] : null;
  }).filter(x => x && x[1] > 0);

  // Last, since it hides code for a moment: the visible text outside code blocks.
  const style = document.createElement('style');
  style.textContent = 'pre, code, .highlight { display: none !important; }';
  document.head.appendChild(style);
  const text = document.body.innerText;
  style.remove();
  out.rawTex = [];
  for (const token of tokens) {
    let at = text.indexOf(token);
    for (let n = 0; at !== -1 && n < 3; n++, at = text.indexOf(token, at + 1))
      out.rawTex.push(`'${token}' in "…${text.slice(Math.max(0, at - 40), at + 40).replace(/\s+/g, ' ')}…"`);
  }
  return out;
})(%s)
"""


async def inspect(cdp, url, viewport, equation_scroll=None, wide=frozenset()):
    await cdp.send("Emulation.setDeviceMetricsOverride", **viewport)
    cdp.events.clear()
    navigation = await cdp.send("Page.navigate", url=url)
    if navigation.get("errorText"):
        return [f"could not load {url}: {navigation['errorText']}"]
    await cdp.wait_for_event("Page.loadEventFired")
    failures = []
    try:
        await cdp.evaluate(WAIT_FOR_MATHJAX % {"ms": MATHJAX_TIMEOUT * 1000}, timeout=MATHJAX_TIMEOUT + 5)
    except (RuntimeError, TimeoutError) as e:
        failures.append(f"MathJax did not finish typesetting: {e}")
    found = await cdp.evaluate(INSPECT % json.dumps(RAW_TEX))
    requests = [e["params"]["request"]["url"] for e in cdp.events if e["method"] == "Network.requestWillBeSent"]

    failures += [f"MathJax error: {e}" for e in found["mathErrors"]]
    failures += [f"raw TeX in the visible text: {t}" for t in found["rawTex"]]
    failures += [f"image did not load: {src}" for src in found["brokenImages"]]
    failures += [f"interactive figure did not draw: {d}" for d in found["blankInteractive"]]
    failures += [f"figure without a numbered caption: {src}" for src in found["uncaptioned"]]
    if found["scrollWidth"] > found["width"] + 1:
        failures.append(f"the page is {found['scrollWidth']}px wide, wider than the {found['width']}px window "
                        f"(innerWidth {found['innerWidth']}); sticking out: "
                        + ("; ".join(found["overflowing"]) or "(no element found)"))
    if equation_scroll is not None:
        failures += [f"display equation {id_} scrolls {dx}px sideways (limit {equation_scroll}px): {text}"
                     for id_, dx, text in found["wideMath"]
                     if dx > equation_scroll and id_ not in wide]
        scrolling = {id_ for id_, dx, _ in found["wideMath"] if dx > equation_scroll}
        failures += [f"{id_} is in WIDE_EQUATIONS but scrolls no more than {equation_scroll}px "
                     "now: take it off the list" for id_ in sorted(wide - scrolling)]
    offsite = sorted({u for u in requests if u.split(":", 1)[0].lower() not in ALLOWED_SCHEMES})
    failures += [f"request to another host: {u}" for u in offsite]
    return failures


@pytest.mark.parametrize("width", list(VIEWPORTS))
@pytest.mark.parametrize("page", PAGES)
def test_page_renders_for_a_reader(browser, site, page, width):
    viewport = VIEWPORTS[width]
    html = site / f"{page}.html"
    assert html.is_file(), f"{page} is in _toc.yml but the build made no {html.relative_to(site)}"
    limit = PHONE_EQUATION_SCROLL if width == "phone" else None
    failures = browser.run(inspect(browser.cdp, html.as_uri(), viewport, equation_scroll=limit,
                                   wide=WIDE_EQUATIONS.get(page, set())))
    if failures:
        pytest.fail(f"{page}.html at {width} width ({viewport['width']}x{viewport['height']}):\n  - "
                    + "\n  - ".join(failures), pytrace=False)


def test_figures_and_equations_are_numbered_per_chapter(site):
    """book/_ext/chapter_numbers.py: chapter 13 opened on "Fig. 43" when Sphinx counted across the book. Every
    chapter's captions and equation numbers start at <chapter>.1, and a reference to a figure reads its number."""
    for page, chapter in (("13_vit", "13"), ("00_attention_without_position", "0"), ("11_rope", "11")):
        html = (site / "notebooks" / f"{page}.html").read_text()
        captions = re.findall(r'class="caption-number">Fig\. ([0-9a-zA-Z.]+) ', html)
        assert captions and captions[0] == f"{chapter}.1", (page, captions[:3])
        assert all(c.startswith(f"{chapter}.") for c in captions), (page, captions)
    rope = (site / "notebooks" / "11_rope.html").read_text()
    assert re.findall(r'class="eqno">\(([0-9a-zA-Z.]+)\)', rope)[:2] == ["11.1", "11.2"]
    findings = (site / "notebooks" / "findings.html").read_text()           # the summary: S, not a second "1"
    assert re.findall(r'class="caption-number">Fig\. ([0-9a-zA-Z.]+) ', findings) == ["S.1"]
    links = 0
    for page in (site / "notebooks").glob("*.html"):
        for href, number in re.findall(r'<a class="reference internal" href="([^"]*)"><span class="std std-numref">'
                                       r'Fig\. ([0-9a-zA-Z.]+)</span>', page.read_text()):
            target, _, anchor = href.partition("#")
            html = (page.parent / target).read_text() if target else page.read_text()
            caption = re.search(rf'<figure[^>]*id="{re.escape(anchor)}".*?class="caption-number">Fig\. ([0-9a-zA-Z.]+) ',
                                html, re.S)
            assert caption and caption.group(1) == number, (page.name, href, number)
            links += 1
    assert links >= 4                                 # chapters 13 and 15 refer to their own figures
    equations = 0                                     # and every equation reference reads its target's number
    for page in (site / "notebooks").glob("*.html"):
        for target, anchor, number in re.findall(r'<a class="reference internal" href="([^"#]*)#(equation-[^"]+)">'
                                                 r'\(([0-9a-zA-Z.]+)\)</a>', page.read_text()):
            html = (page.parent / target).read_text() if target else page.read_text()
            assert f'<span class="eqno">({number})<a class="headerlink" href="#{anchor}"' in html, (page.name, anchor, number)
            equations += 1
    assert equations >= 100


def test_every_figure_image_has_words_for_its_alt_text(site):
    """book/_ext/figure_alt.py: a notebook's figure was read out by a screen reader as its file name
    ("../_images/2b73e6....png"); every image's alt text is now words, a figure's its caption."""
    checked = 0
    for page in [*(site / "notebooks").glob("*.html"), site / "book" / "intro.html"]:
        for alt, src in re.findall(r'<img alt="([^"]*)" src="([^"]*)"', page.read_text()):
            assert alt and "_images/" not in alt and alt != src.rsplit("/", 1)[-1], (page.name, src, alt[:80])
            checked += 1
            assert "\\" not in alt, (page.name, "LaTeX in the alt text", alt[:80])
    rope = (site / "notebooks" / "11_rope.html").read_text()
    assert '<img alt="RoPE, NoPE, learned and sinusoidal character LMs: (a) training loss' in rope
    assert '<img alt="The score ⟨R_m q, R_n k⟩ of one fixed pair q, k' in rope
    assert checked >= 80


def test_code_cites_equations_by_the_number_the_page_shows(site):
    """A code comment or docstring in a chapter cites "Eq. (11.10)", as the prose does, never the label behind
    it ("Eq. (eq-rope-decay)" is what a reader of the code saw), and the number is one of the chapter's."""
    cited = 0
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        code = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")
        assert not re.findall(r"Eqs?\. \([a-z][a-z0-9-]*\)", code), path.name
        html = (site / "notebooks" / f"{path.stem}.html").read_text()
        shown = set(re.findall(r'class="eqno">\(([0-9a-zA-Z.]+)\)', html))
        for number in re.findall(r"Eqs?\. \(([0-9S]+\.[0-9]+)\)", code):
            assert number in shown, (path.name, number)
            cited += 1
    assert cited >= 10


@pytest.mark.parametrize("latex, spoken", [
    (r"\frac{1}{d/2}\sum_j |S_j|", "1/(d/2)Σ_j |S_j|"),
    (r"\langle R_m q, R_n k \rangle", "⟨R_m q, R_n k⟩"),
    (r"\theta'_i/\theta_i", "θ'_i/θ_i"),
    (r"n \le 2L", "n ≤ 2L"),
    (r"\mathrm{PE}(p + k)", "PE(p + k)"),
    (r"-m\,(i - j)", "-m (i - j)"),
    (r"0, \dots, n-1", "0, …, n-1"),
    (r"2^{-9}", "2^-9"),
    (r"\tau = 8", "τ = 8"),
])
def test_a_captions_math_is_spelt_for_a_screen_reader(latex, spoken):
    import importlib.util
    spec = importlib.util.spec_from_file_location("figure_alt", ROOT / "book" / "_ext" / "figure_alt.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.plain_math(latex) == spoken


@pytest.mark.parametrize("author, year, label", [
    ("bloc97", "2023", "blo23"),                  # pybtex alone: "bloc9723"; alpha.bst: the first three letters
    ("Keys, Robert", "1981", "Key81"),
    ("Su, Jianlin", "2021", "Su21"),
    ("{Meta AI}", "2025", "MetaAI25"),            # a braced institution keeps its name
    ("Press, Ofir and Smith, Noah A. and Lewis, Mike", "2022", "PSL22"),
])
def test_citation_labels_follow_bibtex_alpha_for_a_one_word_author(author, year, label):
    """book/_ext/bib_labels.py, the style the book cites with (`bibtex_default_style` in _config.yml)."""
    import importlib.util
    import yaml
    from pybtex.database import parse_string
    spec = importlib.util.spec_from_file_location("bib_labels", ROOT / "book" / "_ext" / "bib_labels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    entries = parse_string(f"@misc{{x, author={{{author}}}, year={{{year}}}, title={{t}}}}", "bibtex").entries
    assert list(module.LabelStyle().format_labels(entries.values())) == [label]
    config = yaml.safe_load((ROOT / "_config.yml").read_text())["sphinx"]
    assert config["config"]["bibtex_default_style"] == "posenc-alpha" and "bib_labels" in config["local_extensions"]
