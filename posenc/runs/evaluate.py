"""Evaluation across lengths, returning tidy tables, and the one-call experiment."""
from __future__ import annotations

from typing import Any, Iterable

import torch
from torch import nn

from ..model import build_model
from ..table import Table
from ..tasks import SequenceTask
from ..tasks.pretraining import MaskedLMWithCLS, pretraining_loss
from .train import TrainConfig, amp_dtype, pick_device, train


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's (first) parameters: where its evaluation batches go."""
    return next(model.parameters()).device


def check_lengths(lengths) -> tuple:
    """`lengths` as a tuple; a TypeError unless it is a sequence of positive ints (512 alone is not; nor 8.0)."""
    if isinstance(lengths, (str, bytes)) or not hasattr(lengths, "__iter__"):
        raise TypeError(f"lengths must be a sequence of positive ints; got {lengths!r}")
    lengths = tuple(lengths)
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in lengths):
        raise TypeError(f"lengths must be a sequence of positive ints; got {lengths!r}")
    return lengths


def length_table(model: nn.Module, task: SequenceTask, lengths: Iterable[int], *, label: dict | None = None,
                 **eval_kwargs: Any) -> Table:
    """One row per evaluation length: {**label, length, x_train, <task metrics>}.

    `x_train` is the length as a multiple of the task's training length. Extra
    keywords go to `task.evaluate` (e.g. `n_samples`, `max_tokens`).
    """
    lengths = check_lengths(lengths)
    device = model_device(model)
    dtype = amp_dtype("auto", device)
    model.eval()
    rows = Table()
    for n in lengths:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            metrics = task.evaluate(model, n, device=device, **eval_kwargs)
        rows.append({**(label or {}), "length": n, "x_train": round(n / task.train_length, 3), **metrics})
    return rows


def run(scheme: str, task: SequenceTask, cfg: TrainConfig, *, causal: bool, lengths: Iterable[int] = (),
        model_kwargs: dict | None = None, eval_kwargs: dict | None = None, label: dict | None = None) -> dict:
    """Seed, build, train and evaluate one model: {"model", "result", "table"}.

    The model is initialised from `cfg.seed`, so (scheme, task, cfg) fixes every number.
    `max_len` defaults to the longest sequence the evaluation lengths need.
    """
    if not isinstance(cfg, TrainConfig):                 # before building: a dict failed at cfg.seed
        raise TypeError(f"cfg must be a posenc.TrainConfig; got {type(cfg).__name__}")
    lengths = check_lengths(lengths)
    model = seeded_model(scheme, task, cfg, causal=causal, lengths=lengths, model_kwargs=model_kwargs)
    result = train(model, task, cfg)
    label = {"scheme": scheme, "causal": causal, "seed": cfg.seed} if label is None else label
    table = length_table(model, task, lengths, label=label, **(eval_kwargs or {}))
    return {"model": model, "result": result, "table": table}


def seeded_model(scheme: str, task, cfg: TrainConfig, *, causal: bool, lengths=(), model_kwargs: dict | None = None):
    """`build_model` initialised from `cfg.seed` on `cfg.device`; `max_len` defaults to the longest
    sequence the evaluation lengths need."""
    kwargs = dict(model_kwargs or {})
    if lengths and hasattr(task, "seq_len"):
        kwargs.setdefault("max_len", max(task.seq_len(n, causal) for n in lengths))
    elif lengths:
        kwargs.setdefault("max_len", max(lengths))
    torch.manual_seed(cfg.seed)
    return build_model(scheme, task.vocab_size, causal=causal, **kwargs).to(pick_device(cfg.device))


def pretrain(scheme: str, task: MaskedLMWithCLS, cfg: TrainConfig, *, label: dict | None = None,
             **model_kwargs) -> dict:
    """Seed, build (with [CLS] and a 2-way classifier), pre-train and evaluate one model.

    Returns {"model", "history", "row"}: row = {**label, "mlm", "cls", "cls_acc", "final_loss"}.
    """
    model = pretraining_model(scheme, task, cfg, **model_kwargs)
    result = train(model, task, cfg, loss_fn=pretraining_loss)
    return pretraining_row(model, result, scheme, task, cfg, label)


def pretraining_model(scheme: str, task: MaskedLMWithCLS, cfg: TrainConfig, **model_kwargs):
    """The bidirectional model with [CLS] and a 2-way classifier, initialised from `cfg.seed` on `cfg.device`."""
    torch.manual_seed(cfg.seed)
    kwargs = {"max_len": task.train_length, **model_kwargs}
    model = build_model(scheme, task.vocab_size, causal=False, cls_token=True, num_classes=2, **kwargs)
    return model.to(pick_device(cfg.device))


def pretraining_row(model, result, scheme: str, task: MaskedLMWithCLS, cfg: TrainConfig, label: dict | None) -> dict:
    """A pre-training run's result: the task's held-out metrics (masked-LM loss, [CLS] accuracy) with the run's
    label and final training loss as its table row, and the model and history to keep."""
    metrics = task.evaluate(model, seed=cfg.seed, device=pick_device(cfg.device))
    row = {**(label or {"scheme": scheme, "seed": cfg.seed}), **metrics, "final_loss": result.final_loss}
    return {"model": model, "history": result.history, "row": row}
