"""Every task and data set: generated sequences, the shipped character corpus, order and masked-LM tasks,
the CNN position task and the digits. All share one protocol (`Task`), and `make_task(name, **kwargs)`
builds any of them by the name a `posenc.runs.RunSpec` gives."""
from typing import Callable, Protocol, runtime_checkable

import torch

from .corpus import CharCorpus, stdlib_text
from .synthetic import BOS, IGNORE, MASK, PAD, SEP, TASKS, SyntheticTask

__all__ = ["CharCorpus", "stdlib_text", "SyntheticTask", "TASKS", "IGNORE", "PAD", "BOS", "SEP", "MASK"]

from .cnn_position import PositionTask
from .digits import DigitsTask
from .order import ContrastTask
from .pretraining import MaskedLMWithCLS


def _corpus(train_length: int = 128, valid_every: int = 10, mask_prob: float = 0.15) -> CharCorpus:
    return CharCorpus.stdlib(train_length=train_length, valid_every=valid_every, mask_prob=mask_prob)


def _mlm_cls(train_length: int = 128, mask_prob: float = 0.15, swap_prob: float = 0.5,
             cls_task: str = "continuation") -> MaskedLMWithCLS:
    return MaskedLMWithCLS(CharCorpus.stdlib(train_length=train_length, mask_prob=mask_prob), swap_prob=swap_prob,
                           cls_task=cls_task)


def _cnn_position(size: int = 16, margin: int = 0, channels: int = 1) -> PositionTask:
    return PositionTask(size=size, margin=margin, channels=channels)


def _digits(image_size: int = 16, test_fraction: float = 0.25, split_seed: int = 0, max_shift: int = 0) -> DigitsTask:
    return DigitsTask(image_size, test_fraction=test_fraction, split_seed=split_seed, max_shift=max_shift)


#: name -> builder of a task from keyword arguments: how a `posenc.runs.RunSpec` names its task.
BUILDERS = {"synthetic": SyntheticTask, "corpus": _corpus, "mlm_cls": _mlm_cls, "contrast": ContrastTask,
            "cnn_position": _cnn_position, "digits": _digits}
from .counting import CountingTask; BUILDERS["counting"] = CountingTask  # noqa: E402,E702  selective k-back (CoPE)
from .passkey import PasskeyTask; BUILDERS["passkey"] = PasskeyTask  # noqa: E402,E702  (passkey retrieval)


@runtime_checkable
class Task(Protocol):
    """What the training loop needs from a task: a batch from a seeded generator.

    Sequence tasks (`SyntheticTask`, `CharCorpus`) also score a model at a length with
    `evaluate(model, length, ...)` and give `vocab_size` and `train_length`; the others
    score a trained model with `evaluate(model, ...)` or `accuracy(model)`.
    """

    def train_batch(self, batch_size: int, generator: torch.Generator, causal: bool) -> tuple: ...


@runtime_checkable
class SequenceTask(Task, Protocol):
    """A task scored at a length (`SyntheticTask`, `CharCorpus`, `PasskeyTask`): what `posenc.run` and
    `length_table` read."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def train_length(self) -> int: ...

    #: `evaluate(model, length, ...)` returns the metrics at that length, a dict of floats by name
    evaluate: Callable[..., dict]


def builder(task: str):
    """The builder of task `task` in `BUILDERS`, or a ValueError naming the known tasks."""
    if task not in BUILDERS:
        raise ValueError(f"unknown task {task!r}; known tasks: {', '.join(sorted(BUILDERS))}")
    return BUILDERS[task]


def task_parameters(task: str) -> set[str] | None:
    """The keyword names task `task`'s builder accepts (None when it takes any: `**kwargs`)."""
    import inspect
    params = inspect.signature(builder(task)).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def task_defaults(task: str) -> dict:
    """The keyword defaults of task `task`'s builder (written into every run spec).

    A default of None marks an optional setting that is off (e.g. `ContrastTask.n_train`): it is left
    out, so it enters a spec only when set, and the specs made before it existed keep their keys.
    """
    import inspect
    return {name: p.default for name, p in inspect.signature(builder(task)).parameters.items()
            if p.default is not p.empty and p.default is not None}


def make_task(task: str, /, **kwargs):
    """The task called `task` in `BUILDERS`, built from `kwargs`.

    The names: "corpus" (the character LM, `CharCorpus.stdlib`), "synthetic" (`SyntheticTask`, one of
    `TASKS`: copy, reverse, recall, kback, index, position, sort, duplicate, addition, parity, scan),
    "mlm_cls" (masked LM with a [CLS] label), "contrast", "counting", "passkey", "cnn_position" and
    "digits" (the chapters on TUPE, CoPE, RoPE's extensions and images).
    """
    return builder(task)(**kwargs)


__all__ += ["Task", "SequenceTask", "PositionTask", "DigitsTask", "ContrastTask", "MaskedLMWithCLS", "BUILDERS", "make_task", "task_defaults"]
