"""Chapters 12 (CNN zero padding) and 13 (ViT 2-D positions)."""
from __future__ import annotations

from ..spec import RunSpec
from . import declare


@declare("12_cnn_zero_padding")
def cnn_zero_padding(profile: str):
    """Three paddings at full depth (read-out R^2 of the position), and zero padding at growing depth."""
    size = {"ci": dict(size=16, dilations=(1, 2, 4, 1), channels=16, steps=300, batch_size=16, seeds=(0,),
                       sweep=[(1,), (1, 2), (1, 2, 2), (1, 2, 4, 1)], sweep_steps=200, maps=True),
            "full": dict(size=32, dilations=(1, 2, 4, 8, 1), channels=32, steps=2000, batch_size=32, seeds=(0, 1, 2),
                         sweep=[(1,), (1, 2), (1, 2, 4), (1, 2, 4, 4), (1, 2, 4, 8), (1, 2, 4, 8, 1)],
                         sweep_steps=1000, maps=False)}.get(profile)
    if size is None:
        return []

    def spec(padding, dilations, steps, seed, log_every, fit_margin):
        return RunSpec(scheme=padding, task="cnn_position", task_kwargs={"size": size["size"]}, recipe="cnn_position",
                       model={"channels": size["channels"], "dilations": list(dilations)},
                       train={"steps": steps, "batch_size": size["batch_size"], "lr": 3e-3, "warmup": 20,
                              "log_every": log_every}, seed=seed,
                       options={"fit_margin": fit_margin, "maps": size["maps"]})

    out = [({"part": "padding", "padding": p, "seed": s}, spec(p, size["dilations"], size["steps"], s, 25, True))
           for p in ("zero", "valid", "circular") for s in size["seeds"]]
    out += [({"part": "depth", "dilations": str(tuple(d)), "seed": 0}, spec("zero", d, size["sweep_steps"], 0, 50, False))
            for d in size["sweep"]]
    return out
