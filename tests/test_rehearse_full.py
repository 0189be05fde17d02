"""scripts/rehearse_full.py: the `full` chapters executed on a CPU from 3-step runs, in a copy, never in the checkout."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import rehearse_full  # noqa: E402

FULL = ROOT / "results" / "full" / "runs"


def test_a_chapter_is_rehearsed_on_its_full_runs_in_a_copy(tmp_path):
    """Chapter 07's full runs are stored (a GPU made them), so the copy forgets them first: the rehearsal runs
    whether or not a window has filled the chapter, and never touches the checkout's store."""
    from posenc.runs.plans import plan
    specs = plan("07_t5", "full")                                          # its cheapest chapter: three runs
    before = sorted(p.name for p in FULL.iterdir())
    copy = tmp_path / "copy"
    assert rehearse_full.main(["--chapters", "07_t5", "--forget", "--keep", str(copy)]) == 0
    assert sorted(p.name for p in FULL.iterdir()) == before               # the checkout's store is untouched
    runs = copy / "results" / "full" / "runs"
    made = [json.loads((runs / f"{spec.key}.json").read_text()) for _, spec in specs]
    assert len(made) == 3 and all(r["machine"] == rehearse_full.MARK for r in made)
    assert all(r["spec"]["train"]["steps"] > rehearse_full.STEPS for r in made)      # stored under the real spec
    assert "REHEARSAL" in (copy / "notebooks" / "07_t5.ipynb").read_text()            # and the chapter showed them


def test_plans_without_a_notebook_are_shown_by_the_notebook_of_their_number():
    assert rehearse_full.notebooks_of(["16_passkey", "15_length_generalisation", "07_t5"]) == [
        "notebooks/07_t5.ipynb", "notebooks/15_comparison.ipynb", "notebooks/16_rope_extension.ipynb",
        "notebooks/findings.ipynb"]


def test_unknown_chapters_and_a_used_folder_are_refused_by_name(tmp_path, capsys):
    with pytest.raises(SystemExit):
        rehearse_full.main(["--chapters", "99_nothing"])
    assert "--chapters: unknown ['99_nothing']" in capsys.readouterr().err
    (tmp_path / "x").write_text("")
    with pytest.raises(SystemExit):
        rehearse_full.main(["--chapters", "07_t5", "--keep", str(tmp_path)])
    assert "is not empty" in capsys.readouterr().err
