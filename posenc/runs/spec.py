"""`RunSpec`: one training run as data, with a content hash.

A spec names everything that decides a run's numbers: the recipe (what is trained and
how it is scored), the scheme and model size, the task and its arguments, every
training setting, the seed and the evaluation. The defaults of the training settings, of
`build_model` and of the task are written into the spec when it is made, so a change to
one of them changes the hash too: a stored record is reused only for exactly the settings
it was made with. The defaults of a scheme's own keywords (RoPE's `base`), of the task's
`evaluate` and of a recipe's options are not: after changing one of those in the code, the
records made under the old default keep their keys, and must be deleted to be made again
(tests/test_unhashed_defaults.py fails on such a change to a scheme's or an `evaluate`'s
default; tests/test_recipe_settings.py checks the recipes' settings).
The hash reads the spec's JSON as written, so `lr=1` and `lr=1.0`, or a default left out
and the same value written in, are two specs: plans write each setting one way.
"""
from __future__ import annotations

import hashlib
import inspect
import json
from dataclasses import dataclass, field, fields
from typing import Any

from ..model import build_model
from ..scheme import SCHEMES, scheme_parameters
from ..tasks import task_defaults, task_parameters
from .train import TrainConfig

#: TrainConfig fields that decide a run's numbers (device, progress and checkpoints do not).
TRAIN_FIELDS = ("steps", "batch_size", "lr", "weight_decay", "warmup", "min_lr_ratio", "grad_clip", "log_every")
#: TrainConfig fields that are off (None) by default and written into a spec only when set, so the
#: specs made before they existed keep their keys (and their stored records).
OPTIONAL_TRAIN_FIELDS = ("random_positions",)
#: build_model keywords with a default that a spec fills in (max_len follows the evaluation lengths).
MODEL_DEFAULTS = {name: p.default for name, p in inspect.signature(build_model).parameters.items()
                  if p.kind is p.KEYWORD_ONLY and p.default is not p.empty and name != "max_len"}
#: build_model's own keywords (a sequence spec's model may also give its scheme's).
MODEL_KEYWORDS = frozenset(name for name, p in inspect.signature(build_model).parameters.items()
                           if p.kind is p.KEYWORD_ONLY)


def check_model_keys(scheme: str, model: dict, fixed=frozenset(), recipe: str = "sequence") -> None:
    """A ValueError naming the keys of a spec's `model` that neither `build_model` nor the scheme accepts, or
    that the recipe sets itself (`fixed`): without it, a typo (`n_head=8`) passes the plan and fails only when
    its run starts."""
    clash = sorted(set(model) & set(fixed))
    if clash:
        raise ValueError(f"model sets {clash}, which recipe {recipe!r} sets itself; leave them out")
    accepted = scheme_parameters(scheme)
    if accepted is None:
        return
    unknown = sorted(set(model) - MODEL_KEYWORDS - accepted)
    if unknown:
        raise ValueError(f"model has unknown settings {unknown} for scheme {scheme!r}; allowed: "
                         f"{', '.join(sorted((MODEL_KEYWORDS | accepted) - set(fixed)))}")


def _plain(value, where: str):
    """Check that `value` is JSON data (str, int, float, bool, None, lists and str-keyed dicts)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v, where) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _plain(v, f"{where}[{k!r}]") for k, v in value.items()}
    raise TypeError(f"{where} must hold JSON data (numbers, strings, lists, dicts); got {type(value).__name__}")


def key_of(data: dict) -> str:
    """The key of a spec written as `RunSpec.to_dict()` gives it: sha256 of its canonical JSON, 16 hex digits.
    A worker names a spec it cannot rebuild by it."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True, eq=False)
