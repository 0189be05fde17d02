"""One training loop for every task and scheme.

* device: CUDA when present (`device="auto"`), else CPU;
* mixed precision on CUDA: bf16 autocast where supported, else fp16 with loss scaling;
* determinism: the model is initialised from `seed`, and step t's batch comes from a
  generator seeded with (seed, t), so a rerun on the same CPU gives identical numbers;
* checkpoint and resume: with `checkpoint_path`, the model, optimiser, schedule,
  loss scaler, RNG state, history and the losses logged since the last history entry
  are saved every `checkpoint_every` steps, with the settings they were made with; a
  rerun with the same path and settings continues where it stopped and ends at the
  same parameters and history. Checkpoints load with `weights_only=True` (no code runs);
  resuming with other settings is a ValueError naming them (`train(..., resume="override")`
  keeps the checkpoint's state and records the new settings);
* AdamW, linear warm-up then cosine decay to `min_lr_ratio` of the peak;
* CUDA graphs where the runner asks for them (`--cuda-graphs`, `posenc.runs.graphed`): the same step,
  replayed by one launch, with AdamW's state and the schedule's rate on the GPU; off by default;
* randomized positions (Ruoss et al. 2023), with `random_positions=M`: every training batch
  of n tokens is read at a sorted random subset of n distinct integers from [0, M) instead
  of 0..n-1 (see `random_positions`); any scheme, no change to it.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import warnings

import torch

with warnings.catch_warnings():  # tqdm.auto warns when ipywidgets is absent, then falls back to text bars
    warnings.simplefilter("ignore")
    from tqdm.auto import tqdm

from ..host import host_checked, to_device
from ..model import classification_loss, lm_loss  # noqa: F401  (re-exported)
from ..tasks import Task

#: loss_fn(model, inputs, targets, **kw) -> a scalar loss (kw: `positions=` under randomized positions).
LossFn = Callable[..., torch.Tensor]


@dataclass
class TrainConfig:
    """How `train` trains: AdamW with linear warm-up and cosine decay, on batches the task draws.

    Args:
        steps: optimiser steps.
        batch_size: sequences per step.
        lr: peak learning rate, reached after `warmup` steps.
        weight_decay: AdamW's decoupled weight decay.
        warmup: steps of linear warm-up from 0.
        min_lr_ratio: the cosine decay ends at lr * min_lr_ratio.
        grad_clip: the gradients' global norm is clipped to this.
        seed: seeds the model's initialisation and the batches.
        log_every: steps between two points of the loss history (read from the device only then).
        device: "auto" (CUDA if present, else the CPU), "cpu", "cuda" or "cuda:N" (or that torch.device).
        amp: autocast on a GPU: "auto" (bf16 where the GPU supports it, else fp16), "bf16", "fp16" or
            "off"; the CPU always trains in float32.
        checkpoint_path: where to save a resumable checkpoint (None: no checkpoint).
        checkpoint_every: steps between two checkpoints.
        progress: show a progress bar.
        random_positions: M: train at sorted random positions drawn from [0, M) (Ruoss et al.);
            None: positions 0..n-1.
    """

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
    amp: str = "auto"
    checkpoint_path: str | None = None
    checkpoint_every: int = 200
    progress: bool = True
    random_positions: int | None = None

    def __post_init__(self):
        for name in ("steps", "batch_size", "log_every", "checkpoint_every", "seed", "warmup"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int; got {value!r}")
            if value < (0 if name in ("seed", "warmup") else 1):
                raise ValueError(f"{name} must be >= {0 if name in ('seed', 'warmup') else 1}; got {value}")
        for name, low, high, open_low in (("lr", 0.0, math.inf, True), ("weight_decay", 0.0, math.inf, False),
                                          ("min_lr_ratio", 0.0, 1.0, False), ("grad_clip", 0.0, math.inf, True)):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) \
                    or value < low or value > high or (open_low and value == low):
                bound = f"{'>' if open_low else '>='} {low:g}" + (f" and <= {high:g}" if high < math.inf else "")
                raise ValueError(f"{name} must be a finite number {bound}; got {value!r}")
        if self.device != "auto":
            device_named(self.device)                  # the name only: a GPU may be on the machine that trains
        if self.amp not in ("auto", "bf16", "fp16", "off"):
            raise ValueError(f"amp must be 'auto', 'bf16', 'fp16' or 'off'; got {self.amp!r}")
        m = self.random_positions
        if m is not None and (not isinstance(m, int) or isinstance(m, bool)):
            raise TypeError(f"random_positions must be an int or None; got {m!r}")
        if m is not None and m < 1:
            raise ValueError(f"random_positions must be >= 1 (or None); got {m}")


@dataclass
class TrainResult:
    """What `train` returns."""

    history: list = field(default_factory=list)  #: [{"step", "loss", "lr"}], every log_every steps
    final_loss: float = float("nan")              #: mean training loss over the last log window
    seconds: float = 0.0                          #: wall time of this call (varies: never compare it)
    graphs: int = 0                               #: CUDA graphs captured (`posenc.runs.graphed`; 0: eager)
    graph_error: str | None = None                #: why the step could not be captured, the run then eager


def device_named(device) -> torch.device:
    """The torch.device a name gives: "cpu", "cuda" or "cuda:N", or such a torch.device (the devices `train`
    runs on); a ValueError naming `device` for anything else ("gpu", "xpu", "meta", "mps", a number)."""
    try:
        dev = torch.device(device) if isinstance(device, (str, torch.device)) else None
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N'; got {device!r}")
    return dev


def pick_device(device: str = "auto") -> torch.device:
    """"auto" -> CUDA where there is a GPU, else the CPU; "cpu", "cuda", "cuda:N" or such a torch.device as it is.
    ValueError, naming `device`, for a name torch does not know or a GPU this machine lacks."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = device_named(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r}, but this machine has no CUDA device (torch {torch.__version__})")
    return dev


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


