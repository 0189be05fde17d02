"""Chapters 05-07b and 14: Shaw's clipping ablation, T5's bias, the relative schemes side by side, ALiBi."""
from __future__ import annotations

from . import declare
from ._common import Sizes, lm, synthetic

FULL_SEEDS, CI_SEEDS = (0, 1, 2), (0, 1, 2)


@declare("05_shaw")
def shaw(profile: str):
    """Shaw et al.'s Tables 2 and 3 on bidirectional kback (L = 16): clipping distance k, keys/values."""
    size: Sizes | None = {"ci": dict(steps=300, batch_size=32, d_model=32, n_layers=2, seeds=(0, 1, 2, 3, 4), lm_L=64,
                                     lm_steps=300, max_tokens=4096),
                          "full": dict(steps=800, batch_size=64, d_model=128, n_layers=3, seeds=FULL_SEEDS, lm_L=128,
                                       lm_steps=1000, max_tokens=32768)}.get(profile)
    if size is None:
        return []
    variants = {f"k={k}": dict(max_distance=k) for k in (0, 1, 2, 4, 16)}
    variants |= {"keys only, k=16": dict(max_distance=16, values=False),
                 "values only, k=16": dict(max_distance=16, keys=False)}
    kback = [({"variant": name, "seed": s},
              synthetic("shaw", "kback", 16, steps=size["steps"], batch_size=size["batch_size"], d_model=size["d_model"],
                        n_layers=size["n_layers"], warmup=30, seed=s, factors=(1, 2, 4), causal=False,
                        keep_weights=name == "k=4" and s == 0, **kwargs))
             for name, kwargs in variants.items() for s in size["seeds"]]
    # The clipping claim on a task that does not fix the offset it needs: the character LM, k = 2 against 16.
    lm_runs = [({"variant": f"k={k}", "seed": s, "task": "lm"},
                lm("shaw", size["lm_L"], steps=size["lm_steps"], batch_size=size["batch_size"], d_model=size["d_model"],
                   n_layers=size["n_layers"], seed=s, max_tokens=size["max_tokens"], factors=(1,), max_distance=k))
               for k in (2, 16) for s in size["seeds"]]
    return kback + lm_runs


@declare("07_t5")
def t5(profile: str):
    size: Sizes | None = {
        "ci": dict(L=64, steps=400, batch_size=16, d_model=64, n_layers=2, max_tokens=4096, seeds=CI_SEEDS),
        "full": dict(L=128, steps=1000, batch_size=32, d_model=128, n_layers=4, max_tokens=32768,
                     seeds=FULL_SEEDS)}.get(profile)
    if size is None:
        return []
    return [({"scheme": "t5", "seed": s},
             lm("t5", size["L"], steps=size["steps"], batch_size=size["batch_size"], d_model=size["d_model"],
                n_layers=size["n_layers"], lr=2e-3, warmup=40, seed=s, max_tokens=size["max_tokens"],
                keep_weights=s == size["seeds"][0]))
            for s in size["seeds"]]


@declare("07b_relative_comparison")
def relative_comparison(profile: str):
    size: Sizes | None = {
        "ci": dict(L=64, lm_steps=300, lm_batch=16, d_model=64, n_layers=2, max_tokens=4096, task_steps=300,
                   task_batch=32, task_d_model=32, seeds=CI_SEEDS),
        "full": dict(L=128, lm_steps=1000, lm_batch=32, d_model=128, n_layers=4, max_tokens=32768,
                     task_steps=800, task_batch=64, task_d_model=128, seeds=FULL_SEEDS)}.get(profile)
    if size is None:
        return []
    out = []
    for scheme in ("nope", "sinusoidal", "shaw", "xl", "t5"):
        for s in size["seeds"]:
            out.append(({"task": "kback", "scheme": scheme, "seed": s},
                        synthetic(scheme, "kback", 16, k=3, steps=size["task_steps"], batch_size=size["task_batch"],
                                  d_model=size["task_d_model"], n_layers=2, warmup=30, seed=s, factors=(1, 2, 4))))
            out.append(({"task": "lm", "scheme": scheme, "seed": s},
                        lm(scheme, size["L"], steps=size["lm_steps"], batch_size=size["lm_batch"],
                           d_model=size["d_model"], n_layers=size["n_layers"], lr=2e-3, warmup=40, seed=s,
                           max_tokens=size["max_tokens"])))
    return out


@declare("14_alibi")
def alibi(profile: str):
    size: Sizes | None = {
        "ci": dict(L=64, steps=300, batch_size=32, d_model=64, n_layers=2, max_tokens=8192, seeds=CI_SEEDS),
        "full": dict(L=128, steps=1000, batch_size=32, d_model=128, n_layers=4, max_tokens=65536,
                     seeds=FULL_SEEDS)}.get(profile)
    if size is None:
        return []
    return [({"scheme": scheme, "seed": s},
             lm(scheme, size["L"], steps=size["steps"], batch_size=size["batch_size"], d_model=size["d_model"],
                n_layers=size["n_layers"], n_heads=8, lr=2e-3, warmup=100, seed=s, max_tokens=size["max_tokens"]))
            for scheme in ("alibi", "nope", "sinusoidal", "rope", "t5") for s in size["seeds"]]


@declare("06_transformer_xl")
def transformer_xl(profile: str):
    """Transformer-XL trained on two segments of L with memory, scored with memories 0 to 4L: u, v shared by all
    layers (Transformer-XL, the scheme's default) and one u, v per layer (XLNet, untie_uv=True), same budget; the
    first per-layer run keeps its weights (the chapter reads its learned u, v)."""
    size: Sizes | None = {
        "ci": dict(segment=32, steps=400, batch_size=16, d_model=64, n_layers=2, max_tokens=8192, seeds=(0, 1, 2)),
        "full": dict(segment=64, steps=1000, batch_size=32, d_model=128, n_layers=4, max_tokens=32768,
                     seeds=FULL_SEEDS)}.get(profile)
    if size is None:
        return []
    L = size["segment"]
    variants = {"shared": {}, "per-layer": {"untie_uv": True}}
    return [({"uv": uv, "seed": s},
             lm("xl", 2 * L, steps=size["steps"], batch_size=size["batch_size"], d_model=size["d_model"],
                n_layers=size["n_layers"], lr=2e-3, warmup=40, seed=s, max_tokens=size["max_tokens"], factors=(),
                keep_weights=bool(model) and s == size["seeds"][0], **model)
             .replace(recipe="xl_memory", options={"segment": L, "mem_lens": [0, L // 2, L, 2 * L, 4 * L]}))
            for uv, model in variants.items() for s in size["seeds"]]
