"""Chapter 10: complex-order embeddings against real-valued positions on an order-sensitive classification task."""
from __future__ import annotations

from ..spec import RunSpec
from . import declare

MODELS = {"complex order": "complex-order", "complex vanilla": "complex-vanilla", "complex (scheme)": "complex",
          "sinusoidal": "sinusoidal", "learned": "learned", "NoPE": "nope"}


@declare("10_complex_order")
def complex_order(profile: str):
    size = {"ci": dict(length=12, d_model=64, n_layers=1, steps=400, batch_size=32, lr=3e-3, seeds=(0, 1, 2)),
            "full": dict(length=16, d_model=256, n_layers=1, steps=3000, batch_size=64, lr=1e-3,
                         seeds=(0, 1, 2))}.get(profile)
    if size is None:
        return []
    return [({"model": label, "seed": s},
             RunSpec(scheme=name, task="contrast", task_kwargs={"length": size["length"]}, recipe="classify",
                     model={"d_model": size["d_model"], "n_heads": 4, "n_layers": size["n_layers"]},
                     train={"steps": size["steps"], "batch_size": size["batch_size"], "lr": size["lr"], "warmup": 30,
                            "log_every": 25}, seed=s))
            for label, name in MODELS.items() for s in size["seeds"]]
