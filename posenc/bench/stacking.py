"""Does training seeds as one stacked model pay here? Seed-steps per second, one by one against stacked.

The runner's `--stack-seeds` (`posenc.runs.stacked`) trades K launches of small kernels for one
launch of K-times-larger ones, plus the overhead of `torch.func.vmap`. Where a step is bound by
launches and Python (small models on a large GPU) that should pay; where it is bound by
arithmetic (the same models on a CPU) it cannot. This measures it with the real trainers, the
batches and the optimiser included: K `posenc.train` calls against one `train_stacked` call.
"""
from __future__ import annotations

import math
import statistics

import torch

from ..model import build_model
from ..runs.stacked import train_stacked
from ..runs.train import TrainConfig, train
from ..table import Table
from ..tasks import make_task
from .timing import interleaved_times


def stacking_costs(schemes=("nope", "rope", "t5"), *, seeds: int = 3, steps: int = 20, seq_len: int = 128,
                   batch_size: int = 32, d_model: int = 128, n_heads: int = 4, n_layers: int = 4, rounds: int = 3,
                   device: str = "cpu", clock: str = "wall") -> Table:
    """One row per scheme: wall seconds of `seeds` causal LMs trained `steps` steps on the corpus one by one
    (`single_s`) and stacked (`stacked_s`), `speedup` = single_s / stacked_s (best of `rounds`, interleaved),
    the seed-steps per second of each, and `loss_gap`: the largest |stacked / alone - 1| of a seed's final
    training loss (rounding only, if stacking is right on this device), with `loss_single` and `loss_stacked` the
    seeds' mean final losses (a NaN gap says which side diverged or failed); where `loss_stacked` is NaN, the
    row adds `stacked_variants`' losses."""
    if not (isinstance(seeds, int) and seeds >= 2):
        raise ValueError(f"seeds must be an int >= 2 (stacking one seed is training it); got {seeds!r}")
    if not (isinstance(steps, int) and steps >= 1):
        raise ValueError(f"steps must be a positive int; got {steps!r}")
    task = make_task("corpus", train_length=seq_len)
    cfgs = [TrainConfig(steps=steps, batch_size=batch_size, warmup=1, log_every=steps, seed=s, device=device,
                        progress=False) for s in range(seeds)]
    rows = Table()
    for scheme in schemes:
        def model(cfg):
            torch.manual_seed(cfg.seed)
            return build_model(scheme, task.vocab_size, causal=True, d_model=d_model, n_heads=n_heads,
                               n_layers=n_layers, max_len=seq_len)

        last: dict[str, list] = {}
        times = interleaved_times({"single": lambda: last.__setitem__("single", [train(model(c), task, c) for c in cfgs]),
                                   "stacked": lambda: last.__setitem__("stacked", train_stacked([model(c) for c in cfgs],
                                                                                                task, cfgs))},
                                  rounds=rounds, clock=clock, device=device)
        single, stacked = min(times["single"]), min(times["stacked"])
        gap = max(abs(b.final_loss / a.final_loss - 1) for a, b in zip(last["single"], last["stacked"]))
        mean_loss = {k: sum(r.final_loss for r in v) / seeds for k, v in last.items()}
        rows.append({"scheme": scheme, "seeds": seeds, "steps": steps, "single_s": single, "stacked_s": stacked,
                     "speedup": single / stacked, "seed_steps_per_s_single": seeds * steps / single,
                     "seed_steps_per_s_stacked": seeds * steps / stacked, "loss_gap": gap,
                     "loss_single": mean_loss["single"], "loss_stacked": mean_loss["stacked"],
                     **(stacked_variants(model, task, cfgs) if math.isnan(mean_loss["stacked"]) else {})})
    return rows


def stacked_variants(model, task, cfgs) -> dict:
    """Where a stacked run's loss is NaN, the same stacked run with one thing changed, so that the next
    window names the cause: `loss_stacked_fp32` without autocast (amp="off"), `loss_stacked_fused` with
    SDPA free to pick its fused kernels (what `STACKED_SDPA` rules out). A variant that raises gives a NaN
    loss and its error, one line, as `error_stacked_fp32` / `error_stacked_fused`."""
    from dataclasses import replace
    from torch.nn.attention import SDPBackend
    every = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH]
    variants = {"fp32": lambda: train_stacked([model(c) for c in cfgs], task, [replace(c, amp="off") for c in cfgs]),
                "fused": lambda: train_stacked([model(c) for c in cfgs], task, cfgs, sdpa=every)}
    out: dict[str, float | str] = {}
    for name, run in variants.items():
        try:
            out[f"loss_stacked_{name}"] = sum(r.final_loss for r in run()) / len(cfgs)
        except Exception as err:          # a kernel refusing vmap is an answer here, not a crash of the probe
            out[f"loss_stacked_{name}"] = math.nan
            out[f"error_stacked_{name}"] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    return out


def stack_decision(rows, *, min_speedup: float = 1.2, max_gap: float = 0.02) -> tuple[bool, str]:
    """Whether the runner should stack seeds here, from `stacking_costs` rows, and why: the median speedup is at
    least `min_speedup` and every seed's final loss agrees within `max_gap` (bf16 rounding). A NaN gap (a final
    loss that is NaN on one side) refuses, whatever its place among the rows."""
    rows = Table(rows).require(("speedup", "loss_gap"))
    if not rows:
        raise ValueError("rows must hold at least one stacking_costs row")
    gaps = [r["loss_gap"] for r in rows]
    speedup = statistics.median(r["speedup"] for r in rows)
    gap = math.nan if any(math.isnan(g) for g in gaps) else max(gaps)
    ok = speedup >= min_speedup and gap < max_gap
    nan_why = " (a final loss is NaN: loss_single, loss_stacked and stacked_variants' losses say where)"
    why = ("" if ok else nan_why if math.isnan(gap)
           else f" (below {min_speedup}x or over {max_gap:.0%})")
    return ok, f"stacking probe: median speedup {speedup:.2f}x, largest loss gap {gap:.3g}{why}"
