"""Build posenc/data/stdlib_docstrings.txt.gz, the book's language-modelling corpus.

The corpus is the English prose of CPython 3.11's standard library docstrings: every
module, class and function docstring of every pure-Python module under the stdlib
directory, in sorted module order, minus the test suites, vendored/demo packages and
doctest examples (blocks starting with `>>>`), limited to printable ASCII.
One document per module, separated by a form feed (\\f) so splits can follow module
boundaries.

Why this text: it ships with every Python install (no download, no licence beyond the
PSF licence of CPython), it is natural English written by many authors, and it is
large enough (about 1.5 MB) for the character-level models of the book. Docstrings
differ between Python versions, so the extracted text is generated once (with
Python 3.11) and shipped inside the package, with its SHA-256 pinned in
`posenc.tasks.corpus`: every machine trains on the same bytes.

Usage: python scripts/build_corpus.py   (only needed to regenerate the pinned file)
"""
import ast
import gzip
import hashlib
import inspect
import pathlib
import sys
import sysconfig

EXCLUDE = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "ensurepip", "pydoc_data",
           "site-packages", "dist-packages", "venv", "__phello__", "tkinter", "msilib", "encodings"}
OUT = pathlib.Path(__file__).resolve().parent.parent / "posenc" / "data" / "stdlib_docstrings.txt.gz"


def module_files(root: pathlib.Path):
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if not EXCLUDE.intersection(rel.parts) and not any(p.startswith("test_") for p in rel.parts):
            yield ".".join(rel.with_suffix("").parts), path


def prose(doc: str) -> str:
    """Drop doctest blocks (from a `>>>` line to the next blank line) and non-ASCII."""
    keep, in_doctest = [], False
    for line in doc.splitlines():
        in_doctest = (in_doctest and line.strip() != "") or line.lstrip().startswith(">>>")
        if not in_doctest:
            keep.append("".join(c for c in line if 32 <= ord(c) < 127))
    return "\n".join(keep).strip()


def docstrings(path: pathlib.Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(text := prose(inspect.cleandoc(doc))) >= 40:
                yield text


def main() -> None:
    if sys.version_info[:2] != (3, 11):
        sys.exit("regenerate the pinned corpus with Python 3.11")
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for name, path in module_files(root):
        body = "\n\n".join(docstrings(path))
        if body:
            docs.append(f"{name}\n\n{body}\n")
    data = "\f".join(docs).encode("ascii")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    print(f"{OUT}: {len(docs)} modules, {len(data):,} characters, sha256 {hashlib.sha256(data).hexdigest()}")


if __name__ == "__main__":
    main()
