"""The comparison's `paper` tier: a length-generalisation suite the models learn, a character LM trained
long enough to use position, and a learning-rate grid for every scheme.

Tasks in the spirit of Kazemnejad et al. 2023 and Ruoss et al. 2023 (`posenc.tasks.synthetic`): copy,
reverse, sort, duplicate, addition, parity and a SCAN-like command language, each trained on lengths
1..L and scored at L..4L; the schemes are Kazemnejad et al.'s (NoPE, learned and sinusoidal absolute,
T5's bias, ALiBi, RoPE) and FIRE. Every (scheme, task) first trains seed 0 at each learning rate of
`LR_GRID` (`LM_LR_GRID` for the LM); the rate with the best score at L (bits per character for the LM, accuracy otherwise) is
then used for the remaining seeds. The plan reads the store for that choice, so the tuned seeds are
declared once their grid is stored (the runner plans again after each pass). The choice uses the same
evaluation the tables report, so seed 0 is, if anything, favoured; the other seeds are not.
"""
from __future__ import annotations

from ..store import Store
from . import declare
from ._common import lm, synthetic

SCHEMES = ("nope", "learned", "sinusoidal", "rope", "alibi", "t5", "fire")
TASKS = ("lm", "copy", "reverse", "sort", "duplicate", "addition", "parity", "scan")
LR_GRID = (1e-3, 2e-3, 4e-3)
#: The LM's grid reaches further: each time most schemes chose its edge (4e-3, then 8e-3, then 1.6e-2 for five
#: of seven), it was extended by a factor of 2, until the edge stopped winning or the gain flattened out.
LM_LR_GRID = LR_GRID + (8e-3, 1.6e-2, 3.2e-2)
MODEL = dict(d_model=64, n_heads=4, n_layers=2, batch_size=32)
#: Steps per task: enough for the best scheme to reach 99% at L in a d=64, 2-layer model (calibrated on
#: RoPE and the learned table at one learning rate: sort needs 6000, copy and reverse 3000, addition 2000).
STEPS = {"copy": 3000, "reverse": 3000, "sort": 6000, "duplicate": 3000, "addition": 2000, "parity": 2000,
         "scan": 3000}
SYNTHETIC = dict(L=8, n_samples=256, seeds=(0, 1, 2, 3, 4))                # a run: 10-90 s of one CPU thread
LM = dict(L=64, steps=2000, max_tokens=32768, seeds=(0, 1, 2))             # a run: about 1.5 CPU-minutes


def cell(scheme: str, task: str, seed: int, lr: float):
    """The run of one scheme on one task at one seed and learning rate."""
    common = dict(lr=lr, seed=seed, **MODEL)
    if task == "lm":
        return lm(scheme, LM["L"], steps=LM["steps"], warmup=LM["steps"] // 10, max_tokens=LM["max_tokens"], **common)
    return synthetic(scheme, task, SYNTHETIC["L"], steps=STEPS[task], warmup=STEPS[task] // 10,
                     factors=(1, 2, 3, 4), n_samples=SYNTHETIC["n_samples"], **common)


def score_at_l(record, task: str) -> float:
    """What the grid maximises: minus bits per character at L (LM), accuracy at L otherwise."""
    row = next(r for r in record.table if float(r["x_train"]) == 1.0)
    return -row["bpc"] if task == "lm" else row["accuracy"]


def lr_grid(task: str) -> tuple:
    """The learning rates tried on seed 0 for `task`."""
    return LM_LR_GRID if task == "lm" else LR_GRID


def chosen_lr(profile: str, scheme: str, task: str, store: Store | None = None) -> float | None:
    """The grid's best learning rate (the first of equals), or None while a grid run is missing."""
    store = Store(profile) if store is None else store
    records = [store.get(cell(scheme, task, 0, lr)) for lr in lr_grid(task)]
    if any(r is None for r in records):
        return None
    scores = [score_at_l(r, task) for r in records]
    return lr_grid(task)[scores.index(max(scores))]


def declared(store: Store | None = None) -> list:
    """[(label, spec)] of the suite as `store` (default: the repository's paper store) stands: the grid of every
    (scheme, task), and its tuned seeds where the grid is stored."""
    store = Store("paper") if store is None else store
    out = []
    for scheme in SCHEMES:
        for task in TASKS:
            out += [({"part": "grid", "scheme": scheme, "task": task, "seed": 0, "lr": lr}, cell(scheme, task, 0, lr))
                    for lr in lr_grid(task)]
            best = chosen_lr("paper", scheme, task, store)
            if best is not None:
                seeds = LM["seeds"] if task == "lm" else SYNTHETIC["seeds"]
                out += [({"part": "tuned", "scheme": scheme, "task": task, "seed": s, "lr": best},
                         cell(scheme, task, s, best)) for s in seeds]
    return out


@declare("15_length_generalisation")
def suite(profile: str):
    return declared() if profile == "paper" else []


def view(store: Store | None = None) -> dict:
    """What the comparison chapter reads of the suite: how many distinct runs are declared and stored (a tuned
    seed 0 is its grid's run), the learning rate chosen for each
    (scheme, task) whose grid is stored, and the evaluation rows (columns scheme, task, seed, lr, x_train,
    accuracy or bpc) of the tuned runs, all seeds, once every one is stored; until then `rows` holds only
    the grid's best run (seed 0) of each finished grid, and `complete` is False."""
    store = Store("paper") if store is None else store
    labelled = declared(store)
    records = {s.key: store.get(s) for _, s in labelled}
    lr = {(lab["scheme"], lab["task"]): lab["lr"] for lab, _ in labelled if lab["part"] == "tuned"}
    tuned = [(lab, s) for lab, s in labelled if lab["part"] == "tuned"]
    complete = len(lr) == len(SCHEMES) * len(TASKS) and all(records[s.key] is not None for _, s in tuned)
    from ...table import Table
    shown = tuned if complete else [(lab, s) for lab, s in labelled
                                    if lab["part"] == "grid" and lr.get((lab["scheme"], lab["task"])) == lab["lr"]]
    columns = ("scheme", "task", "seed", "lr")
    rows = Table(r for lab, s in shown for r in records[s.key].rows(**{k: lab[k] for k in columns}))
    return {"declared": len(records), "stored": sum(r is not None for r in records.values()), "complete": complete,
            "lr": lr, "rows": rows}
