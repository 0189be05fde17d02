"""Several seeds of one configuration trained as one stacked model (`torch.func.vmap`).

A small model on a large GPU is bound by kernel launches, not arithmetic: K seeds trained one
after another launch K times the kernels, each with 1/K of the work the GPU could take. Here
the K models' parameters are stacked along a new leading dimension, theta = [theta_1; ...; theta_K],
and one step computes

    L(theta) = sum_k L_k(theta_k; x_k, y_k),    grad_theta_k L = grad L_k(theta_k)

with `vmap(functional_call(model, theta_k, x_k))`: every kernel does the K seeds' work at once.
The seeds stay independent: each reads its own batches (`step_generator(seed_k, t)`), its
gradient is clipped by its own norm,

    g_k <- g_k * min(1, c / (||g_k|| + 1e-6))      (torch.nn.utils.clip_grad_norm_, per seed)

and AdamW, being elementwise, updates each slice exactly as it would update that seed alone.
What differs from K separate `train` calls is rounding only: a batched matrix product adds in
another order, so the numbers agree to float tolerance, not bit for bit (`tests/test_stacked.py`).

A task that draws a length per batch gives the seeds batches of different lengths at one step.
A causal model's outputs at positions t < n do not depend on anything after them, so each
shorter batch is padded on the right to the longest, with token 0 and targets IGNORE: its
logits at the real positions and its mean loss over the real targets are unchanged, and the
padding gets no gradient (`pad_right`). A bidirectional model, or a RoPE scaling whose
frequencies depend on the sequence length, would change under padding: those are refused.
"""
from __future__ import annotations

import time

import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..host import host_checked, to_device
from .train import (RESUME_FIELDS, TrainConfig, TrainResult, amp_dtype, lr_factor, pick_device,
                    step_generator)


class _Loss(nn.Module):
    """`loss_fn(model, x, y)` as a module, so that `functional_call` swaps the parameters of whatever
    the loss calls (`model(x)`, `model.classify(x)`, ...)."""

    def __init__(self, model: nn.Module, loss_fn):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, x, y):
        return self.loss_fn(self.model, x, y)


def check_stackable(models, cfgs) -> None:
    """ValueError unless `models` share one architecture and `cfgs` differ in their seeds only."""
    if not models or len(models) != len(cfgs):
        raise ValueError(f"models and cfgs must be non-empty lists of one length; got {len(models)} and {len(cfgs)}")
    if not all(isinstance(c, TrainConfig) for c in cfgs):
        raise TypeError("cfgs must hold posenc.TrainConfig objects")
    first = {n: (p.shape, p.dtype) for n, p in models[0].named_parameters()}
    for i, m in enumerate(models[1:], 1):
        if type(m) is not type(models[0]) or {n: (p.shape, p.dtype) for n, p in m.named_parameters()} != first:
            raise ValueError(f"models[{i}] has other parameters than models[0]: stacked seeds share one architecture")
    for name in set(RESUME_FIELDS + ("device",)) - {"seed"}:
        values = {repr(getattr(c, name)) for c in cfgs}
        if len(values) > 1:
            raise ValueError(f"cfgs must differ in their seed only; {name} takes the values {sorted(values)}")
    seeds = [c.seed for c in cfgs]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"cfgs must have distinct seeds; got {seeds}")
    recurrent = [type(m).__name__ for m in models[0].modules() if isinstance(m, nn.RNNBase)]
    if recurrent:
        raise ValueError(f"the model holds {recurrent[0]}, which torch.func.vmap cannot batch; train the seeds one by one")
    if getattr(models[0], "attention_backend", "auto") == "flex":
        raise ValueError("attention_backend='flex' cannot be stacked (FlexAttention has no vmap rule); use 'auto' or 'sdpa'")
    cfg = cfgs[0]
    if cfg.random_positions is not None:
        raise ValueError("random_positions cannot be stacked (each seed reads other positions); train the seeds one by one")
    if cfg.checkpoint_path is not None:
        raise ValueError("checkpoint_path cannot be stacked; train the seeds one by one to checkpoint them")
    if amp_dtype(cfg.amp, pick_device(cfg.device)) == torch.float16:
        raise ValueError("fp16 needs a loss scaler per seed; stacked seeds train in bf16 or fp32 (amp='bf16'/'off')")


