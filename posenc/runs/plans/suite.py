"""The comparison's `paper` tier: a length-generalisation suite the models learn, a character LM trained
long enough to use position, and a learning-rate grid for every scheme.

Tasks in the spirit of Kazemnejad et al. 2023 and Ruoss et al. 2023 (`posenc.tasks.synthetic`): copy,
reverse, sort, duplicate, addition, parity and a SCAN-like command language, each trained on lengths
1..L and scored at L..4L; the schemes are Kazemnejad et al.'s (NoPE, learned and sinusoidal absolute,
T5's bias, ALiBi, RoPE) and FIRE. The LM is also trained for every other scheme of the comparison sweep
(`lm_schemes`: every registered scheme and the sweep's option rows), with the same grid, so that every scheme is
compared once at a scale where position is used. Every (scheme, task) first trains seed 0 at each learning rate of
`LR_GRID` (`LM_LR_GRID` for the LM); a grid whose best rate is its largest is extended by doubling, one rate
at a time (`rates`), until its best lies inside it; the rate with the best score at L (bits per character for
the LM, accuracy otherwise) is then used for the remaining seeds. The plan reads the store for that choice, so the tuned seeds are
declared once their grid is stored (the runner plans again after each pass). The choice uses the same
evaluation the tables report, so seed 0 is, if anything, favoured; the other seeds are not.
"""
from __future__ import annotations

from ..store import Store
from . import declare
from ._common import Sizes, Variant, lm, synthetic

SCHEMES = ("nope", "learned", "sinusoidal", "rope", "alibi", "t5", "fire")
TASKS = ("lm", "copy", "reverse", "sort", "duplicate", "addition", "parity", "scan")
LR_GRID = (1e-3, 2e-3, 4e-3)
#: The LM's grid reaches further: each time most schemes chose its edge (4e-3, then 8e-3, then 1.6e-2 for five
#: of seven), it was extended by a factor of 2, until the edge stopped winning or the gain flattened out.
LM_LR_GRID = LR_GRID + (8e-3, 1.6e-2, 3.2e-2)
#: The most rates `rates` adds to one grid, each twice the last (up to 8x the base grid's largest rate). The
#: first doubling settled every grid of the tier: where it won, the second lost.
MAX_EXTENSIONS = 3
MODEL: Sizes = dict(d_model=64, n_heads=4, n_layers=2, batch_size=32)
#: Steps per task: enough for the best scheme to reach 99% at L in a d=64, 2-layer model (calibrated on
#: RoPE and the learned table at one learning rate: sort needs 6000, copy and reverse 3000, addition 2000).
STEPS = {"copy": 3000, "reverse": 3000, "sort": 6000, "duplicate": 3000, "addition": 2000, "parity": 2000,
         "scan": 3000}
