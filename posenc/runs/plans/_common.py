"""Spec builders the chapter plans share: a character LM and a synthetic task, at L..8L."""
from __future__ import annotations

from typing import Any

from ..spec import RunSpec

# One tier's sizes in a plan: steps, batch_size, d_model, seeds, ... (RunSpec checks each value it is given).
Sizes = dict[str, Any]
# A row that varies a scheme: (scheme, its model options, its training options).
Variant = tuple[str, dict[str, Any], dict[str, Any]]


def lm(scheme: str, L: int, *, steps: int, batch_size: int, d_model: int, n_layers: int, n_heads: int = 4,
       lr: float = 3e-3, warmup: int = 50, seed: int = 0, max_tokens: int | None = 4096, factors=(1, 2, 4, 8),
       keep_weights: bool = False, **model) -> RunSpec:
    """A causal character LM on the shipped corpus with context L, scored at each factor * L."""
    return RunSpec(scheme=scheme, task="corpus", task_kwargs={"train_length": L},
                   model={"d_model": d_model, "n_heads": n_heads, "n_layers": n_layers, "causal": True, **model},
                   train={"steps": steps, "batch_size": batch_size, "lr": lr, "warmup": warmup}, seed=seed,
                   lengths=tuple(f * L for f in factors), eval={"max_tokens": max_tokens}, keep_weights=keep_weights)


def synthetic(scheme: str, name: str, L: int, *, steps: int, batch_size: int, d_model: int, n_layers: int,
              n_heads: int = 4, lr: float = 3e-3, warmup: int = 50, seed: int = 0, k: int = 2, factors=(1, 2, 4, 8),
              max_eval_factor: int | None = None, n_samples: int | None = None, causal: bool = True,
              keep_weights: bool = False, lengths=None, **model) -> RunSpec:
    """A generated task (copy, reverse, kback, ...) trained on lengths <= L, scored at each factor * L
    (or at the given `lengths`)."""
    task = {"name": name, "train_length": L, "k": k}
    if max_eval_factor is not None:
        task["max_eval_factor"] = max_eval_factor
    return RunSpec(scheme=scheme, task="synthetic", task_kwargs=task,
                   model={"d_model": d_model, "n_heads": n_heads, "n_layers": n_layers, "causal": causal, **model},
                   train={"steps": steps, "batch_size": batch_size, "lr": lr, "warmup": warmup}, seed=seed,
                   lengths=tuple(lengths or (f * L for f in factors)), eval={} if n_samples is None else {"n_samples": n_samples},
                   keep_weights=keep_weights)
