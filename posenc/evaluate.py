"""Evaluation across lengths, returning tidy tables, and the one-call experiment."""
from __future__ import annotations

import torch

from .registry import build_model
from .table import Table
from .train import TrainConfig, amp_dtype, pick_device, train


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def length_table(model, task, lengths, *, label: dict | None = None, **eval_kwargs) -> Table:
    """One row per evaluation length: {**label, length, x_train, <task metrics>}.

    `x_train` is the length as a multiple of the task's training length. Extra
    keywords go to `task.evaluate` (e.g. `n_samples`, `max_tokens`).
    """
    device = model_device(model)
    dtype = amp_dtype("auto", device)
    model.eval()
    rows = Table()
    for n in lengths:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            metrics = task.evaluate(model, n, device=device, **eval_kwargs)
        rows.append({**(label or {}), "length": n, "x_train": round(n / task.train_length, 3), **metrics})
    return rows


def run(scheme: str, task, cfg: TrainConfig, *, causal: bool, lengths=(), model_kwargs: dict | None = None,
        eval_kwargs: dict | None = None, label: dict | None = None) -> dict:
    """Seed, build, train and evaluate one model: {"model", "result", "table"}.

    The model is initialised from `cfg.seed`, so (scheme, task, cfg) fixes every number.
    `max_len` defaults to the longest sequence the evaluation lengths need.
    """
    kwargs = dict(model_kwargs or {})
    if lengths and hasattr(task, "seq_len"):
        kwargs.setdefault("max_len", max(task.seq_len(n, causal) for n in lengths))
    elif lengths:
        kwargs.setdefault("max_len", max(lengths))
    torch.manual_seed(cfg.seed)
    model = build_model(scheme, task.vocab_size, causal=causal, **kwargs).to(pick_device(cfg.device))
    result = train(model, task, cfg)
    label = {"scheme": scheme, "causal": causal, "seed": cfg.seed} if label is None else label
    table = length_table(model, task, lengths, label=label, **(eval_kwargs or {}))
    return {"model": model, "result": result, "table": table}