SYNTHETIC: Sizes = dict(L=8, n_samples=256, seeds=(0, 1, 2, 3, 4))         # a run: 10-90 s of one CPU thread
LM: Sizes = dict(L=64, steps=2000, max_tokens=32768, seeds=(0, 1, 2, 3, 4))  # a run: about 1.5 CPU-minutes
#: LM rows of the tier's own, beyond the comparison's: label -> (scheme, model options, training settings). FIRE's
#: threshold starts at 512 (its paper's code, trained on 2048 tokens: L/4); this row starts it at the same ratio
#: of our L, so that its normalisation acts within 8L. T5's last bucket starts at max_distance = 128, above our
#: L, so its far buckets never train; Press et al. trained it on 512 tokens, where every bucket does. This row
#: keeps T5's 32 buckets and ends them at L/2, so that every bucket trains here too. xPos's libraries take the
#: scale base 512 from a 1024-token model (L/2); at our L that decay is 16 times slower, and this row uses L/2.
LM_VARIANTS: dict[str, Variant] = {
    "fire (threshold L/4)": ("fire", {"init_threshold": LM["L"] / 4}, {}),
    "t5 (max_distance L/2)": ("t5", {"max_distance": LM["L"] // 2}, {}),
    "xpos (scale L/2)": ("xpos", {"scale_base": LM["L"] / 2}, {}),
    # chapters 05 and 06's ablations, judged here where the LM uses position: Shaw et al.'s clipping
    # distance k = 2 (the default is 16), and XLNet's u, v per layer (Transformer-XL shares them)
    "shaw (k = 2)": ("shaw", {"max_distance": 2}, {}),
    "xl (per-layer u, v)": ("xl", {"untie_uv": True}, {})}


def lm_schemes() -> tuple:
    """The schemes whose LM the tier trains: `SCHEMES` first, then the comparison sweep's other rows (every
    registered scheme it compares, then its option rows such as "rope (randomized)"), in the sweep's order,
    then the tier's own option rows (`LM_VARIANTS`)."""
    from . import comparison
    rest = comparison.schemes_compared() + tuple(comparison.VARIANTS) + tuple(LM_VARIANTS)
    return SCHEMES + tuple(s for s in rest if s not in SCHEMES)


def cell(scheme: str, task: str, seed: int, lr: float):
    """The run of one scheme (or one option row of the comparison's `VARIANTS` or of `LM_VARIANTS`) on one task
    at one seed and learning rate."""
    from .comparison import VARIANTS
    if scheme in VARIANTS or scheme in LM_VARIANTS:
        base, model, train = {**VARIANTS, **LM_VARIANTS}[scheme]
        return cell(base, task, seed, lr).replace(model=model, train=train)
    common: Sizes = dict(lr=lr, seed=seed, **MODEL)
    if task == "lm":
        return lm(scheme, LM["L"], steps=LM["steps"], warmup=LM["steps"] // 10, max_tokens=LM["max_tokens"], **common)
    return synthetic(scheme, task, SYNTHETIC["L"], steps=STEPS[task], warmup=STEPS[task] // 10,
                     factors=(1, 2, 3, 4), n_samples=SYNTHETIC["n_samples"], **common)


def score_at_l(record, task: str) -> float:
    """What the grid maximises: minus bits per character at L (LM), accuracy at L otherwise."""
    row = next(r for r in record.table if float(r["x_train"]) == 1.0)
    return -row["bpc"] if task == "lm" else row["accuracy"]


def seeds(task: str) -> tuple:
    """The seeds a tuned (scheme, task) is trained with."""
    return LM["seeds"] if task == "lm" else SYNTHETIC["seeds"]


def lr_grid(task: str) -> tuple:
    """The learning rates every scheme tries on seed 0 for `task`, before any extension (`rates`)."""
    return LM_LR_GRID if task == "lm" else LR_GRID


def _grid(scheme: str, task: str, store: Store) -> tuple[tuple, dict | None]:
    """(`rates`, `grid_scores`) in one pass over the stored runs, each record read once: the base grid, then
    twice its largest rate while that rate scores best (at most `MAX_EXTENSIONS` times)."""
    grid: tuple[float, ...] = ()
    scores: dict[float, float] = {}
    for lr in lr_grid(task):
        grid += (lr,)
        record = store.get(cell(scheme, task, 0, lr))
        if record is None:
            return lr_grid(task), None
        scores[lr] = score_at_l(record, task)
    for _ in range(MAX_EXTENSIONS):
        if _best(scores) != grid[-1]:
            break
        grid += (2 * grid[-1],)
        record = store.get(cell(scheme, task, 0, grid[-1]))
        if record is None:
            return grid, None
        scores[grid[-1]] = score_at_l(record, task)
    return grid, scores


def rates(profile: str, scheme: str, task: str, store: Store | None = None) -> tuple:
    """The learning rates (scheme, task) tries on seed 0, as its stored runs stand: `lr_grid(task)`, then, while
    the best of those stored is the largest, twice the largest (at most `MAX_EXTENSIONS` times), so that the
    chosen rate is a maximum inside the grid rather than at its edge. The last rate may not be stored yet."""
    return _grid(scheme, task, Store(profile) if store is None else store)[0]


def grid_scores(profile: str, scheme: str, task: str, store: Store | None = None) -> dict | None:
    """{learning rate: `score_at_l`} of the seed-0 runs at every rate of `rates`, or None while one is missing
    (an extension included)."""
    return _grid(scheme, task, Store(profile) if store is None else store)[1]


def _best(scores: dict) -> float:
    """The learning rate with the best score, the smallest of equals."""
    return max(scores, key=lambda lr: (scores[lr], -lr))


def chosen_lr(profile: str, scheme: str, task: str, store: Store | None = None) -> float | None:
    """The grid's best learning rate (the first of equals), or None while a grid run is missing."""
    scores = grid_scores(profile, scheme, task, store)
    return None if scores is None else _best(scores)


def at_the_edge(profile: str = "paper", store: Store | None = None) -> list:
    """[(scheme, task, gain)] for each stored grid whose best rate is still the largest it tried, after every
    extension `rates` allows, with the gain of that rate's score over the next smaller rate's: where the
    scheme may be under-tuned."""
    out = []
    for scheme, task in pairs():
        scores = grid_scores(profile, scheme, task, store)
        if scores is not None and _best(scores) == max(scores):
            below, top = sorted(scores)[-2:]
            out.append((scheme, task, scores[top] - scores[below]))
    return out


def extended(profile: str = "paper", store: Store | None = None) -> list:
    """[(scheme, task, rates added, chosen rate, gain)] for each stored grid that `rates` extended beyond
    `lr_grid(task)`: the gain is the chosen rate's score over the best of the base grid (0 where the extension
    did not win)."""
    out = []
    for scheme, task in pairs():
        scores = grid_scores(profile, scheme, task, store)
        base = lr_grid(task)
        if scores is not None and len(scores) > len(base):
            best = _best(scores)
            out.append((scheme, task, tuple(sorted(scores))[len(base):], best,
                        scores[best] - max(scores[lr] for lr in base)))
    return out


def pairs() -> list:
    """Every (scheme, task) the tier tunes and trains: each of `SCHEMES` on every task, then the LM of each
    further scheme of `lm_schemes`."""
    return [(s, t) for s in SCHEMES for t in TASKS] + [(s, "lm") for s in lm_schemes() if s not in SCHEMES]


def declared(store: Store | None = None) -> list:
    """[(label, spec)] of the suite as `store` (default: the repository's paper store) stands: the grid of every
    pair of `pairs()`, and its tuned seeds where the grid is stored."""
    store = Store("paper") if store is None else store
    out = []
    for scheme, task in pairs():
        grid, scores = _grid(scheme, task, store)
        out += [({"part": "grid", "scheme": scheme, "task": task, "seed": 0, "lr": lr}, cell(scheme, task, 0, lr))
                for lr in grid]
        if scores is not None:
            best = _best(scores)
            out += [({"part": "tuned", "scheme": scheme, "task": task, "seed": s, "lr": best},
                     cell(scheme, task, s, best)) for s in seeds(task)]
    return out


def tuned_records(scheme: str, task: str, store: Store | None = None) -> dict | None:
    """{seed: stored record} of the tuned runs of (scheme, task), at the grid's chosen learning rate; None while
    the grid or any tuned seed is missing. For what the evaluation rows do not hold: training histories."""
    store = Store("paper") if store is None else store
    best = chosen_lr("paper", scheme, task, store)
    if best is None:
        return None
    records = {s: store.get(cell(scheme, task, s, best)) for s in seeds(task)}
    return None if any(r is None for r in records.values()) else records


def lm_table(schemes=None, store: Store | None = None, factors=(1, 2, 4, 8)):
    """The tier's LM of `schemes` (default: every row of `lm_schemes`) as one table, a row per scheme: the rate
    its grid chose, then bits per character at each factor * L as the mean over seeds with its 95% interval, and
    the ratio of the means at the last and first factor (`posenc.analysis.length_table`, best at L first).
    None while a tuned run of one of them is missing, so that a chapter shows only finished rows."""
    from ...analysis import length_table
    from ...table import Table
    schemes = lm_schemes() if schemes is None else tuple(schemes)
    unknown = [s for s in schemes if s not in lm_schemes()]
    if unknown or not schemes:
        raise ValueError(f"schemes: {unknown or 'empty'} not among the tier's LM rows {lm_schemes()}")
    store = Store("paper") if store is None else store
    found = {s: tuned_records(s, "lm", store) for s in schemes}
    tuned = {s: by_seed for s, by_seed in found.items() if by_seed is not None}
    if len(tuned) < len(found):
        return None
    rows = Table(r for s, by_seed in tuned.items() for seed, rec in by_seed.items()
                 for r in rec.rows(scheme=s, task="lm", seed=seed))
    rate = {s: chosen_lr("paper", s, "lm", store) for s in schemes}
    return Table({"scheme": r["scheme"], "learning rate": f"{rate[r['scheme']]:g}", **r}
                 for r in length_table(rows, factors=factors))


@declare("15_length_generalisation")
def suite(profile: str):
    return declared() if profile == "paper" else []


def view(store: Store | None = None, lm_only: bool = False) -> dict:
    """What the chapters read of the suite: how many distinct runs are declared and stored (a tuned
    seed 0 is its grid's run), the learning rate chosen for each
    (scheme, task) whose grid is stored, and the evaluation rows (columns scheme, task, seed, lr, x_train,
    accuracy or bpc) of the tuned runs, all seeds, once every one is stored; until then `rows` holds only
    the grid's best run (seed 0) of each finished grid, and `complete` is False.

    `lm_only=False` (the default) is the suite of `SCHEMES` on every task; `lm_only=True` is the LM of every
    scheme of `lm_schemes()`. `pending` is what a chapter prints until `complete`: how far the tier has got
    and the command that resumes it ("" once complete); `made` says what `rows` come from, in words."""
    store = Store("paper") if store is None else store
    wanted = ({(s, "lm") for s in lm_schemes()} if lm_only else {(s, t) for s in SCHEMES for t in TASKS})
    labelled = [(lab, s) for lab, s in declared(store) if (lab["scheme"], lab["task"]) in wanted]
    records = {s.key: store.get(s) for _, s in labelled}
    lr = {(lab["scheme"], lab["task"]): lab["lr"] for lab, _ in labelled if lab["part"] == "tuned"}
    tuned = [(lab, s) for lab, s in labelled if lab["part"] == "tuned"]
    complete = len(lr) == len(wanted) and all(records[s.key] is not None for _, s in tuned)
    from ...table import Table
    shown = tuned if complete else [(lab, s) for lab, s in labelled
                                    if lab["part"] == "grid" and lr.get((lab["scheme"], lab["task"])) == lab["lr"]]
    columns = ("scheme", "task", "seed", "lr")
    have = {key: record for key, record in records.items() if record is not None}   # a tuned rate's grid is stored
    rows = Table(r for lab, s in shown for r in have[s.key].rows(**{k: lab[k] for k in columns}))
    stored = len(have)
    pending = "" if complete else (f"paper tier incomplete ({stored} of {len(records)} runs stored so far): "
                                   "python -m posenc.runs --profile paper --chapters 15_length_generalisation")
    from ..ensure import made
    return {"declared": len(records), "stored": stored, "complete": complete, "lr": lr, "rows": rows,
            "pending": pending, "made": made((have[s.key] for _, s in shown), (lab["seed"] for lab, _ in shown))}
