"""Chapter 00: NoPE, causal and bidirectional, on the position and kback tasks."""
from __future__ import annotations

from . import declare
from ._common import Sizes, synthetic


@declare("00_attention_without_position")
def attention_without_position(profile: str):
    size: Sizes | None = {"ci": dict(steps=600, batch_size=64, d_model=64, n_layers=2, seeds=(0, 1, 2)),
                          "full": dict(steps=800, batch_size=64, d_model=128, n_layers=4, seeds=(0, 1, 2))}.get(profile)
    if size is None:
        return []
    out = []
    for task in ("position", "kback"):
        for causal in (True, False):
            for s in size["seeds"]:
                label = {"task": task, "model": "causal NoPE" if causal else "bidirectional NoPE", "seed": s}
                out.append((label, synthetic("nope", task, 16, steps=size["steps"], batch_size=size["batch_size"],
                                             d_model=size["d_model"], n_layers=size["n_layers"], causal=causal, seed=s,
                                             lengths=(4, 8, 16, 32, 64), keep_weights=task == "position" and s == 0)))
    return out
