"""Chapters 08 (TUPE) and 09 (DeBERTa): masked-LM + [CLS] pre-training of BERT-A and the variants."""
from __future__ import annotations

from ..spec import RunSpec
from . import declare
from ._common import Sizes

SIZES: dict[str, Sizes] = {
    "ci": dict(steps=1000, batch_size=32, length=16, k=8, d_model=64, n_layers=2, log_every=25, lr=5e-3,
               seeds=(0, 1, 2)),
    # the CPU tier at which the claims are decided: 64 characters, trained three times as long as ci, five seeds,
    # at the learning rate that BERT-A's seed 0 does best with among `lr_grid` (the grid's runs are stored too);
    # BERT-A is also trained at `check_lr` on every seed, to show the chosen rate does not handicap the baseline
    "paper": dict(steps=3000, batch_size=32, length=64, k=32, d_model=64, n_layers=2, log_every=50, lr=5e-3,
                  seeds=(0, 1, 2, 3, 4), lr_grid=(2e-3, 5e-3, 1e-2), check_lr=2e-3),
    "full": dict(steps=1000, batch_size=32, length=128, k=32, d_model=128, n_layers=4, log_every=50, lr=2e-3,
                 seeds=(0, 1, 2)),
}
#: The tiers with the `[CLS]` tasks that need order (`MaskedLMWithCLS(cls_task=...)`: the second half shuffled,
#: or half the window from a random offset), added after the `full` tier's GPU runs were made; `full` has the
#: noise-tail task only.
ORDER_TIERS = ("ci", "paper")
ORDER_TASKS = ("shuffled_half", "shuffled_span")
#: The label of the baseline's learning-rate grid runs (each also labelled with its "lr"); the chapters' models are
#: the runs without an "lr" label, all at SIZES[profile]["lr"].
GRID_MODEL = "BERT-A (rate grid)"