#: Settings that must match to resume from a checkpoint (device, progress and paths may change).
RESUME_FIELDS = ("steps", "batch_size", "lr", "weight_decay", "warmup", "min_lr_ratio", "grad_clip", "seed",
                 "log_every", "amp", "random_positions")


def random_positions(n: int, max_position: int,
                     generator: torch.Generator) -> torch.Tensor:
    """Randomized positions (Ruoss et al. 2023, section 3): a sorted random
    subset of size n of [0, M).

        p = sort(S),  S ~ Uniform{ S subset of {0, ..., M-1} : |S| = n }

        (M = max_position)

    drawn as the first n entries of a random permutation of 0..M-1 (every
    subset equally likely), so p_1 < p_2 < ... < p_n: the order of the tokens
    is kept, only the gaps are random. Returns a long tensor [n]. One draw
    serves the whole batch: the model takes one positions vector [seq] per
    forward (the paper's Figure 1 draws one per sequence; its code, like
    ours, one per call).
    """
    for arg, value in (("n", n), ("max_position", max_position)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{arg} must be an int; got {value!r}")
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, e.g. "
                        f"torch.Generator().manual_seed(0); "
                        f"got {generator!r}")
    if not 0 <= n <= max_position:
        raise ValueError(
            f"random_positions (max_position) = {max_position} "
            f"must be >= the sequence length: "
            f"n={n} distinct positions are drawn from [0, {max_position})")
    return torch.randperm(max_position, generator=generator)[:n].sort().values


def training_batch(task, cfg: TrainConfig, step: int, causal: bool) -> tuple:
    """Step `step`'s batch as `train` draws it, from `step_generator(cfg.seed, step)`: (x, y, kw) with
    kw = {"positions": random_positions(n, M, g)} under randomized positions (drawn after the batch, so
    the batches are those of the same run without the option), else {}."""
    g = step_generator(cfg.seed, step)
    x, y = task.train_batch(cfg.batch_size, g, causal)
    kw = {} if cfg.random_positions is None else {"positions": random_positions(x.shape[1], cfg.random_positions, g)}
    return x, y, kw


