"""One training loop for every task and scheme.

* device: CUDA when present (`device="auto"`), else CPU;
* mixed precision on CUDA: bf16 autocast where supported, else fp16 with loss scaling;
* determinism: the model is initialised from `seed`, and step t's batch comes from a
  generator seeded with (seed, t), so a rerun on the same CPU gives identical numbers;
* checkpoint and resume: with `checkpoint_path`, the model, optimiser, schedule,
  loss scaler, RNG state and history are saved every `checkpoint_every` steps; a
  rerun with the same path continues where it stopped and ends at the same numbers;
* AdamW, linear warm-up then cosine decay to `min_lr_ratio` of the peak.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import warnings

import torch
import torch.nn.functional as F

with warnings.catch_warnings():  # tqdm.auto warns when ipywidgets is absent, then falls back to text bars
    warnings.simplefilter("ignore")
    from tqdm.auto import tqdm

from ..model import classification_loss, lm_loss  # noqa: F401  (re-exported)


@dataclass
class TrainConfig:
    steps: int = 1000
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 0.01
    warmup: int = 100
    min_lr_ratio: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    log_every: int = 50
    device: str = "auto"
    amp: str = "auto"  # "auto" | "bf16" | "fp16" | "off"
    checkpoint_path: str | None = None
    checkpoint_every: int = 200
    progress: bool = True

    def __post_init__(self):
        for name in ("steps", "batch_size", "log_every", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; got {getattr(self, name)}")
        if self.amp not in ("auto", "bf16", "fp16", "off"):
            raise ValueError(f"amp must be 'auto', 'bf16', 'fp16' or 'off'; got {self.amp!r}")


@dataclass
class TrainResult:
    history: list = field(default_factory=list)  # [{"step", "loss", "lr"}], every log_every steps
    final_loss: float = float("nan")              # mean training loss over the last log window
    seconds: float = 0.0                          # wall time of this call (varies: never compare it)


def pick_device(device: str = "auto") -> torch.device:
    return torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                        ("cpu" if device == "auto" else device))


def amp_dtype(amp: str, device: torch.device):
    """bf16 where the GPU supports it, fp16 otherwise; None (fp32) on CPU or amp='off'."""
    if device.type != "cuda" or amp == "off":
        return None
    if amp == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return {"bf16": torch.bfloat16, "fp16": torch.float16}[amp]


def step_generator(seed: int, step: int) -> torch.Generator:
    """The data generator of one step: batches depend on (seed, step) only."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up over `warmup` steps, then cosine from 1 to `min_lr_ratio`."""
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


def train(model: torch.nn.Module, task, cfg: TrainConfig, loss_fn=None) -> TrainResult:
    """Train `model` on `task.train_batch(batch_size, generator, causal)` for `cfg.steps` steps.

    `loss_fn(model, inputs, targets)` overrides the default next-token / masked-token
    cross-entropy (e.g. for classification). Returns the history; the model is
    trained in place and left in eval mode.
    """
    device = pick_device(cfg.device)
    dtype = amp_dtype(cfg.amp, device)
    model.to(device)
    loss_fn = loss_fn or (lambda m, x, y: lm_loss(m(x), y))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg))
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
    result, start = TrainResult(), 0
    if cfg.checkpoint_path and os.path.exists(cfg.checkpoint_path):
        start, result.history = load_checkpoint(cfg.checkpoint_path, model, opt, sched, scaler)

    t0, window = time.perf_counter(), []
    model.train()
    bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, disable=not cfg.progress,
               desc=type(model.scheme).__name__ if hasattr(model, "scheme") else "train")
    for step in bar:
        x, y = task.train_batch(cfg.batch_size, step_generator(cfg.seed, step), model.causal)
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = loss_fn(model, x.to(device), y.to(device))
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        scaler.step(opt)
        scaler.update()
        sched.step()
        window.append(loss.item())
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            result.history.append({"step": step + 1, "loss": sum(window) / len(window),
                                   "lr": opt.param_groups[0]["lr"]})
            bar.set_postfix(loss=f"{result.history[-1]['loss']:.3f}")
            window = []
        if cfg.checkpoint_path and ((step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps):
            save_checkpoint(cfg.checkpoint_path, step + 1, result.history, model, opt, sched, scaler, cfg)
    model.eval()
    result.final_loss = result.history[-1]["loss"] if result.history else float("nan")
    result.seconds = time.perf_counter() - t0
    return result


def save_checkpoint(path, step, history, model, opt, sched, scaler, cfg) -> None:
    """Everything needed to continue bit-identically; written atomically."""
    state = {"step": step, "history": history, "model": model.state_dict(), "opt": opt.state_dict(),
             "sched": sched.state_dict(), "scaler": scaler.state_dict(), "config": asdict(cfg),
             "rng": torch.get_rng_state(),
             "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = f"{path}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path, model, opt, sched, scaler) -> tuple[int, list]:
    state = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    sched.load_state_dict(state["sched"])
    scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["rng"])
    if state["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    return state["step"], state["history"]
