"""Chapters 08 (TUPE) and 09 (DeBERTa): masked-LM + [CLS] pre-training of BERT-A and the variants."""
from __future__ import annotations

from ..spec import RunSpec
from . import declare

SIZES = {
    "ci": dict(steps=1000, batch_size=32, length=16, k=8, d_model=64, n_layers=2, log_every=25, lr=5e-3,
               seeds=(0, 1, 2)),
    "full": dict(steps=3000, batch_size=64, length=128, k=32, d_model=128, n_layers=4, log_every=50, lr=2e-3,
                 seeds=(0, 1, 2)),
}


def pretraining(scheme: str, size: dict, seed: int, keep_weights: bool = False, **scheme_kwargs) -> RunSpec:
    return RunSpec(scheme=scheme, task="mlm_cls", task_kwargs={"train_length": size["length"]}, recipe="pretrain",
                   model={"d_model": size["d_model"], "n_heads": 4, "n_layers": size["n_layers"], **scheme_kwargs},
                   train={"steps": size["steps"], "batch_size": size["batch_size"], "lr": size["lr"],
                          "warmup": size["steps"] // 10, "log_every": size["log_every"]},
                   seed=seed, keep_weights=keep_weights)


def view(runs) -> tuple:
    """What chapters 08 and 09 read from their runs: (rows, histories by (model, seed), variants, seeds, steps, task)."""
    from ...tasks import make_task
    seeds = sorted({lab["seed"] for lab in runs.labels})
    spec = runs.spec(model="BERT-A", seed=seeds[0])
    histories = {(lab["model"], lab["seed"]): rec.history for lab, rec in runs.select()}
    variants = list(dict.fromkeys(lab["model"] for lab in runs.labels))
    return runs.rows(), histories, variants, seeds, spec.train["steps"], make_task(spec.task, **spec.task_kwargs)


def _variants(variants: dict, profile: str, keep: str = ""):
    size = SIZES.get(profile)
    if size is None:
        return []
    return [({"model": name, "seed": s}, pretraining(scheme, size, s, keep_weights=name == keep, **kw(size)))
            for s in size["seeds"] for name, (scheme, kw) in variants.items()]


@declare("08_tupe")
def tupe(profile: str):
    return _variants({
        "BERT-A": ("learned", lambda size: {}),
        "TUPE-A": ("tupe", lambda size: {}),
        "TUPE-R": ("tupe", lambda size: dict(relative=True, num_buckets=16, max_distance=size["length"])),
        "TUPE-A tie-cls": ("tupe", lambda size: dict(cls_reset=False)),
        "BERT-A^d": ("tupe", lambda size: dict(cross_terms=True, cls_reset=False)),
    }, profile, keep="BERT-A")


@declare("09_deberta")
def deberta(profile: str):
    return _variants({
        "BERT-A": ("learned", lambda size: {}),
        "DeBERTa": ("deberta", lambda size: dict(k=size["k"])),
        "-C2P": ("deberta", lambda size: dict(k=size["k"], terms=["p2c"])),
        "-P2C": ("deberta", lambda size: dict(k=size["k"], terms=["c2p"])),
        "-EMD": ("deberta", lambda size: dict(k=size["k"], absolute="input")),
    }, profile)
