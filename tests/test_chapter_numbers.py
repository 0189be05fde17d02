"""book/_ext/chapter_numbers.py: figures, tables and equations numbered per chapter, by the chapter's own number."""
import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location("chapter_numbers", Path(__file__).parents[1] / "book/_ext/chapter_numbers.py")
chapter_numbers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(chapter_numbers)


def test_a_chapter_is_numbered_by_its_file_name():
    number = chapter_numbers.chapter_number
    assert number("notebooks/13_vit") == "13" and number("notebooks/07b_relative_comparison") == "7b"
    assert number("notebooks/00_attention_without_position") == "0"
    assert number("notebooks/findings") == "S" and number("book/intro") is None   # the summary: "Fig. S.1"
    assert number("book/2024_notes/intro") is None          # a number in a folder's name is not the page's


def test_each_page_counts_from_one_in_the_book_wide_order_per_type():
    book_wide = {"notebooks/13_vit": {"figure": {"fig-b": (44,), "fig-a": (43,)}, "displaymath": {"eq-x": (30,)}},
                 "notebooks/findings": {"figure": {"f": (1,)}},
                 "notebooks/14_alibi": {"figure": {"g": (45,)}, "table": {"t": (9,)}}}
    got = chapter_numbers.per_chapter(book_wide)
    assert got["notebooks/13_vit"] == {"figure": {"fig-a": ("13", 1), "fig-b": ("13", 2)},
                                       "displaymath": {"eq-x": ("13", 1)}}
    assert got["notebooks/14_alibi"] == {"figure": {"g": ("14", 1)}, "table": {"t": ("14", 1)}}
    assert got["notebooks/findings"] == {"figure": {"f": ("S", 1)}}

