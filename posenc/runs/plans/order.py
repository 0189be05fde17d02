"""Chapter 10: complex-order embeddings against real-valued positions on an order-sensitive classification task,
and the paper's parameter-sharing variants of the embedding (Wang et al. 2020, Table 4)."""
from __future__ import annotations

from ..spec import RunSpec
from . import declare

MODELS = {"complex order": "complex-order", "complex vanilla": "complex-vanilla", "complex (scheme)": "complex",
          "sinusoidal": "sinusoidal", "learned": "learned", "NoPE": "nope"}

#: The complex Transformer with the embedding's tables shared (keyword arguments of `build_classifier`).
#: "complex order" above is the unshared r_{j,d} exp(i (w_{j,d} pos + theta_{j,d})); the paper's Table 4
#: drops the phase first (its headline model), then shares the period or the amplitude of that one.
SHARING = {"no phase": {"phase": "zero"},
           "word-sharing period": {"phase": "zero", "frequency": "word-sharing"},
           "dimension-sharing period": {"phase": "zero", "frequency": "dimension-sharing"},
           "word-sharing amplitude": {"phase": "zero", "amplitude": "word-sharing"},
           "dimension-sharing amplitude": {"phase": "zero", "amplitude": "dimension-sharing"}}


@declare("10_complex_order")
def complex_order(profile: str):
    size = {"ci": dict(length=12, d_model=64, n_layers=1, steps=400, batch_size=32, lr=3e-3, seeds=(0, 1, 2)),
            "full": dict(length=16, d_model=128, n_layers=1, steps=800, batch_size=64, lr=2e-3,
                         seeds=(0, 1, 2))}.get(profile)
    if size is None:
        return []

    def spec(name, seed, **sharing):
        return RunSpec(scheme=name, task="contrast", task_kwargs={"length": size["length"]}, recipe="classify",
                       model={"d_model": size["d_model"], "n_heads": 4, "n_layers": size["n_layers"], **sharing},
                       train={"steps": size["steps"], "batch_size": size["batch_size"], "lr": size["lr"], "warmup": 30,
                              "log_every": 25}, seed=seed)

    return ([({"part": "schemes", "model": label, "seed": s}, spec(name, s))
             for label, name in MODELS.items() for s in size["seeds"]]
            + [({"part": "sharing", "model": label, "seed": s}, spec("complex-order", s, **sharing))
               for label, sharing in SHARING.items() for s in size["seeds"]])