def can_pad(model) -> bool:
    """Whether right-padding leaves `model`'s outputs at the real positions unchanged: a causal model whose
    positions do not depend on the sequence length (not RoPE's "dynamic" or "longrope" scaling)."""
    from ..schemes.rotary import LENGTH_DEPENDENT
    scheme = getattr(model, "scheme", None)
    return bool(getattr(model, "causal", False)) and getattr(scheme, "scaling", None) not in LENGTH_DEPENDENT


def pad_right(xs, ys, step: int) -> tuple[list, list]:
    """Token batches [B, n_k] and their targets [B, n_k] padded on the right to the longest n_k: tokens with
    0, targets with IGNORE (no loss, no gradient). ValueError for targets not aligned with the tokens."""
    from ..model import IGNORE
    if any(x.dim() != 2 or y.shape != x.shape for x, y in zip(xs, ys)):
        raise ValueError(f"the seeds' batches differ in shape at step {step} "
                         f"({[tuple(x.shape) for x in xs]}) and their targets are not one per token: "
                         "stacking needs one batch shape or padding (can_pad)")
    n = max(x.shape[1] for x in xs)
    pad = torch.nn.functional.pad
    return [pad(x, (0, n - x.shape[1]), value=0) for x in xs], [pad(y, (0, n - y.shape[1]), value=IGNORE) for y in ys]


def _shared_buffers(models) -> tuple[dict, dict]:
    """(buffers equal in every model, {name: buffer}; the others stacked, {name: [K, ...]})."""
    shared, stacked = {}, {}
    for name, b in models[0].named_buffers():
        others = [dict(m.named_buffers())[name] for m in models]
        if all(o.shape == b.shape and torch.equal(o, b) for o in others):
            shared[name] = b
        else:
            stacked[name] = torch.stack([o.detach() for o in others])
    return shared, stacked


