"""scripts/run_as_script.py: a notebook's cells as one program, as papermill would run them."""
import importlib.util
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("run_as_script", ROOT / "scripts" / "run_as_script.py")
ras = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ras)


def notebook(tmp_path, *cells):
    nb = {"cells": [{"cell_type": "markdown", "metadata": {}, "source": ["# title"]}]
          + [{"cell_type": "code", "metadata": {"tags": tags}, "source": src, "outputs": []} for tags, src in cells],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb))
    return path


@pytest.fixture(autouse=True)
def keep_cwd(monkeypatch):
    monkeypatch.chdir(ROOT)


def test_running_leaves_the_environment_alone(tmp_path):
    """Kernels started later (nbval) inherit os.environ: a backend set here would hide their figures."""
    before = dict(os.environ)
    assert ras.run(notebook(tmp_path, ([], "x = 1\n")), "ci", smoke=False, workdir=tmp_path / "w") == 0
    assert dict(os.environ) == before


def test_parameters_are_overridden_and_results_land_in_the_workdir(tmp_path):
    path = notebook(tmp_path,
                    (["parameters"], 'profile = "auto"\n'),
                    (["injected-parameters"], 'raise RuntimeError("papermill\'s cell must be skipped")\n'),
                    ([], "%matplotlib inline\nSIZE = {'steps': 500, 'seeds': [0, 1, 2], 'batch_size': 64}\n"),
                    ([], "import json, pathlib\npathlib.Path('../results').mkdir(exist_ok=True)\n"
                         "pathlib.Path('../results/out.json').write_text(json.dumps({'profile': profile, **SIZE}))\n"))
    assert ras.run(path, "full", smoke=True, workdir=tmp_path / "w") == 0
    out = json.loads((tmp_path / "w" / "results" / "out.json").read_text())
    assert out == {"profile": "full", "steps": 3, "seeds": [0], "batch_size": 4}


def test_a_failing_cell_is_named_and_stops_the_run(tmp_path, capsys):
    path = notebook(tmp_path, ([], "x = 1\n"), ([], "1 / 0\n"), ([], "open('never', 'w')\n"))
    assert ras.run(path, "ci", smoke=False, workdir=tmp_path / "w") == 1
    assert "FAILED nb.ipynb at cell 1" in capsys.readouterr().out
    assert not (tmp_path / "w" / "notebooks" / "never").exists()
