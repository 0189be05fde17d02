"""Recipes: how a `RunSpec` becomes a trained, evaluated model.

A recipe takes a spec and a device and returns {"table", "history", "final_loss",
"model"}; `posenc.runs.execute` adds the machine, the code version and the wall time
and writes the record. Chapters never train: they declare specs whose recipe does.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..tasks import make_task
from .evaluate import pretrain, run
from .train import TrainConfig

RECIPES: dict[str, Callable] = {}


def recipe(name: str):
    """Decorator registering a recipe under `name`."""
    def add(fn):
        RECIPES[name] = fn
        return fn
    return add


def train_config(spec, device: str) -> TrainConfig:
    return TrainConfig(**spec.train, seed=spec.seed, device=device, progress=False)


@recipe("sequence")
def sequence(spec, device: str = "cpu") -> dict:
    """`posenc.build_model(spec.scheme, ...)` trained on the task, then `task.evaluate` at each length."""
    task = make_task(spec.task, **spec.task_kwargs)
    model_kwargs = {k: v for k, v in spec.model.items() if k != "causal"}
    out = run(spec.scheme, task, train_config(spec, device), causal=spec.model["causal"], lengths=spec.lengths,
              model_kwargs=model_kwargs, eval_kwargs=spec.eval, label={})
    return {"table": list(out["table"]), "history": out["result"].history, "final_loss": out["result"].final_loss,
            "model": out["model"]}


@recipe("pretrain")
def masked_pretraining(spec, device: str = "cpu") -> dict:
    """Masked-LM + [CLS] pre-training (TUPE and DeBERTa's chapters): one row of held-out metrics."""
    task = make_task(spec.task, **spec.task_kwargs)
    out = pretrain(spec.scheme, task, train_config(spec, device), label={}, **spec.model)
    return {"table": [out["row"]], "history": out["history"], "final_loss": out["row"]["final_loss"],
            "model": out["model"]}


def get_recipe(name: str) -> Callable:
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; known recipes: {', '.join(sorted(RECIPES))}")
    return RECIPES[name]


def build_untrained(spec) -> torch.nn.Module:
    """The recipe's model with fresh weights (to load a stored state_dict into)."""
    from ..model import build_model
    task = make_task(spec.task, **spec.task_kwargs)
    if spec.recipe == "pretrain":
        kwargs = {"max_len": task.train_length, **spec.model}
        return build_model(spec.scheme, task.vocab_size, causal=False, cls_token=True, num_classes=2, **kwargs)
    kwargs = {k: v for k, v in spec.model.items() if k != "causal"}
    if spec.lengths and "max_len" not in kwargs:
        kwargs["max_len"] = max(task.seq_len(n, spec.model["causal"]) if hasattr(task, "seq_len") else n
                                for n in spec.lengths)
    return build_model(spec.scheme, task.vocab_size, causal=spec.model["causal"], **kwargs)
