"""Sphinx extension: number figures, tables and equations per chapter ("Fig. 13.2", "(13.4)").

Without a numbered toctree, Sphinx counts every captioned figure, table and numbered equation
across the whole book, so chapter 13 opened on "Fig. 43". A numbered toctree would number the
chapters themselves from 1, where the book's files and prose count from 00. After Sphinx has
assigned its book-wide numbers, this renumbers each page's items from 1 in their order, prefixed
with the chapter's own number, read from its file name (`notebooks/13_vit` -> 13, `07b_...` -> 7b).
Pages without one (the introduction, the findings) count from 1 on their own. References
({numref}, {eq}) read the same table, so they follow.
"""
import re

#: A chapter's file name: its number, an optional letter, then "_".
CHAPTER = re.compile(r"(?:^|/)(\d+)([a-z]?)_[^/]*$")
#: Pages numbered by a letter instead: the summary.
LETTERED = {"notebooks/findings": "S"}


def chapter_number(docname: str) -> str | None:
    """"13" for notebooks/13_vit, "7b" for notebooks/07b_relative_comparison, "0" for 00_..., "S" for the
    findings; None otherwise."""
    if docname in LETTERED:
        return LETTERED[docname]
    m = CHAPTER.search(docname)
    return None if m is None else f"{int(m.group(1))}{m.group(2)}"


def per_chapter(fignumbers: dict) -> dict:
    """{docname: {figtype: {id: numbers}}} renumbered from 1 per page and type, in the book-wide order, each
    prefixed with the page's chapter number where it has one."""
    out = {}
    for docname, by_type in fignumbers.items():
        prefix = chapter_number(docname)
        out[docname] = {}
        for figtype, ids in by_type.items():
            ordered = sorted(ids, key=lambda i: ids[i])
            out[docname][figtype] = {i: ((prefix, n) if prefix is not None else (n,))
                                     for n, i in enumerate(ordered, start=1)}
    return out


def renumber(app, env):
    """Replace Sphinx's book-wide numbers (assigned just before, at the default priority) by per-chapter ones;
    the pages whose numbers change are written again."""
    before = env.toc_fignumbers
    env.toc_fignumbers = per_chapter(before)
    return [d for d in env.toc_fignumbers if env.toc_fignumbers[d] != before.get(d)]


def setup(app):
    app.connect("env-get-updated", renumber, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
