"""Chapters 12 (CNN zero padding) and 13 (ViT 2-D positions)."""
from __future__ import annotations

from ..spec import RunSpec
from . import declare
from ._common import Sizes


@declare("12_cnn_zero_padding")
def cnn_zero_padding(profile: str):
    """Three paddings at full depth (read-out R^2 of the position), and zero padding at growing depth."""
    size: Sizes | None = {
        "ci": dict(size=16, dilations=(1, 2, 4, 1), channels=16, steps=300, batch_size=16, seeds=(0, 1, 2, 3, 4),
                   sweep=[(1,), (1, 2), (1, 2, 2), (1, 2, 4, 1)], sweep_steps=200, maps=True),
        "full": dict(size=32, dilations=(1, 2, 4, 8, 1), channels=32, steps=2000, batch_size=32,
                     seeds=(0, 1, 2),
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


#: Chapter 13's `paper` tier is its `ci` runs with these seeds: a run takes seconds, and at three seeds the
#: chapter's open claims are limited by how far seeds spread, not by the model.
PAPER_SEEDS = tuple(range(8))

VIT_VARIANTS = {  # trained scheme: [(name, resize mode of the learned table, scaled coordinates)]
    "learned": [("(a) learned, no adaptation (1-D extend)", "extend", False),
                ("(b) learned, 2-D interpolation", "interpolate", False)],
    "sincos2d": [("(c) sincos2d, patch-index coords", None, False), ("(c) sincos2d, scaled coords", None, True)],
    "rope2d": [("(d) rope2d, patch-index coords", None, False), ("(d) rope2d, scaled coords", None, True)],
    "none": [("no position (reference)", None, False)],
}


@declare("13_vit")
def vit(profile: str):
    """ViTs with four position schemes at low resolution, moved to high resolution; CNN stems without position."""
    ci = dict(lo=16, hi=32, patch=4, d_model=32, n_heads=2, n_layers=2, steps=400, ft_steps=40, batch_size=32,
              lr=3e-3, max_shift=0, seeds=(0, 1, 2))
    size: Sizes | None = {
        "ci": ci,
        "paper": {**ci, "seeds": PAPER_SEEDS},
        "full": dict(lo=32, hi=64, patch=4, d_model=128, n_heads=4, n_layers=4, steps=1000, ft_steps=200,
                     batch_size=64, lr=2e-3, max_shift=1, seeds=(0, 1, 2))}.get(profile)
    if size is None:
        return []
    steps = size["steps"]

    def spec(scheme, stem, s, variants=None):
        options = {} if variants is None else {"variants": [list(v) for v in variants], "hi": size["hi"],
                                               "ft_steps": size["ft_steps"], "ft_lr": size["lr"] / 3}
        return RunSpec(scheme=scheme, task="digits", task_kwargs={"image_size": size["lo"], "max_shift": size["max_shift"]},
                       recipe="vit", model={"patch_size": size["patch"], "stem": stem, "d_model": size["d_model"],
                                            "n_heads": size["n_heads"], "n_layers": size["n_layers"]},
                       train={"steps": steps, "batch_size": size["batch_size"], "lr": size["lr"],
                              "warmup": max(1, min(100, steps // 5)), "log_every": max(1, steps // 20)},
                       seed=s, options=options)

    out = [({"stem": "patch", "scheme": scheme, "seed": s}, spec(scheme, "patch", s, VIT_VARIANTS[scheme]))
           for scheme in ("none", "learned", "sincos2d", "rope2d") for s in size["seeds"]]
    out += [({"stem": "cnn", "scheme": scheme, "seed": s}, spec(scheme, "cnn", s))
            for scheme in ("none", "learned") for s in size["seeds"]]
    return out + data_sweep(profile)


def data_sweep(profile: str):
    """ViT's inductive-bias claim: the learned table with a patch or a CNN stem, on the first n training digits."""
    ci = dict(image=24, d_model=32, n_heads=2, n_layers=2, steps=1200, batch_size=32, lr=3e-3, seeds=(0, 1, 2))
    size: Sizes | None = {"ci": ci, "paper": {**ci, "seeds": PAPER_SEEDS},
                          "full": dict(image=32, d_model=128, n_heads=4, n_layers=4, steps=1000, batch_size=64, lr=2e-3,
                                       seeds=(0, 1, 2))}.get(profile)
    if size is None:
        return []

    def spec(stem, n, s):
        steps = size["steps"]
        return RunSpec(scheme="learned", task="digits", task_kwargs={"image_size": size["image"], "max_shift": 1},
                       recipe="vit", model={"patch_size": 4, "stem": stem, "d_model": size["d_model"],
                                            "n_heads": size["n_heads"], "n_layers": size["n_layers"]},
                       train={"steps": steps, "batch_size": size["batch_size"], "lr": size["lr"],
                              "warmup": min(100, steps // 5), "log_every": steps // 20},
                       seed=s, options={"train_images": n})

    return [({"stem": stem, "scheme": "learned", "seed": s, "images": n}, spec(stem, n, s))
            for n in DATA_SIZES for stem in ("patch", "cnn") for s in size["seeds"]]


#: training images of the data-size sweep: 1/8, 1/4, 1/2 and all of the 1348 in the fixed split
DATA_SIZES = (168, 337, 674, 1348)
