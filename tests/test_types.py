"""posenc ships its annotations (PEP 561): a user's type checker reads them, so mypy must find them true."""
import tomllib
from importlib.resources import files
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_package_is_marked_typed_and_the_marker_is_installed():
    assert files("posenc").joinpath("py.typed").is_file()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in config["tool"]["setuptools"]["package-data"]["posenc"]


def test_mypy_finds_the_package_annotations_true():
    """mypy over `posenc/` (and the maintainers' `scripts/` and `benchmarks/`) with the settings of pyproject.toml
    (`[tool.mypy]`: the oldest Python the package supports, bodies of unannotated functions checked too).
    A wrong annotation, a None not handled, an attribute no class defines: each is an error a user's
    checker would report."""
    api = pytest.importorskip("mypy.api", reason="mypy is in requirements.txt (pip install mypy)")
    out, err, status = api.run(["--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(ROOT / ".mypy_cache"),
                                *(str(ROOT / folder) for folder in ("posenc", "scripts", "benchmarks"))])
    assert status == 0, f"mypy found errors:\n{out}{err}"
    assert "Success: no issues found" in out


def test_mypy_would_catch_a_wrong_annotation(tmp_path):
    """The check can fail: the same settings report a function whose annotation its body contradicts."""
    api = pytest.importorskip("mypy.api", reason="mypy is in requirements.txt (pip install mypy)")
    bad = tmp_path / "bad.py"
    bad.write_text("from torch import Tensor\n\n\ndef f(x: Tensor) -> Tensor:\n    return x.shape[0]\n")
    out, _, status = api.run(["--config-file", str(ROOT / "pyproject.toml"), "--cache-dir",
                              str(ROOT / ".mypy_cache"), str(bad)])
    assert status == 1 and "Incompatible return value type" in out, out


def _public_callables():
    """(name, function) for everything `posenc.__all__` and `posenc.functional.__all__` name: the
    functions, and the public methods (and `__init__`) of the classes."""
    import inspect

    import posenc
    import posenc.functional
    for module in (posenc, posenc.functional):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj):
                yield from ((f"{name}.{m}", f) for m, f in vars(obj).items()
                            if inspect.isfunction(f) and (not m.startswith("_") or m == "__init__"))
            elif inspect.isfunction(obj):
                yield name, obj


def test_every_public_function_is_fully_annotated():
    """What a user calls has a type for every parameter (`**kwargs` included) and for its result, so
    their checker types the calls instead of reading Any."""
    import inspect
    bare = []
    for name, fn in _public_callables():
        sig = inspect.signature(fn)
        bare += [f"{name}({p.name})" for p in sig.parameters.values()
                 if p.annotation is inspect.Parameter.empty and p.name not in ("self", "cls")]
        if sig.return_annotation is inspect.Signature.empty and not name.endswith("__init__"):
            bare.append(f"{name} -> ?")
    assert len(list(_public_callables())) > 40            # the walk found the API, not an empty list
    assert bare == []


def test_the_sequence_tasks_have_what_run_and_length_table_read():
    from posenc.tasks import SequenceTask, SyntheticTask, Task, make_task
    from posenc.tasks.passkey import PasskeyTask
    for task in (SyntheticTask("copy", train_length=8), make_task("corpus", train_length=16), PasskeyTask()):
        assert isinstance(task, SequenceTask) and isinstance(task, Task), type(task).__name__
    assert not isinstance(make_task("digits"), SequenceTask)          # scored by accuracy, not at a length