def pretraining(scheme: str, size: dict, seed: int, keep_weights: bool = False, cls_task: str | None = None,
                lr: float | None = None, **scheme_kwargs) -> RunSpec:
    task_kwargs = {"train_length": size["length"], **({"cls_task": cls_task} if cls_task else {})}
    return RunSpec(scheme=scheme, task="mlm_cls", task_kwargs=task_kwargs, recipe="pretrain",
                   model={"d_model": size["d_model"], "n_heads": 4, "n_layers": size["n_layers"], **scheme_kwargs},
                   train={"steps": size["steps"], "batch_size": size["batch_size"], "lr": size["lr"] if lr is None else lr,
                          "warmup": size["steps"] // 10, "log_every": size["log_every"]},
                   seed=seed, keep_weights=keep_weights)


def view(runs, cls_task: str | None = None) -> tuple:
    """What chapters 08 and 09 read from the runs of one [CLS] task (None: the continuation task):
    (rows, histories by (model, seed), variants, seeds, steps, task)."""
    from ...tasks import make_task
    chosen = runs.select(cls_task=cls_task, lr=None)                  # the rate grid's other runs are not shown here
    labels = [lab for lab, _ in chosen]
    seeds = sorted({lab["seed"] for lab in labels})
    spec = runs.spec(model=labels[0]["model"], seed=seeds[0], cls_task=cls_task, lr=None)
    histories = {(lab["model"], lab["seed"]): rec.history for lab, rec in chosen}
    variants = list(dict.fromkeys(lab["model"] for lab in labels))
    return (runs.rows(cls_task=cls_task, lr=None), histories, variants, seeds, spec.train["steps"],
            make_task(spec.task, **spec.task_kwargs))


def _bert_mlm(runs, seed: int, lr: float) -> float:
    """Held-out MLM loss of BERT-A at one seed and rate: the chapter's own run at the chosen rate, else a GRID_MODEL run."""
    if lr == SIZES[runs.profile]["lr"]:
        return runs.record(model="BERT-A", seed=seed, cls_task=None, lr=None).table[0]["mlm"]
    return runs.record(model=GRID_MODEL, seed=seed, lr=lr).table[0]["mlm"]


def rate_grid(runs):
    """BERT-A's seed-0 held-out MLM loss at each rate of the profile's `lr_grid` (a Table: lr, mlm, chosen), or
    None for a profile without a grid. The chosen rate's run is the chapter's own BERT-A, seed 0."""
    from ...table import Table
    size = SIZES[runs.profile]
    if "lr_grid" not in size:
        return None
    return Table({"lr": lr, "mlm": _bert_mlm(runs, 0, lr), "chosen": lr == size["lr"]} for lr in size["lr_grid"])


def _variants(variants: dict, profile: str, keep=(), cls_task: str | None = None):
    size = SIZES.get(profile)
    if size is None:
        return []
    label = {"cls_task": cls_task} if cls_task else {}
    return [({"model": name, "seed": s, **label},
             pretraining(scheme, size, s, keep_weights=name in keep, cls_task=cls_task, **kw(size)))
            for s in size["seeds"] for name, (scheme, kw) in variants.items()]


def baseline_check(runs, against: str | None = None):
    """BERT-A's held-out MLM loss per seed at the chosen rate and at the profile's `check_lr` (a Table: seed, one
    column per rate, and the better of the two; with `against`, a model of the chapter, also "lead": the better
    minus that model's loss), or None for a profile without a check."""
    from ...table import Table
    size = SIZES[runs.profile]
    if "check_lr" not in size:
        return None
    out = Table()
    for s in size["seeds"]:
        row = {"seed": s, **{f"mlm at {lr:g}": _bert_mlm(runs, s, lr) for lr in (size["lr"], size["check_lr"])}}
        row["better"] = min(v for k, v in row.items() if k.startswith("mlm at"))
        if against is not None:
            row["lead"] = row["better"] - runs.record(model=against, seed=s, cls_task=None, lr=None).table[0]["mlm"]
        out.append(row)
    return out


def rates_report(runs, against: str) -> str:
    """What chapters 08 and 09 print about BERT-A's learning rate: the profile's grid (`rate_grid`), or the one
    rate every model trains at; then, where the profile has one, the check of every seed at a second rate
    (`baseline_check`) with `against`'s mean lead over the better of the two and its 95% interval."""
    from ...analysis import bootstrap_ci
    grid = rate_grid(runs)
    lines = [str(grid.round(3)) if grid is not None else f"no rate grid at {runs.profile}: every model trains at lr "
             f"{runs.spec(model='BERT-A', seed=0, cls_task=None, lr=None).train['lr']}"]
    check = baseline_check(runs, against=against)
    if check is not None:
        lead = check.column("lead")                                  # the better BERT-A minus `against`, per seed
        lo, hi = bootstrap_ci(lead)
        lines += [str(check.round(3)), f"{against} below the better of BERT-A's two rates, per seed:\n  "
                  f"{sum(lead) / len(lead):.3f} nats (95% interval {lo:.3f} to {hi:.3f})"]
    return "\n".join(lines)


def _grid(profile: str) -> list:
    """BERT-A's seed 0 at each other rate of the profile's `lr_grid`, and its other seeds at `check_lr` (each
    labelled GRID_MODEL and lr)."""
    size = SIZES.get(profile, {})
    grid = [({"model": GRID_MODEL, "seed": 0, "lr": lr}, pretraining("learned", size, 0, lr=lr))
            for lr in size.get("lr_grid", ()) if lr != size["lr"]]
    check = [({"model": GRID_MODEL, "seed": s, "lr": size["check_lr"]}, pretraining("learned", size, s, lr=size["check_lr"]))
             for s in size["seeds"] if s != 0] if "check_lr" in size else []
    return grid + check


@declare("08_tupe")
def tupe(profile: str):
    return _grid(profile) + _variants({
        "BERT-A": ("learned", lambda size: {}),
        "TUPE-A": ("tupe", lambda size: {}),
        "TUPE-R": ("tupe", lambda size: dict(relative=True, num_buckets=16, max_distance=size["length"])),
        "TUPE-A tie-cls": ("tupe", lambda size: dict(cls_reset=False)),
        "BERT-A^d": ("tupe", lambda size: dict(cross_terms=True, cls_reset=False)),
    }, profile, keep=("BERT-A", "TUPE-A")) + _variants({
        "BERT-A": ("learned", lambda size: {}),
        "TUPE-A": ("tupe", lambda size: {}),
        "TUPE-A tie-cls": ("tupe", lambda size: dict(cls_reset=False)),
    }, profile, cls_task="noise_tail") + [run for task in (ORDER_TASKS if profile in ORDER_TIERS else ())
                                          for run in _variants({
        "BERT-A": ("learned", lambda size: {}),
        "TUPE-A": ("tupe", lambda size: {}),
        "TUPE-A tie-cls": ("tupe", lambda size: dict(cls_reset=False)),
    }, profile, keep=("TUPE-A", "TUPE-A tie-cls"), cls_task=task)]


def reset_task(runs) -> str:
    """The `[CLS]` task on which chapter 08 judges TUPE's reset: "shuffled_half" (a label only order can give)
    where the tier has its runs, else "noise_tail"."""
    return "shuffled_half" if runs.profile in ORDER_TIERS else "noise_tail"


@declare("09_deberta")
def deberta(profile: str):
    return _grid(profile) + _variants({
        "BERT-A": ("learned", lambda size: {}),
        "DeBERTa": ("deberta", lambda size: dict(k=size["k"])),
        "-C2P": ("deberta", lambda size: dict(k=size["k"], terms=["p2c"])),
        "-P2C": ("deberta", lambda size: dict(k=size["k"], terms=["c2p"])),
        "-EMD": ("deberta", lambda size: dict(k=size["k"], absolute="input")),
        "EMD as paper": ("deberta", lambda size: dict(k=size["k"], emd_passes=2)),
    }, profile, keep=("BERT-A",) if profile == "full" else ())   # full: BERT-A's runs are chapter 08's (kept there)
