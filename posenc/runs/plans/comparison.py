"""Chapter 15: every registered scheme on the same tasks (the comparison sweep).

Each (scheme, task, seed) is one run with identical model size, budget and evaluation:
a causal character LM scored at 1x-8x its training length, and four generated tasks
scored at 1x-4x. New schemes join the sweep by registering themselves.
"""
from __future__ import annotations

from ...scheme import SCHEMES
from . import declare
from ._common import Sizes, Variant, lm, synthetic

SIZES: dict[str, Sizes] = {
    "ci": dict(d_model=64, n_heads=4, n_layers=2, steps=300, batch_size=32, lr=2e-3, L_lm=64, L_syn=12,
               max_tokens=8192, n_samples=128, seeds=(0, 1, 2)),
    "full": dict(d_model=128, n_heads=4, n_layers=4, steps=800, batch_size=32, lr=2e-3, L_lm=128, L_syn=16,
                 max_tokens=65536, n_samples=256, seeds=(0, 1, 2)),
}
TASKS = ("lm", "copy", "reverse", "kback", "recall")
#: The tasks of each profile. `full` keeps the two its model learns within its budget, so that the whole tier
#: fits one H200 window (`posenc.runs.costs.WINDOW`). Probed on a CPU at the full size (RoPE, seed 0): at
#: 800 steps reverse 0.994 and kback 1.000 token accuracy at L; copy 0.65 after 1000 steps and 0.76 after
#: 2000; recall 0.07 after 2000, at chance. Its LM at 800 steps uses position: bits per character at L, then 8L,
#: NoPE 3.14, 3.70; learned 2.34, 5.02; RoPE 2.07, 3.68; ALiBi 2.15, 2.12.
PROFILE_TASKS = {"ci": TASKS, "full": ("lm", "reverse", "kback")}
#: Schemes outside the token-sequence comparison (vision-only and the like register elsewhere).
EXCLUDED: tuple = ()
#: Options that join the comparison as rows of their own: label -> (scheme, model options, training
#: settings). Hybrid layers as Llama 4 builds them (no rotation in every k-th layer; k = 2 in a
#: 2-layer model), and randomized positions (Ruoss et al. 2023), positions drawn from [0, M) with M
#: above the longest evaluation length of every task (NoPE has no positions to randomize).
RANDOM_RANGE = 1024
VARIANTS: dict[str, Variant] = {
    "rope (NoPE layers)": ("rope", {"nope_every": 2}, {}),
    "rope (randomized)": ("rope", {}, {"random_positions": RANDOM_RANGE}),
}


def cell(scheme: str, task: str, seed: int, size: dict):
    """The sweep's spec for one (scheme, task, seed) at a tier's `size`: the character LM trained at `L_lm`, or a
    synthetic task at `L_syn`, scored at 1x to 8x and 1x to 4x its training length respectively."""
    common = dict(steps=size["steps"], batch_size=size["batch_size"], d_model=size["d_model"],
                  n_layers=size["n_layers"], n_heads=size["n_heads"], lr=size["lr"],
                  warmup=max(1, size["steps"] // 10), seed=seed)
    if task == "lm":
        return lm(scheme, size["L_lm"], max_tokens=size["max_tokens"], **common)
    return synthetic(scheme, task, size["L_syn"], k=2, factors=(1, 2, 3, 4), n_samples=size["n_samples"], **common)


@declare("15_comparison")
def comparison(profile: str):
    if profile not in SIZES:
        return []
    size = SIZES[profile]
    schemes = schemes_compared()
    out = [({"scheme": s, "task": t, "seed": seed}, cell(s, t, seed, size))
           for s in schemes for t in PROFILE_TASKS[profile] for seed in size["seeds"]]
    return out + [({"scheme": label, "task": t, "seed": seed}, variant_cell(label, t, seed, size))
                  for label in VARIANTS for t in PROFILE_TASKS[profile] for seed in size["seeds"]]


#: The comparison's families, for its figures: absolute schemes, and the relative schemes of the source articles;
#: every other row is a scheme from after 2021.
ABSOLUTE = ("nope", "learned", "sinusoidal", "floater", "multiplicative", "complex")
SOURCE_RELATIVE = ("shaw", "xl", "t5", "tupe", "deberta", "rope")      # ALiBi (2021) came after the articles


def families(schemes) -> list:
    """[(name, schemes)] of the three panels of the comparison's LM figures, each in the order of `schemes`:
    the absolute schemes; NoPE and the source articles' relative schemes; and NoPE, RoPE and ALiBi for
    reference with the schemes after 2021. An option row such as "t5 (max_distance L/2)" sits with its
    scheme, except the sweep's own `VARIANTS` (randomized positions, NoPE layers), ideas after 2021."""
    schemes = list(schemes)
    base = {s: s if s in VARIANTS else s.split(" (")[0] for s in schemes}
    newer = [s for s in schemes if base[s] not in ABSOLUTE + SOURCE_RELATIVE and s != "alibi"]
    return [("absolute", [s for s in schemes if base[s] in ABSOLUTE]),
            ("relative, in the source articles", ["nope"] + [s for s in schemes if base[s] in SOURCE_RELATIVE]),
            ("after 2021 (RoPE, ALiBi for reference)", ["nope", "rope", "alibi"] + newer)]


def schemes_compared() -> tuple:
    """The registered schemes the sweep compares, sorted (the option rows of `VARIANTS` come after them)."""
    return tuple(sorted(s for s in SCHEMES if s not in EXCLUDED))


def variant_cell(label: str, task: str, seed: int, size: dict):
    """The run of one option row of `VARIANTS`: the scheme's own cell with the option set."""
    scheme, model, train = VARIANTS[label]
    return cell(scheme, task, seed, size).replace(model=model, train=train)