class RunSpec:
    """One run: `recipe(spec)` trains and evaluates it; `key` is its content hash.

    Args:
        scheme: a name in `posenc.SCHEMES` (or the recipe's own model family, e.g. "cnn").
        task: a name in `posenc.tasks.BUILDERS`.
        task_kwargs: the task's arguments.
        model: keyword arguments of the model builder (`causal` among them for sequence models; a
            spec of a recipe in `BUILDS_MODEL` may give only `build_model`'s keywords and its scheme's,
            `check_model_keys`).
        train: TrainConfig settings (every field of `TRAIN_FIELDS`; missing ones take the defaults),
            and those of `OPTIONAL_TRAIN_FIELDS` (e.g. random_positions), kept only when not None.
        seed: model initialisation and data order.
        lengths: evaluation lengths.
        eval: keyword arguments of the task's `evaluate`.
        recipe: a name in `posenc.runs.RECIPES` ("sequence": build, train, evaluate at lengths).
        options: recipe-specific settings (part of the hash).
        keep_weights: store the trained weights beside the record (chapters that inspect the model).
    """

    scheme: str
    task: str
    task_kwargs: dict = field(default_factory=dict)
    model: dict = field(default_factory=dict)
    train: dict = field(default_factory=dict)
    seed: int = 0
    lengths: tuple = ()
    eval: dict = field(default_factory=dict)
    recipe: str = "sequence"
    options: dict = field(default_factory=dict)
    keep_weights: bool = False

    def __post_init__(self):
        for name in ("scheme", "task", "recipe"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise TypeError(f"{name} must be a non-empty str; got {getattr(self, name)!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative int; got {self.seed!r}")
        if not isinstance(self.keep_weights, bool):          # "no" is truthy, and 1 and True hash apart
            raise TypeError(f"keep_weights must be True or False; got {self.keep_weights!r}")
        for name in ("model", "train", "task_kwargs", "eval"):
            if not isinstance(getattr(self, name), dict):
                raise TypeError(f"{name} must be a dict of settings; got {getattr(self, name)!r}")
        if isinstance(self.lengths, (str, bytes)) or not hasattr(self.lengths, "__iter__"):
            raise TypeError(f"lengths must be a sequence of positive ints; got {self.lengths!r}")
        unknown = sorted(set(self.train) - set(TRAIN_FIELDS + OPTIONAL_TRAIN_FIELDS))
        if unknown:
            raise ValueError(f"train has unknown settings {unknown}; "
                             f"allowed: {', '.join(TRAIN_FIELDS + OPTIONAL_TRAIN_FIELDS)}")
        defaults = TrainConfig()
        train = {f: self.train.get(f, getattr(defaults, f)) for f in TRAIN_FIELDS}
        train |= {f: self.train[f] for f in OPTIONAL_TRAIN_FIELDS if self.train.get(f) is not None}
        TrainConfig(**train)  # validates the values
        lengths = tuple(self.lengths)
        if not all(isinstance(n, int) and n >= 1 for n in lengths):
            raise ValueError(f"lengths must be positive ints; got {self.lengths!r}")
        from .recipes import RECIPES  # registered by posenc.runs, which imports this module first
        if self.recipe not in RECIPES:
            raise ValueError(f"recipe must be one of {', '.join(sorted(RECIPES))}; got {self.recipe!r}")
        if self.recipe == "sequence" and self.scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {', '.join(sorted(SCHEMES))}; got {self.scheme!r}")
        accepted = task_parameters(self.task)
        unknown = sorted(set(self.task_kwargs) - accepted) if accepted is not None else []
        if accepted is not None and unknown:
            raise ValueError(f"task_kwargs has unknown settings {unknown} for task {self.task!r}; "
                             f"allowed: {', '.join(sorted(accepted))}")
        model = dict(self.model)
        if self.recipe == "sequence":
            if "causal" not in model:
                raise ValueError("model must say causal=True or False")
            model = {**MODEL_DEFAULTS, **model}
        from .recipes import BUILDS_MODEL
        if self.recipe in BUILDS_MODEL and self.scheme in SCHEMES:
            check_model_keys(self.scheme, model, BUILDS_MODEL[self.recipe], self.recipe)
        object.__setattr__(self, "task_kwargs", {**task_defaults(self.task), **self.task_kwargs})
        object.__setattr__(self, "train", train)
        object.__setattr__(self, "lengths", lengths)
        object.__setattr__(self, "model", model)
        for name in ("task_kwargs", "model", "eval", "options"):
            _plain(getattr(self, name), name)

    def to_dict(self) -> dict:
        return {f.name: _plain(getattr(self, f.name), f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict) -> "RunSpec":
        if not isinstance(data, dict):
            raise TypeError(f"a run spec must be a dict; got {type(data).__name__}")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown spec fields {unknown}")
        lengths = data.get("lengths", ())
        if isinstance(lengths, (str, bytes)) or not hasattr(lengths, "__iter__"):
            raise TypeError(f"lengths must be a sequence of positive ints; got {lengths!r}")
        values: dict[str, Any] = {k: tuple(v) if k == "lengths" else v for k, v in data.items()}
        return cls(**values)

    @property
    def key(self) -> str:
        """sha256 of the canonical JSON of the spec, 16 hex digits (`key_of` its `to_dict()`)."""
        return key_of(self.to_dict())

    def __eq__(self, other) -> bool:
        return isinstance(other, RunSpec) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def replace(self, **changes) -> "RunSpec":
        """A copy with some fields changed (`train`/`model`/... dicts are merged, not replaced)."""
        data = self.to_dict()
        for k, v in changes.items():
            data[k] = {**data[k], **v} if isinstance(data.get(k), dict) and isinstance(v, dict) else v
        return RunSpec.from_dict(data)

    def cost(self) -> float:
        """A rough training cost in multiply-adds: 6 * parameters * tokens * steps (for estimates only)."""
        d = self.model.get("d_model", 128)
        layers = self.model.get("n_layers", 2)
        tokens = self.task_kwargs.get("train_length", 32) * (2 if self.task == "synthetic" else 1) + 2
        return 6.0 * 12 * layers * d * d * tokens * self.train["batch_size"] * self.train["steps"]