def clip_per_seed(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """Scale each seed's gradient (slice k of every stacked parameter) to norm <= max_norm; returns the norms [K]."""
    grads = [p.grad for p in params if p.grad is not None]
    norms = torch.stack([g.reshape(len(g), -1).float().pow(2).sum(1) for g in grads]).sum(0).sqrt()   # (K,)
    coef = (max_norm / (norms + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.view(-1, *[1] * (g.dim() - 1)).to(g.dtype))
    return norms


def stacked_step(step_losses, params: dict, buffers: dict, batch, opt, dtype, grad_clip: float) -> torch.Tensor:
    """One step of the K stacked seeds on a batch [K, ...] already on the device; returns the K losses, not read.

    `step_losses(params, buffers, x, y)` is the vmapped loss; forward under autocast (`dtype`), backward
    of the sum, each seed's gradient clipped to `grad_clip` (`clip_per_seed`), AdamW: like
    `posenc.runs.train.optimizer_step`, nothing here waits for the GPU (`tests/test_stacked.py`).
    """
    x, y = batch
    with torch.autocast(x.device.type, dtype=dtype, enabled=dtype is not None):
        losses = step_losses(params, buffers, x, y)                          # (K,)
    opt.zero_grad(set_to_none=True)
    losses.sum().backward()
    clip_per_seed(list(params.values()), grad_clip)
    opt.step()
    return losses.detach()


#: Why stacked training runs SDPA's math kernel (matmuls and a softmax, which vmap batches like any op):
#: under `torch.func.vmap` the fused kernels fail. On the H200 (torch 2.11, 2026-12-04 windows) the stacked
#: loss was NaN under bf16 autocast, and without autocast the memory-efficient kernel's backward raised
#: "LSE is not correctly aligned (strideH)"; on the CPU the flash kernel has no vmap rule and ran seed by seed.
#: Only causal, unmasked attention reaches SDPA under vmap: with a mask or both directions the math kernel failed
#: too (`posenc.attention._stacked`), and those take the explicit path.
STACKED_SDPA = SDPBackend.MATH


def train_stacked(models: list, task, cfgs: list, loss_fn=None, *, sdpa=STACKED_SDPA) -> list[TrainResult]:
    """Train `models` (one architecture, one seed each) as one stacked model; returns their `TrainResult`s.

    `cfgs[k]` is model k's `TrainConfig`; they must differ in `seed` only (`check_stackable`).
    Each model is trained in place, as `posenc.train(models[k], task, cfgs[k], loss_fn)` would
    train it, up to rounding (see the module), and left in eval mode. `loss_fn(model, x, y)` as
    in `train`. `seconds` is the wall time of the whole stacked call, in every result. `sdpa`: the
    SDPA backends allowed (`torch.nn.attention.sdpa_kernel`; STACKED_SDPA, whose comment says why).
    """
    check_stackable(models, cfgs)
    device = pick_device(cfgs[0].device)
    dtype = amp_dtype(cfgs[0].amp, device)
    for m in models:
        m.to(device)
    base = models[0]
    backend = getattr(base, "attention_backend", None)
    if backend == "auto":                   # FlexAttention (bias schemes' long sequences on CUDA) has no vmap rule
        base.attention_backend = "sdpa"
    try:
        with sdpa_kernel(sdpa):
            return _train(models, task, cfgs, loss_fn, device, dtype)
    finally:
        if backend == "auto":
            base.attention_backend = backend


def stack_models(models, loss_fn) -> tuple[dict, dict, object]:
    """(params {name: [K, ...] leaf}, the buffers that differ between models {name: [K, ...]}, and
    step_losses(params, buffers, x [K, ...], y [K, ...]) -> the K losses, vmapped over the models).

    Buffers equal in every model (RoPE's frequencies, ALiBi's slopes) stay unbatched: the first
    model's own. Parameters keep their `requires_grad`."""
    base = models[0]
    params = {n: torch.stack([dict(m.named_parameters())[n].detach() for m in models]).requires_grad_(p.requires_grad)
              for n, p in base.named_parameters()}
    buffers = {f"model.{n}": t for n, t in _shared_buffers(models)[1].items()}
    wrapper = _Loss(base, loss_fn)

    def one(p, b, x, y):
        return functional_call(wrapper, ({f"model.{n}": t for n, t in p.items()}, b), (x, y))
    return params, buffers, vmap(one, randomness="different")


def _train(models, task, cfgs, loss_fn, device, dtype) -> list[TrainResult]:
    from ..model import lm_loss
    cfg, seeds, base = cfgs[0], [c.seed for c in cfgs], models[0]
    params, buffers_in, step_losses = stack_models(models, loss_fn or (lambda m, x, y: lm_loss(m(x), y)))
    decay = [p for p in params.values() if p.dim() >= 3]                # stacked: one more dimension
    no_decay = [p for p in params.values() if p.dim() < 3]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg))
    results, window = [TrainResult() for _ in models], []
    check, padding = getattr(base, "check_inputs", None), can_pad(base)
    t0 = time.perf_counter()
    for m in models:
        m.train()
    for step in range(cfg.steps):
        batches = [task.train_batch(cfg.batch_size, step_generator(s, step), base.causal) for s in seeds]
        xs, ys = [b[0] for b in batches], [b[1] for b in batches]
        if check is not None:
            for x in xs:
                check(x)
        if len({x.shape for x in xs}) > 1 or len({y.shape for y in ys}) > 1:
            if not padding:
                raise ValueError(f"the seeds' batches differ in shape at step {step} ({[tuple(x.shape) for x in xs]}) "
                                 "and this model cannot be padded (can_pad: causal, no length-dependent positions)")
            xs, ys = pad_right(xs, ys, step)
        x, y = to_device(torch.stack(xs), device), to_device(torch.stack(ys), device)
        with host_checked():
            window.append(stacked_step(step_losses, params, buffers_in, (x, y), opt, dtype, cfg.grad_clip))
        sched.step()
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            rows = torch.stack(window).float().T.tolist()                  # (K, steps): read here, every log_every
            for r, row in zip(results, rows):
                r.history.append({"step": step + 1, "loss": sum(row) / len(row), "lr": opt.param_groups[0]["lr"]})
            window = []
    with torch.no_grad():
        for k, m in enumerate(models):
            for n, p in m.named_parameters():
                p.copy_(params[n][k])
            m.eval()
    seconds = time.perf_counter() - t0
    for r in results:
        r.final_loss = r.history[-1]["loss"] if r.history else float("nan")
        r.seconds = seconds
    return results
