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
  learned table trained at randomized positions. At `ci` (300 steps) neither randomized model learns
  the task at L, so the paper tier (plan "17_kback") trains the same four runs eight times as long.

Randomized positions (Ruoss et al. 2023): M = 8 x the longest evaluated sequence, so a draw
of n sorted positions from [0, M) covers every position a test sequence can reach; such runs
are scored both at 0..n-1 and, as in the paper, at randomized positions (`eval_positions`).
FIRE on the counting task starts its threshold at L / 4, the paper's ratio (512 for 2048-token
training); in the LM sweep it keeps the package default (512, beyond every evaluated position).
"""
from __future__ import annotations

from ...analysis import FITS_AT_L
from ..spec import RunSpec
from . import declare
from ._common import Sizes
from .comparison import SIZES, cell

LM_SCHEMES = ("nope", "rope", "alibi", "t5", "kerple", "fire", "cope")
COUNTING_SCHEMES = ("nope", "rope", "alibi", "kerple", "fire", "cope")
RANDOMIZED = {"counting": ("rope", "nope"), "kback": ("rope", "learned")}
#: M = RANDOM_FACTOR x the longest evaluated sequence (in tokens).
RANDOM_FACTOR = 8
COUNTING = {"k": 1, "dilute": True, "max_eval_factor": 4}
#: The paper tier's k-back (plan "17_kback"): the ci k-back runs trained eight times as long, on five seeds. At 300
#: steps RoPE and the learned table trained at randomized positions never learn the task (0.33 to 0.44 at L, read at
#: random), so ci cannot test their claims. The steps were chosen on pilot seed 100, outside the tier: after 2400
#: steps both randomized models read 1.00 at L at random positions.
KBACK_PAPER: Sizes = {"steps": 2400, "warmup": 240, "seeds": (0, 1, 2, 3, 4)}


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


def kback_pair(scheme: str, seed: int, size: dict, **train) -> list:
    """The k-back part's two runs of `scheme` at `seed`: trained at 0..n-1, and at randomized positions."""
    plain = cell(scheme, "kback", seed, size)
    plain = plain.replace(train=train) if train else plain
    return [({"task": "kback", "scheme": scheme, "randomized": False, "seed": seed}, plain),
            ({"task": "kback", "scheme": scheme, "randomized": True, "seed": seed}, randomized(plain))]


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
            out += kback_pair(s, seed, size)
    return out


@declare("17_kback")
def kback_paper(profile: str):
    """Chapter 17's k-back part at the paper tier: the ci runs with `KBACK_PAPER`'s steps and seeds (the ci and
    full tiers keep k-back in the chapter's own plan)."""
    if profile != "paper":
        return []
    steps = {k: KBACK_PAPER[k] for k in ("steps", "warmup")}
    out = [pair for seed in KBACK_PAPER["seeds"] for s in RANDOMIZED["kback"]
           for pair in kback_pair(s, seed, SIZES["ci"], **steps)]
    # randomized RoPE keeps its weights: the chapter reads it again at other spacings (`spacing_probe`)
    return [(lab, spec.replace(keep_weights=True) if lab["randomized"] and lab["scheme"] == "rope" else spec)
            for lab, spec in out]


def paper_kback():
    """The paper tier's k-back runs (a `posenc.runs.Runs`), or None until every one is stored."""
    from ..ensure import chapter
    try:
        return chapter("17_kback", "paper", load_only=True)
    except LookupError:
        return None


def randomized_gain(rows, scheme: str, beyond, *, fits: float = FITS_AT_L) -> dict:
    """Per seed, what training at randomized positions does to `scheme` beyond L:

        gain(s) = acc_beyond(randomized, read at random, s) - acc_beyond(trained at 0..n-1, s),

    acc_beyond the mean accuracy over the lengths `beyond` (multiples of L). Only seeds on which both models fit
    the task at L (accuracy at least `fits`, each read as it was trained) are kept: a model that never learned the
    task says nothing about extrapolating it. An empty dict means no seed met that; `verdict` then gives "not
    resolved".
    """
    from ...analysis import paired_difference, per_seed
    acc = lambda x, randomized, **where: per_seed(rows, "accuracy", x_train=x, scheme=scheme, randomized=randomized,
                                                  **where)
    rand, plain = acc(beyond, True, positions="random"), acc(beyond, False)
    fitted = {s for s, a in acc(1, True, positions="random").items() if a >= fits}
    fitted &= {s for s, a in acc(1, False).items() if a >= fits}
    return {s: g for s, g in paired_difference(rand, plain).items() if s in fitted}


#: (length, range of the positions) read by `spacing_probe`, as multiples of L and of the training range M.
SPACING_PROBE = ((1, 1), (1, 0.25), (4, 1), (4, 4))


def spacing_probe(model, spec: RunSpec, cases=SPACING_PROBE) -> list:
    """Accuracy of a model trained at randomized positions when the spacing of its positions and the length of
    its input are changed apart. Each case (a, b) reads inputs of a L tokens at sorted positions drawn from
    [0, b M), M the training range: their mean gap is about b M / (a L). (1, 1) is the training protocol at L;
    (1, 1/4) packs the positions of an L-token input as closely as the protocol packs a 4L one; (4, 1) is the
    protocol at 4L; (4, 4) spreads a 4L input back to the training gaps (which also brings distances never
    seen). Rows: {length, positions from, mean gap, accuracy}."""
    from ..evaluate import length_table
    from ..train import RandomPositions
    from ...tasks import make_task
    task = make_task(spec.task, **spec.task_kwargs)
    L, M = task.train_length, spec.train["random_positions"]
    rows = []
    for a, b in cases:
        m, n = int(round(b * M)), a * L
        acc = length_table(RandomPositions(model, m, seed=1_000_003 * spec.seed + n), task, [n], **spec.eval)
        rows.append({"length": f"{a}L", "positions from": f"[0, {b:g} M)", "mean gap": round(m / (n + 1), 1),
                     "accuracy": acc[0]["accuracy"]})
    return rows
