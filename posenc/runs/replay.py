"""A stored run's first steps, trained again here, beside the losses its record logged.

A record says what a run measured on the machine that made it. Replaying its start asks two
questions of that number: does this machine train the same model the same way (the logged
losses agree to rounding while the runs are close), and is the training itself stable (a run
nudged by one part in 10^4 stays near the stored one)? Chapter 03 uses it on FLOATER's LM,
whose H200 records sit far above the sinusoidal model's: a CPU replay agrees for 100 steps,
then leaves it, and a nudged replay goes back to it (`scripts/floater_sensitivity.py`).
"""
from __future__ import annotations

import torch

from ..table import Table
from .recipes import SPLIT
from .spec import RunSpec
from .store import Store


def replay(spec: RunSpec, store: Store, steps: int, *, perturb: tuple[int, float] | None = None,
           device: str = "cpu", amp: str = "off") -> Table:
    """Rows {step, replayed, stored}: the logged training losses of `spec`'s first `steps` steps, trained
    here (its recipe's model, task and settings on `device`, on one thread as the runner trains, in float32
    unless `amp` says otherwise, the learning-rate schedule of all its steps), beside those of its record in
    `store`.

    perturb = (seed, scale): every parameter is multiplied by 1 + scale * N(0, 1), drawn from a
    generator seeded with `seed`, before the first step. Only recipes that train one model
    (`posenc.runs.recipes.SPLIT`) replay; the record must exist.
    """
    if not isinstance(spec, RunSpec):
        raise TypeError(f"spec must be a RunSpec; got {type(spec).__name__}")
    if spec.recipe not in SPLIT:
        raise ValueError(f"spec's recipe {spec.recipe!r} trains more than one model; replay takes {sorted(SPLIT)}")
    record = store.get(spec)
    if record is None:
        raise ValueError(f"store {store} holds no record of spec {spec.key}: nothing to replay against")
    from dataclasses import replace
    from .execute import one_thread
    from .train import train
    t = SPLIT[spec.recipe](spec, device)
    if perturb is not None:
        seed, scale = perturb
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in t.model.parameters():
                p.mul_(1 + scale * torch.randn(p.shape, generator=gen).to(p.device, p.dtype))
    with one_thread():                                               # as the runner trains
        result = train(t.model, t.task, replace(t.cfg, amp=amp), loss_fn=t.loss_fn, stop=steps)
    stored = {h["step"]: h["loss"] for h in record["history"]}
    return Table({"step": h["step"], "replayed": h["loss"], "stored": stored.get(h["step"], float("nan"))}
                 for h in result.history)
