"""Chapter 17: learned and contextual position biases (KERPLE, FIRE, CoPE) and randomized positions.

Three parts, one model size per profile (the comparison sweep's):

* lm: the character LM at 1x-8x its training length for NoPE, RoPE, ALiBi, T5, KERPLE, FIRE
  and CoPE. These are the comparison sweep's own specs (`comparison.cell`), so their records
  are shared with chapter 15 and nothing is trained twice.
* counting: selective k-back on marked items (`posenc.tasks.counting`, CoPE's claim), trained
  on sources of up to L items and scored at L, 2L and 4L with the marks diluted beyond L (as
  many marked items as at L, spread over more tokens: only a count transfers, not a distance).
  NoPE, RoPE, ALiBi, KERPLE, FIRE and CoPE, and RoPE and NoPE trained at randomized positions
  (NoPE never reads positions: its randomized run must equal its plain one, a control). The
  first CoPE seed keeps its weights, so the chapter can read what its gates count.
* kback: the sweep's k-back runs (label = the item k tokens back) again, plus RoPE and the
  learned table trained at randomized positions.

Randomized positions (Ruoss et al. 2023): M = 8 x the longest evaluated sequence, so a draw
of n sorted positions from [0, M) covers every position a test sequence can reach; such runs
are scored both at 0..n-1 and, as in the paper, at randomized positions (`eval_positions`).
FIRE on the counting task starts its threshold at L / 4, the paper's ratio (512 for 2048-token
training); in the LM sweep it keeps the package default (512, beyond every evaluated position).
"""
from __future__ import annotations

from ..spec import RunSpec
from . import declare
from .comparison import SIZES, cell

LM_SCHEMES = ("nope", "rope", "alibi", "t5", "kerple", "fire", "cope")
COUNTING_SCHEMES = ("nope", "rope", "alibi", "kerple", "fire", "cope")
RANDOMIZED = {"counting": ("rope", "nope"), "kback": ("rope", "learned")}
#: M = RANDOM_FACTOR x the longest evaluated sequence (in tokens).
RANDOM_FACTOR = 8
COUNTING = {"k": 1, "dilute": True, "max_eval_factor": 4}


def counting(scheme: str, seed: int, size: dict, **scheme_kwargs) -> RunSpec:
    """Selective k-back (k = 1) trained on 4..L items, scored at L, 2L and 4L, marks diluted beyond L."""
    L = size["L_syn"]
    return RunSpec(scheme=scheme, task="counting", task_kwargs={"train_length": L, **COUNTING},
                   model={"d_model": size["d_model"], "n_heads": size["n_heads"], "n_layers": size["n_layers"],
                          "causal": True, **scheme_kwargs},
                   train={"steps": size["steps"], "batch_size": size["batch_size"], "lr": size["lr"],
                          "warmup": max(1, size["steps"] // 10)},
                   seed=seed, lengths=(L, 2 * L, 4 * L), eval={"n_samples": size["n_samples"]})


def randomized(spec: RunSpec) -> RunSpec:
    """The same run trained at sorted random positions from [0, M), M = 8 x the longest test sequence,
    and scored at ordinary and at randomized positions."""
    longest = max(spec.lengths) + 1                        # [BOS] x_1..x_n: both tasks are labelling tasks
    return spec.replace(train={"random_positions": RANDOM_FACTOR * longest}, options={"eval_positions": "both"})


@declare("17_learned_biases")
def learned_biases(profile: str):
    if profile not in SIZES:
        return []
    size = SIZES[profile]
    out = []
    for seed in size["seeds"]:
        out += [({"task": "lm", "scheme": s, "randomized": False, "seed": seed}, cell(s, "lm", seed, size))
                for s in LM_SCHEMES]
        for s in COUNTING_SCHEMES:
            kw = {"init_threshold": size["L_syn"] / 4} if s == "fire" else {}
            spec = counting(s, seed, size, **kw)
            if s == "cope" and seed == size["seeds"][0]:            # its gates are read back in the chapter
                spec = spec.replace(keep_weights=True)
            out.append(({"task": "counting", "scheme": s, "randomized": False, "seed": seed}, spec))
        out += [({"task": "counting", "scheme": s, "randomized": True, "seed": seed},
                 randomized(counting(s, seed, size))) for s in RANDOMIZED["counting"]]
        for s in RANDOMIZED["kback"]:
            out.append(({"task": "kback", "scheme": s, "randomized": False, "seed": seed}, cell(s, "kback", seed, size)))
            out.append(({"task": "kback", "scheme": s, "randomized": True, "seed": seed},
                        randomized(cell(s, "kback", seed, size))))
    return out
