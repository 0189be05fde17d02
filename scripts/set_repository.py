"""Write the repository address of `_config.yml` (repository.url, branch) into every place that needs it.

    python scripts/set_repository.py            # after a fork changes _config.yml
    python scripts/set_repository.py --check    # exit 1 if a notebook or the README disagrees

The address lives in one place, `_config.yml`; the Jupyter Book launch and repository buttons
read it there, and this script copies it into each chapter's Colab badge, each install cell
(the `git clone` of the repository, whose `results/` holds the runs the chapters read) and the
README's Colab link and `pip install` line. A badge opens the chapter's Colab copy,
notebooks/colab/<chapter>.ipynb (scripts/colab_notebooks.py writes them, with the same
address). The badge image is shipped with the book (book/images/).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
BADGE = "../book/images/colab-badge.svg"


def repository() -> tuple[str, str, str]:
    """(https url, owner/name, branch) from _config.yml."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    url, branch = config["repository"]["url"].rstrip("/"), config["repository"].get("branch", "main")
    m = re.fullmatch(r"https://github\.com/([\w.-]+/[\w.-]+)", url)
    if not m:
        raise SystemExit(f"_config.yml repository.url must be https://github.com/OWNER/NAME; got {url!r}")
    return url, m.group(1), branch


def colab_url(slug: str, branch: str, notebook: str) -> str:
    """Where Colab opens a chapter: its plain-Markdown copy, notebooks/colab/<notebook> (scripts/colab_notebooks.py)."""
    return f"https://colab.research.google.com/github/{slug}/blob/{branch}/notebooks/colab/{notebook}"


def badge(slug: str, branch: str, notebook: str) -> str:
    """The chapter's badge, which opens its Colab copy."""
    return f"[![Open In Colab]({BADGE})]({colab_url(slug, branch, notebook)})"


BADGE_RE = re.compile(r"\[!\[Open In Colab\]\([^)]*\)\]\(https://colab\.research\.google\.com/github/[^)]*\)")
#: The install cell's clone: `"--branch", "<branch>", "<repository url>"`, each on this line or the next.
INSTALL_RE = re.compile(r'"--branch",(\s*)"[^"]*",(\s*)"https://github\.com/[^"]*"')
README_RE = re.compile(r"https://colab\.research\.google\.com/github/[\w.-]+/[\w.-]+/blob/[\w.-]+/")
README_PIP_RE = re.compile(r"git\+https://github\.com/[\w.-]+/[\w.-]+@[\w.-]+")     # the package alone, by pip


def fix(check: bool) -> list[str]:
    url, slug, branch = repository()
    wrong = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        changed = False
        installs = sum(bool(INSTALL_RE.search(c.source)) for c in nb.cells if c.cell_type == "code")
        if installs != 1:
            raise SystemExit(f"{path.name}: {installs} install cells that clone the repository; every notebook has one")
        for cell in nb.cells:
            new = BADGE_RE.sub(badge(slug, branch, path.name), cell.source) if cell.cell_type == "markdown" else \
                INSTALL_RE.sub(lambda m: f'"--branch",{m[1]}"{branch}",{m[2]}"{url}"', cell.source)
            if new != cell.source:
                cell.source, changed = new, True
        if changed:
            wrong.append(str(path.relative_to(ROOT)))
            if not check:
                nbformat.write(nb, path)
    readme = ROOT / "README.md"
    text = readme.read_text()
    new = README_RE.sub(f"https://colab.research.google.com/github/{slug}/blob/{branch}/", text)
    new = README_PIP_RE.sub(f"git+{url}@{branch}", new)
    if new != text:
        wrong.append("README.md")
        if not check:
            readme.write_text(new)
    return wrong


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report files that disagree with _config.yml")
    args = parser.parse_args(argv)
    wrong = fix(args.check)
    if not args.check:                       # the Colab copies carry the address too: write them again
        import colab_notebooks
        colab_notebooks.main([])
    if args.check and wrong:
        print("these files disagree with _config.yml's repository:", ", ".join(wrong), file=sys.stderr)
        return 1
    print(("checked" if args.check else "updated"), len(wrong) if not args.check else "all", "files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
