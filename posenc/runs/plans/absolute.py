"""Chapters 02-04: sinusoidal, FLOATER (and its discrete form, a GRU) and multiplicative absolute positions against
learned and NoPE."""
from __future__ import annotations

from . import declare
from ._common import Sizes, lm, synthetic

SIZES: dict[str, Sizes] = {
    "ci": dict(L=8, steps=600, lm_L=32, lm_steps=300, batch_size=32, d_model=32, n_layers=2, max_tokens=4096,
               seeds=(0, 1, 2)),
    "full": dict(L=32, steps=1200, lm_L=128, lm_steps=1000, batch_size=32, d_model=128, n_layers=4, max_tokens=32768,
                 seeds=(0, 1, 2)),
}


def _pair(schemes, size, *, syn_steps=None, lm_steps=None, lm_tokens=None, seeds=None, lm_seeds=None, keep=()):
    """kback at L (k=2) and a character LM at lm_L, for each scheme and seed; labels task/scheme/seed."""
    out = []
    for scheme in schemes:
        for s in seeds or size["seeds"]:
            out.append(({"task": "kback", "scheme": scheme, "seed": s},
                        synthetic(scheme, "kback", size["L"], steps=syn_steps or size["steps"], seed=s,
                                  batch_size=size["batch_size"], d_model=size["d_model"], n_layers=size["n_layers"],
                                  max_eval_factor=8, keep_weights=scheme in keep)))
        for s in lm_seeds or seeds or size["seeds"]:
            out.append(({"task": "lm", "scheme": scheme, "seed": s},
                        lm(scheme, size["lm_L"], steps=lm_steps or size["lm_steps"], seed=s,
                           batch_size=size["batch_size"], d_model=size["d_model"], n_layers=size["n_layers"],
                           max_tokens=lm_tokens or size["max_tokens"], keep_weights=scheme in keep)))
    return out


@declare("02_sinusoidal")
def sinusoidal(profile: str):
    if profile not in SIZES:
        return []
    return _pair(("learned", "sinusoidal", "nope"), SIZES[profile])


@declare("03_floater")
def floater(profile: str):
    if profile not in SIZES:
        return []
    size = SIZES[profile]
    lm_steps = 200 if profile == "ci" else None
    tokens = 2048 if profile == "ci" else None
    # the recursion in discrete form (a GRU before the Transformer) beside its continuous limit, same specs' shape
    return _pair(("floater", "sinusoidal", "rnn"), size, lm_steps=lm_steps, lm_tokens=tokens, keep=("floater", "rnn"))


@declare("04_multiplicative")
def multiplicative(profile: str):
    if profile not in SIZES:
        return []
    size = SIZES[profile]
    ci = profile == "ci"
    common = dict(syn_steps=400 if ci else None, lm_steps=200 if ci else None, lm_tokens=2048 if ci else None)
    main = _pair(("learned", "multiplicative"), size, seeds=(0, 1, 2), lm_seeds=(0,) if ci else (0, 1, 2), **common)
    # full: FLOATER's runs keep their weights as chapter 03's do, so the two chapters share one set of runs
    family = _pair(("sinusoidal", "floater", "nope"), size, seeds=(0,) if ci else (0, 1, 2),
                   keep=() if ci else ("floater",), **common)
    return main + family


@declare("01_learned")
def learned(profile: str):
    """kback at L with a learned table, then the table extended to 2L (random, copy, interpolate) and fine-tuned."""
    size: Sizes | None = {
        "ci": dict(L=8, steps=400, batch_size=32, d_model=32, n_layers=2, chunk=25, chunks=6, seeds=(0, 1, 2)),
        "full": dict(L=32, steps=1200, batch_size=64, d_model=128, n_layers=4, chunk=40, chunks=8,
                     seeds=(0, 1, 2))}.get(profile)
    if size is None:
        return []
    return [({"seed": s},
             synthetic("learned", "kback", size["L"], steps=size["steps"], batch_size=size["batch_size"],
                       d_model=size["d_model"], n_layers=size["n_layers"], seed=s, max_eval_factor=2, factors=(1,))
             .replace(recipe="learned_extension", options={"chunk": size["chunk"], "chunks": size["chunks"]}))
            for s in size["seeds"]]
