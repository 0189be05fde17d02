"""The defaults a run spec's hash does not cover, against a committed snapshot.

A spec writes in the defaults of its training settings, of `build_model` and of its task, so changing one of
those changes every affected key and nothing stale is reused (design.md, "Runs as data"). The defaults of a
scheme's own keywords (RoPE's `base`) and of a task's `evaluate` are not written in: a change to one of them
would leave the stored records of the old default under the same keys. The `ci` tier is recomputed by the
tests, but `paper` and `full` are not, so this test fails on any such change until the affected records are
deleted (to be made again) and the snapshot is rewritten:

    python tests/test_unhashed_defaults.py          # writes tests/unhashed_defaults.json
"""
import importlib
import inspect
import json
import pkgutil
from pathlib import Path

import torch

SNAPSHOT = Path(__file__).with_name("unhashed_defaults.json")


def _defaults(fn) -> dict:
    return {name: repr(p.default) for name, p in inspect.signature(fn).parameters.items()
            if p.default is not inspect.Parameter.empty}


def unhashed_defaults() -> dict:
    """{"scheme <name>": {class: {keyword: repr(default)}}, "evaluate <class>": {keyword: repr(default)}}."""
    from posenc.scheme import SCHEMES
    import posenc.tasks as tasks
    out = {}
    for name, cls in sorted(SCHEMES.items()):
        out[f"scheme {name}"] = {k.__qualname__: _defaults(k.__init__) for k in cls.__mro__
                                 if "__init__" in k.__dict__ and k not in (torch.nn.Module, object)}
    names = [tasks.__name__] + [m.name for m in pkgutil.walk_packages(tasks.__path__, tasks.__name__ + ".")]
    modules = [importlib.import_module(name) for name in sorted(names)]    # every one, whatever was imported
    for module in modules:
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and "evaluate" in cls.__dict__:
                out[f"evaluate {cls.__module__}.{cls.__qualname__}"] = _defaults(cls.evaluate)
    return out


def test_no_default_the_spec_hash_does_not_cover_has_changed():
    stored, now = json.loads(SNAPSHOT.read_text()), unhashed_defaults()
    changed = sorted(k for k in stored.keys() | now.keys() if stored.get(k) != now.get(k))
    assert not changed, (
        f"defaults that run specs do not hash changed in {changed}: the stored paper and full records made under "
        "the old ones keep their keys. Delete those records (to be made again), then run "
        "`python tests/test_unhashed_defaults.py` to rewrite the snapshot.")


def test_the_snapshot_sees_the_defaults_that_matter():
    now = unhashed_defaults()
    assert now["scheme rope"]["RoPE"]["base"] == "10000.0"
    assert now["evaluate posenc.tasks.synthetic.SyntheticTask"]["n_samples"] == "256"
    assert len([k for k in now if k.startswith("evaluate ")]) >= 5


if __name__ == "__main__":
    SNAPSHOT.write_text(json.dumps(unhashed_defaults(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT}")