def positions_seen(task, cfg: TrainConfig, causal: bool) -> dict:
    """What training shows a model of position, replaying every step's `training_batch`: the positions
    read, the distances p_i - p_j >= 0 between them, and the mean gap between neighbouring positions.
    Returns {"positions": set, "distances": set, "mean_gap": float}."""
    positions, distances, gaps = set(), set(), []
    for step in range(cfg.steps):
        x, _, kw = training_batch(task, cfg, step, causal)
        p = kw.get("positions", torch.arange(x.shape[1]))
        positions |= set(p.tolist())
        distances |= set((p[:, None] - p[None, :]).clamp(min=0).unique().tolist())
        gaps += p.diff().tolist()
    return {"positions": positions, "distances": distances, "mean_gap": sum(gaps) / max(1, len(gaps))}


def check_random_positions(model: torch.nn.Module, max_position: int) -> None:
    """Refuse, before training, a model that cannot take positions up to M - 1.

    The model must take `positions=` (a `posenc.Transformer`); a scheme with a table (learned,
    multiplicative, TUPE, DeBERTa's absolute positions) needs max_len >= M: the learned tables'
    rows are counted (even with overflow="clamp"), and a one-token forward at position M - 1
    (eval mode, no gradient, no RNG used) runs every other scheme's own check.
    """
    from ..model import Transformer
    from ..schemes.absolute import _TableScheme
    if not isinstance(model, Transformer):
        raise TypeError(f"random_positions needs a posenc.Transformer (a model that takes positions=); "
                        f"got {type(model).__name__}")
    problem = None
    if isinstance(model.scheme, _TableScheme):            # checked here too: overflow="clamp" would not raise
        rows = model.scheme.max_len - int(model.cls is not None)
        problem = f"its table has rows for max_len={rows} positions" if rows < max_position else None
    if problem is None:
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                device = next(model.parameters()).device
                model(torch.zeros(1, 1, dtype=torch.long, device=device),
                      positions=torch.tensor([max_position - 1], device=device))
        except ValueError as err:
            problem = str(err)
        finally:
            model.train(was_training)
    if problem is not None:
        raise ValueError(f"random_positions={max_position} draws positions up to {max_position - 1}, which this "
                         f"model cannot take ({problem}); build it with max_len >= random_positions "
                         f"(max_len={getattr(model.scheme, 'max_len', None)} now) or lower random_positions")


class RandomPositions(torch.nn.Module):
    """`model` read at randomized positions at every call: the paper's evaluation (Ruoss et al. 2023).

    `wrapped(tokens)` = `model(tokens, positions=random_positions(seq, M, g))`, g seeded with
    `seed` and advanced by every call, so a task's `evaluate(wrapped, n)` scores the model as
    the paper does (positions drawn from [0, M) at test time too) without any change to the
    task. `causal`, the parameters and eval()/train() are the model's.
    """

    def __init__(self, model: torch.nn.Module, max_position: int, seed: int = 0):
        super().__init__()
        if not isinstance(max_position, int) or isinstance(max_position, bool) or max_position < 1:
            raise ValueError(f"max_position must be a positive int; got {max_position!r}")
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be an int >= 0; got {seed!r}")
        self.model, self.max_position, self.causal = model, max_position, model.causal
        self.generator = torch.Generator().manual_seed(seed)

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        if positions is None:
            positions = random_positions(tokens.shape[1], self.max_position, self.generator)
        return self.model(tokens, positions=positions)


def graphed_step(model, loss_fn, cfg: TrainConfig, device: torch.device, dtype):
    """A `posenc.runs.graphed.GraphedStep` for this run where one was asked for (`graphs_wanted`, the runner's
    `--cuda-graphs`) and nothing refuses it (`graph_refusal`); else None, and `train` steps eagerly."""
    from .graphed import GraphedStep, capturable_adamw, graph_refusal, graphs_wanted, note
    if not graphs_wanted():
        return None
    why = graph_refusal(model, cfg, device, dtype)
    if why is not None:
        note(0, why)
        return None
    opt = capturable_adamw(model, cfg.lr * lr_factor(0, cfg), cfg.weight_decay)
    return GraphedStep(model, loss_fn, opt, dtype, cfg.grad_clip, max_graphs=16)   # a synthetic task: 16 lengths


def decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW's parameter groups: `weight_decay` on matrices (dim >= 2), none on gains, biases and scalars."""
    params = list(model.parameters())
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def optimizer_step(model, loss_fn, batch, opt, scaler, dtype, grad_clip: float) -> torch.Tensor:
    """One training step on a batch already on the device; returns the loss, not read.

    Forward under autocast (`dtype`; None: fp32), backward, gradient clipping to `grad_clip`,
    AdamW: nothing here waits for the GPU (no `.item()`, no `bool(tensor)`, no copy back), so
    the host runs ahead and queues the next step while this one executes (`posenc.host`;
    `tests/test_host_sync.py` checks every scheme's step for such calls).
    """
    x, y, kw = batch
    with torch.autocast(x.device.type, dtype=dtype, enabled=dtype is not None):
        loss = loss_fn(model, x, y, **kw)
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(opt)
    scaler.update()
    return loss.detach()                      # read at the next log


def train(model: torch.nn.Module, task: Task, cfg: TrainConfig, loss_fn: LossFn | None = None, *,
          resume: str = "check", stop: int | None = None) -> TrainResult:
    """Train `model` on `task.train_batch(batch_size, generator, causal)` for `cfg.steps` steps.

    `loss_fn(model, inputs, targets)` overrides the default next-token / masked-token
    cross-entropy (e.g. for classification). With `cfg.random_positions = M`, step t's batch
    of n tokens is read at `random_positions(n, M, g_t)`, drawn from the step's generator g_t
    after the batch (same batches as without the option, deterministic given the seed), and
    passed as `positions=` to the model (a custom `loss_fn` receives it as the keyword
    `positions`, as `classification_loss` does); evaluation is untouched (positions 0..n-1,
    or `RandomPositions` for the paper's randomized evaluation). Returns a `TrainResult` (the loss
    history, the final loss, the seconds it took, and whether CUDA graphs ran); the model is
    trained in place and left in eval mode. resume: "check" (a checkpoint made with other
    settings or another model is a ValueError naming the fields) or "override". `stop`: end after
    that many steps, on the schedule of all `cfg.steps` (a replay of a run's start, `posenc.runs.replay`).
    """
    if not isinstance(cfg, TrainConfig):
        raise TypeError(f"cfg must be a posenc.TrainConfig; got {type(cfg).__name__}")
    if resume not in ("check", "override"):
        raise ValueError(f"resume must be 'check' or 'override'; got {resume!r}")
    if stop is not None and (isinstance(stop, bool) or not isinstance(stop, int) or not 1 <= stop <= cfg.steps):
        raise ValueError(f"stop must be None or an int in [1, steps={cfg.steps}]; got {stop!r}")
    device = pick_device(cfg.device)
    dtype = amp_dtype(cfg.amp, device)
    model.to(device)
    if cfg.random_positions is not None:
        check_random_positions(model, cfg.random_positions)
    loss_fn = loss_fn or (lambda m, x, y, **kw: lm_loss(m(x, **kw), y))
    graph = graphed_step(model, loss_fn, cfg, device, dtype)     # None: eager (the default)
    if graph is None:
        opt = torch.optim.AdamW(decay_groups(model, cfg.weight_decay), lr=cfg.lr)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, cfg))
    else:
        opt = graph.opt
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
    result, start = TrainResult(), 0
    window: list = []
    if cfg.checkpoint_path and os.path.exists(cfg.checkpoint_path):      # never graphed (graph_refusal)
        start, result.history, window = load_checkpoint(cfg.checkpoint_path, model, opt, sched, scaler, cfg, resume)

    check = getattr(model, "check_inputs", None)   # the input checks the step skips (posenc.host)
    t0 = time.perf_counter()
    model.train()
    end = cfg.steps if stop is None else max(start, stop)
    bar = tqdm(range(start, end), initial=start, total=end, disable=not cfg.progress,
               desc=type(model.scheme).__name__ if hasattr(model, "scheme") else "train")
    for step in bar:
        x, y, kw = training_batch(task, cfg, step, bool(model.causal))
        if check is not None:
            check(x)                                 # on the host, where the batch was made: free
        batch = (to_device(x, device), to_device(y, device), kw)   # positions go as they are: the model reads them first
        if graph is None:
            with host_checked():
                window.append(optimizer_step(model, loss_fn, batch, opt, scaler, dtype, cfg.grad_clip))
            sched.step()
        else:                                        # the schedule's rate, written where the graph reads it
            graph.set_lr(cfg.lr * lr_factor(step, cfg))
            window.append(graph(batch))
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            window = [float(v) for v in window]
            lr = opt.param_groups[0]["lr"] if graph is None else cfg.lr * lr_factor(step + 1, cfg)  # LambdaLR's
            result.history.append({"step": step + 1, "loss": sum(window) / len(window), "lr": lr})
            bar.set_postfix(loss=f"{result.history[-1]['loss']:.3f}")
            window = []
        if cfg.checkpoint_path and ((step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps):
            save_checkpoint(cfg.checkpoint_path, step + 1, result.history, model, opt, sched, scaler, cfg, window)
    model.eval()
    if graph is not None:
        from .graphed import note
        result.graphs, result.graph_error = graph.captured, graph.failed
        note(graph.captured, graph.failed)
    result.final_loss = result.history[-1]["loss"] if result.history else float("nan")
    result.seconds = time.perf_counter() - t0
    return result


def save_checkpoint(path, step, history, model, opt, sched, scaler, cfg, window=()) -> None:
    """Everything needed to continue bit-identically, and the settings it was made with; written atomically."""
    state = {"step": step, "history": history, "window": [float(v) for v in window], "model": model.state_dict(),
             "opt": opt.state_dict(), "sched": sched.state_dict(), "scaler": scaler.state_dict(),
             "config": {f: getattr(cfg, f) for f in RESUME_FIELDS}, "model_class": _model_name(model),
             "rng": torch.get_rng_state(),
             "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}
    from .store import atomic_torch_save
    atomic_torch_save(Path(path), state)


def _model_name(model) -> str:
    scheme = getattr(model, "scheme", None)
    return type(model).__name__ + (f"/{type(scheme).__name__}" if scheme is not None else "")


def load_checkpoint(path, model, opt, sched, scaler, cfg: TrainConfig | None = None,
                    resume: str = "check") -> tuple[int, list, list]:
    """Restore a checkpoint (weights_only: tensors and plain data only) -> (step, history, loss window)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        step, history, window = state["step"], state["history"], state.get("window", [])
    except Exception as err:  # a truncated or foreign file: unpickling, zip and key errors
        raise ValueError(f"checkpoint {path} cannot be read ({type(err).__name__}: {err}); "
                         "delete it to start the run again") from err
    if cfg is not None and resume == "check":
        saved = state.get("config", {})
        diff = [f"{f} ({saved.get(f)!r} in the checkpoint, {getattr(cfg, f)!r} now)" for f in RESUME_FIELDS
                if f in saved and saved[f] != getattr(cfg, f)]
        if state.get("model_class") not in (None, _model_name(model)):
            diff.append(f"model ({state['model_class']} in the checkpoint, {_model_name(model)} now)")
        if diff:
            raise ValueError(f"checkpoint {path} was made with other settings: {', '.join(diff)}; "
                             "use another checkpoint_path, or train(..., resume='override')")
    try:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        scaler.load_state_dict(state["scaler"])
    except (RuntimeError, ValueError, KeyError) as err:
        raise ValueError(f"checkpoint {path} does not fit this model or optimiser ({err})") from err
    torch.set_rng_state(state["rng"])
    if state["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    return step, history, window
