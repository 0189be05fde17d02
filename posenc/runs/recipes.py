"""Recipes: how a `RunSpec` becomes a trained, evaluated model.

A recipe takes a spec and a device and returns {"table", "history", "final_loss",
"model"}; `posenc.runs.execute` adds the machine, the code version and the wall time
and writes the record. Chapters never train: they declare specs whose recipe does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..tasks import make_task
from .evaluate import run
from .train import TrainConfig

RECIPES: dict[str, Callable] = {}
#: Recipes that pass a spec's `model` to `posenc.build_model`, each with the build_model keywords it sets itself
#: (a spec giving one would collide with it): their specs' model keys are checked against build_model's and the
#: scheme's keywords, less these, when the spec is made (`posenc.runs.spec.check_model_keys`).
BUILDS_MODEL = {"sequence": frozenset(), "learned_extension": frozenset(), "rope_extension": frozenset(),
                "rope_scalings": frozenset(), "xl_memory": frozenset({"max_len"}),
                "pretrain": frozenset({"causal", "cls_token", "num_classes"})}


def recipe(name: str):
    """Decorator registering a recipe under `name`."""
    def add(fn):
        RECIPES[name] = fn
        return fn
    return add


@dataclass
class Training:
    """A recipe's one training run, declared: `train(model, task, cfg, loss_fn)`, then `finish(result)`
    gives the recipe's output. A recipe in this form trains alone, or stacked with other seeds."""

    model: torch.nn.Module
    task: object
    cfg: TrainConfig
    finish: Callable
    loss_fn: Callable | None = None


#: Recipes written as prepare(spec, device) -> `Training`: name -> prepare.
SPLIT: dict[str, Callable] = {}


def split_recipe(name: str):
    """Register `prepare(spec, device) -> Training` as recipe `name`; returns the recipe (train, then finish)."""
    def add(prepare):
        def alone(spec, device: str = "cpu") -> dict:
            from .train import train
            t = prepare(spec, device)
            return t.finish(train(t.model, t.task, t.cfg, loss_fn=t.loss_fn))
        alone.__name__, alone.__doc__ = prepare.__name__, prepare.__doc__
        SPLIT[name] = prepare
        RECIPES[name] = alone
        return alone
    return add


def train_config(spec, device: str) -> TrainConfig:
    """The `TrainConfig` of a spec: its training settings and seed, on `device`, without a progress bar."""
    return TrainConfig(**spec.train, seed=spec.seed, device=device, progress=False)


EVAL_POSITIONS = ("ordinary", "random", "both")


def model_max_len(spec, task) -> int | None:
    """The `max_len` a sequence spec's model is built with when `spec.model` does not give one.

    The longest sequence the evaluation lengths need (None without lengths: the builder's
    default); with train random_positions=M, at least M, so a table scheme has a row for every
    position a randomized batch can draw (Ruoss et al. 2023 size the table to M too).
    """
    if "max_len" in spec.model:
        return spec.model["max_len"]
    need = [task.seq_len(n, spec.model["causal"]) if hasattr(task, "seq_len") else n for n in spec.lengths]
    need += [spec.train["random_positions"]] if spec.train.get("random_positions") else []
    return max(need) if need else None


def check_eval_settings(spec, task) -> None:
    """ValueError naming the settings of `spec.eval` that `task.evaluate` does not take (unless it takes any)."""
    import inspect
    params = inspect.signature(task.evaluate).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    accepted = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)} - {"model", "n", "device"}
    unknown = sorted(set(spec.eval) - accepted)
    if unknown:
        raise ValueError(f"eval has unknown settings {unknown} for task {spec.task!r}; allowed: {', '.join(sorted(accepted))}")


@split_recipe("sequence")
def sequence(spec, device: str = "cpu") -> Training:
    """`posenc.build_model(spec.scheme, ...)` trained on the task, then `task.evaluate` at each length.

    With train random_positions=M the model trains on randomized positions (`posenc.runs.train`)
    and is built with max_len >= M (`model_max_len`). options["eval_positions"] says how it is
    scored: "ordinary" (default: positions 0..n-1), "random" (the paper's test protocol: every
    evaluation batch at a sorted random subset of [0, M), `RandomPositions` seeded per length) or
    "both"; with the option, every row says which in a "positions" column ("0..n-1" or "random").
    """
    from .evaluate import length_table, seeded_model
    task = make_task(spec.task, **spec.task_kwargs)
    check_eval_settings(spec, task)                  # before training: a typo there wasted the whole run
    model_kwargs = {k: v for k, v in spec.model.items() if k != "causal"}
    if spec.train.get("random_positions") and model_max_len(spec, task) is not None:
        model_kwargs["max_len"] = model_max_len(spec, task)
    mode = spec.options.get("eval_positions")
    if mode is not None and (mode not in EVAL_POSITIONS or not spec.train.get("random_positions")):
        raise ValueError(f"options['eval_positions'] must be one of {EVAL_POSITIONS} and needs train "
                         f"random_positions; got {mode!r} with random_positions={spec.train.get('random_positions')}")
    cfg = train_config(spec, device)
    model = seeded_model(spec.scheme, task, cfg, causal=spec.model["causal"], lengths=spec.lengths,
                         model_kwargs=model_kwargs)

    def finish(result) -> dict:
        table = list(length_table(model, task, spec.lengths, label={}, **spec.eval))
        if mode is not None:
            table = [{"positions": "0..n-1", **r} for r in table] if mode != "random" else []
            table += random_position_table(model, task, spec) if mode != "ordinary" else []
        return {"table": table, "history": result.history, "final_loss": result.final_loss, "model": model}
    return Training(model, task, cfg, finish)


def random_position_table(model, task, spec) -> list:
    """`length_table` rows of `model` read at randomized positions from [0, random_positions)."""
    from .evaluate import length_table
    from .train import RandomPositions
    m, seed = spec.train["random_positions"], spec.eval.get("seed", 0)
    rows = []
    for n in spec.lengths:
        wrapped = RandomPositions(model, m, seed=1_000_003 * seed + n)
        rows += [{"positions": "random", **r} for r in length_table(wrapped, task, [n], **spec.eval)]
    return rows


@split_recipe("pretrain")
def masked_pretraining(spec, device: str = "cpu") -> Training:
    """Masked-LM + [CLS] pre-training (TUPE and DeBERTa's chapters): one row of held-out metrics."""
    from ..tasks.pretraining import pretraining_loss
    from .evaluate import pretraining_model, pretraining_row
    task = make_task(spec.task, **spec.task_kwargs)
    cfg = train_config(spec, device)
    model = pretraining_model(spec.scheme, task, cfg, **spec.model)

    def finish(result) -> dict:
        row = pretraining_row(model, result, spec.scheme, task, cfg, {})["row"]
        return {"table": [row], "history": result.history, "final_loss": row["final_loss"], "model": model}
    return Training(model, task, cfg, finish, pretraining_loss)


def get_recipe(name: str) -> Callable:
    """The recipe registered as `name`, a function (spec, device) that builds and trains the spec's model;
    ValueError naming the known recipes otherwise."""
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; known recipes: {', '.join(sorted(RECIPES))}")
    return RECIPES[name]


def build_untrained(spec) -> torch.nn.Module:
    """The recipe's model with fresh weights (to load a stored state_dict into)."""
    from ..model import build_model
    if spec.recipe not in ("sequence", "pretrain", "learned_extension", "rope_extension"):
        raise ValueError(f"runs of recipe {spec.recipe!r} store their results, not a model to rebuild; "
                         "read their table instead")
    task = make_task(spec.task, **spec.task_kwargs)
    if spec.recipe == "pretrain":
        kwargs = {"max_len": task.train_length, **spec.model}
        return build_model(spec.scheme, task.vocab_size, causal=False, cls_token=True, num_classes=2, **kwargs)
    kwargs = {k: v for k, v in spec.model.items() if k != "causal"}
    if model_max_len(spec, task) is not None:
        kwargs["max_len"] = model_max_len(spec, task)
    return build_model(spec.scheme, task.vocab_size, causal=spec.model["causal"], **kwargs)


@recipe("learned_extension")
def learned_extension(spec, device: str = "cpu") -> dict:
    """Chapter 01: a learned table trained on n <= L, then extended to 2L
    three ways and fine-tuned.

    Rows: one {"stage": "base", acc_L, acc_2L_clamped (the last row reused
    past L)}, then {"stage": "recovery", init, steps, acc_2L, acc_L} after
    every chunk of fine-tuning on n <= 2L, for each init in options["inits"]
    (random, copy, interpolate).
    """
    import copy
    from ..schemes.absolute import extend_learned_table
    from ..tasks import SyntheticTask
    from .train import train
    opts = {"chunk": 25, "chunks": 6,
            "inits": ["random", "copy", "interpolate"], "lr": 2e-3,
            **spec.options}
    task = make_task(spec.task, **spec.task_kwargs)
    L = task.train_length
    long_task = SyntheticTask(**{
        **spec.task_kwargs, "train_length": 2 * L, "max_eval_factor": 1})
    out = sequence(spec, device)
    base = out["model"]
    dev = next(base.parameters()).device
    base.scheme.overflow = "clamp"  # only to measure 2L: reuse the last row
    clamped = task.evaluate(base, 2 * L, device=dev)["accuracy"]
    base.scheme.overflow = "error"
    rows = [{"stage": "base", "acc_L": out["table"][0]["accuracy"],
             "acc_2L_clamped": clamped, "table_rows": base.scheme.max_len}]

    def both(model):
        return {"acc_2L": long_task.evaluate(
                    model, 2 * L, n_samples=128, device=dev)["accuracy"],
                "acc_L": long_task.evaluate(
                    model, L, n_samples=128, device=dev)["accuracy"]}

    for init in opts["inits"]:
        model = copy.deepcopy(base)
        extend_learned_table(
            model, long_task.seq_len(2 * L, causal=True), init)
        rows.append({"stage": "recovery", "init": init, "steps": 0,
                     **both(model)})
        for c in range(opts["chunks"]):
            cfg = TrainConfig(steps=opts["chunk"],
                              batch_size=spec.train["batch_size"],
                              lr=opts["lr"], warmup=1, min_lr_ratio=1.0,
                              seed=1000 * (c + 1) + spec.seed,
                              progress=False, device=device)
            train(model, long_task, cfg)
            rows.append({"stage": "recovery", "init": init,
                         "steps": (c + 1) * opts["chunk"], **both(model)})
    return {**out, "table": rows}


@recipe("xl_memory")
def xl_memory(spec, device: str = "cpu") -> dict:
    """Chapter 06: Transformer-XL trained on windows of two segments (memory carried), scored with memories.

    options: segment (L) and mem_lens; the corpus windows are 2L long. Rows: {mem_len, mem/L, bpc,
    by_offset (mean NLL at each offset in a segment)} from `evaluate_with_memory`.
    """
    from ..model import build_model
    from .recurrence import evaluate_with_memory, segment_loss
    from .train import pick_device, train
    L = spec.options["segment"]
    corpus = make_task(spec.task, **spec.task_kwargs)
    if corpus.train_length != 2 * L:
        raise ValueError(f"task_kwargs train_length must be 2 * segment = {2 * L}; got {corpus.train_length}")
    torch.manual_seed(spec.seed)
    kwargs = {k: v for k, v in spec.model.items() if k != "causal"}
    model = build_model(spec.scheme, corpus.vocab_size, causal=True, max_len=2 * L, **kwargs).to(pick_device(device))
    result = train(model, corpus, train_config(spec, device), loss_fn=lambda m, x, y: segment_loss(m, x, y, L))
    dev = next(model.parameters()).device
    rows = []
    for M in spec.options["mem_lens"]:
        ev = evaluate_with_memory(model, corpus, L, M, max_tokens=spec.eval.get("max_tokens", 32768), device=dev)
        rows.append({"mem_len": M, "mem/L": M / L, "bpc": ev["bpc"], "by_offset": ev["nll_by_offset"]})
    return {"table": rows, "history": result.history, "final_loss": result.final_loss, "model": model}


@split_recipe("classify")
def classify(spec, device: str = "cpu") -> Training:
    """Chapter 10: a sentence classifier (`posenc.schemes.complex_order.build_classifier`) on an order task.

    `spec.scheme` names the classifier family (complex-order, complex-vanilla, or any scheme);
    one row: {parameters, accuracy, final_loss}.
    """
    from ..model import classification_loss
    from ..schemes.complex_order import build_classifier
    from .train import pick_device
    task = make_task(spec.task, **spec.task_kwargs)
    torch.manual_seed(spec.seed)
    model = build_classifier(spec.scheme, task.vocab_size, 2, max_len=task.length, **spec.model)
    model.to(pick_device(device))

    def finish(result) -> dict:
        row = {"parameters": sum(p.numel() for p in model.parameters()),
               "accuracy": task.evaluate(model.cpu())["accuracy"], "final_loss": result.final_loss}
        return {"table": [row], "history": result.history, "final_loss": result.final_loss, "model": model}
    return Training(model, task, train_config(spec, device), finish, classification_loss)


@recipe("rope_extension")
def rope_extension(spec, device: str = "cpu") -> dict:
    """Chapter 11: a RoPE LM trained at L (the `sequence` recipe: the same
    numbers on a CPU; a GPU's kernels may differ in the last digits from one
    run to another), then extended to 4L.

    Variants: position interpolation (PI) and NTK-aware scaling by
    options["factor"], each with and without a short fine-tune on windows of
    4L (options ft_steps, ft_batch), and plain RoPE fine-tuned. Rows:
    {variant, length, x_train, <LM metrics>} at spec.lengths.
    """
    import copy
    from .evaluate import length_table
    from .train import train
    opts = {"factor": 4, "ft_steps": 40, "ft_batch": 8, "ft_lr": 1e-3,
            **spec.options}
    base = sequence(spec, device)
    corpus = make_task(spec.task, **spec.task_kwargs)
    long_corpus = make_task(spec.task, **{
        **spec.task_kwargs, "train_length": 4 * corpus.train_length})

    def variant(scaling, factor, finetune):
        m = copy.deepcopy(base["model"])
        m.scheme.set_scaling(scaling, factor)
        if finetune:
            cfg = TrainConfig(steps=opts["ft_steps"],
                              batch_size=opts["ft_batch"], lr=opts["ft_lr"],
                              warmup=5, log_every=10, seed=spec.seed + 100,
                              progress=False, device=device)
            train(m, long_corpus, cfg)
        return m

    f = opts["factor"]
    variants = {f"RoPE + PI x{f}": ("pi", f, False),
                f"RoPE + NTK x{f}": ("ntk", f, False),
                f"RoPE, fine-tuned at {f}L": (None, 1, True),
                f"RoPE + PI x{f}, fine-tuned": ("pi", f, True),
                f"RoPE + NTK x{f}, fine-tuned": ("ntk", f, True)}
    rows = [{"variant": "rope", **r} for r in base["table"]]
    for name, args in variants.items():
        rows += [{"variant": name, **r}
                 for r in length_table(variant(*args), corpus, spec.lengths,
                                       **spec.eval)]
    return {**base, "table": rows}


@recipe("rope_scalings")
def rope_scalings(spec, device: str = "cpu") -> dict:
    """Chapter 16: a RoPE model trained on its task at L, then read under
    other frequencies, with and without a short fine-tune at a longer length.

    The base model is the `sequence` recipe's (same training, the same
    numbers on a CPU: chapter 11's RoPE LM with this recipe trains the very
    same model; a GPU may differ in the last digits between runs). options:
        variants: [[name, scaling, params, finetune], ...]: a copy of the
            base model gets `scheme.set_scaling(scaling, factor, **params)`
            (scaling None: as trained), and with finetune ft_steps steps of
            ft_batch sequences of up to ft_factor * L at lr ft_lr. A
            rope_type that takes original_max_position_embeddings gets the
            task's training length L unless params give it.
        factor: s for set_scaling (4); ft_factor: the fine-tuning length as
            a multiple of L (factor).
        grid: {"depths": [...], "n_samples": n}: for a task with
            `evaluate_grid` (passkey), score every (length, depth) cell at
            spec.lengths instead of `task.evaluate` at each length.
        eval_positions: with train random_positions, "ordinary", "random"
            or "both", as in `sequence`.
    Rows: {variant, scaling, finetuned, [positions], length, x_train,
    [depth], <task metrics>}, the base model's first (variant "as trained").
    """
    import copy
    from .evaluate import length_table
    from .train import RandomPositions, amp_dtype, train
    opts = {"factor": 4, "ft_steps": 40, "ft_batch": 8, "ft_lr": 1e-3,
            "variants": [], **spec.options}
    task = make_task(spec.task, **spec.task_kwargs)
    L, grid, mode = (task.train_length, opts.get("grid"),
                     opts.get("eval_positions"))
    if mode is not None and (mode not in EVAL_POSITIONS
                             or not spec.train.get("random_positions")):
        raise ValueError(
            f"options['eval_positions'] must be one of {EVAL_POSITIONS} "
            f"and needs train random_positions; got {mode!r} "
            f"with random_positions={spec.train.get('random_positions')}")
    ft_length = int(opts.get("ft_factor", opts["factor"]) * L)
    long_task = make_task(spec.task, **{
        **spec.task_kwargs, "train_length": ft_length})
    if grid is None:
        base = sequence(spec, device)  # trains, and scores at spec.lengths
    else:
        model_kwargs = {k: v for k, v in spec.model.items() if k != "causal"}
        if model_max_len(spec, task) is not None:
            model_kwargs["max_len"] = model_max_len(spec, task)
        out = run(spec.scheme, task, train_config(spec, device),
                  causal=spec.model["causal"], model_kwargs=model_kwargs,
                  label={})
        base = {"model": out["model"], "history": out["result"].history,
                "final_loss": out["result"].final_loss}
    dev = next(base["model"].parameters()).device

    def score(model, lengths) -> list:
        if grid is None:
            return list(length_table(model, task, lengths, **spec.eval))
        dtype = amp_dtype("auto", dev)
        with torch.autocast(dev.type, dtype=dtype, enabled=dtype is not None):
            return list(task.evaluate_grid(
                model, lengths, grid["depths"], n_samples=grid["n_samples"],
                seed=spec.eval.get("seed", 0), device=dev))

    def scored(model) -> list:
        """Rows at positions 0..n-1 and/or at randomized ones
        (`RandomPositions`, seeded per length)."""
        model.eval()
        if mode is None:
            return score(model, spec.lengths)
        rows = ([{"positions": "0..n-1", **r}
                 for r in score(model, spec.lengths)]
                if mode != "random" else [])
        if mode != "ordinary":
            m, seed = spec.train["random_positions"], spec.eval.get("seed", 0)
            for n in spec.lengths:
                wrapped = RandomPositions(model, m, seed=1_000_003 * seed + n)
                rows += [{"positions": "random", **r}
                         for r in score(wrapped, [n])]
        return rows

    def variant(scaling, params, finetune):
        m = copy.deepcopy(base["model"])
        if scaling is not None:
            params = dict(params or {})
            if scaling in ("dynamic", "yarn", "llama3", "longrope"):
                params.setdefault("original_max_position_embeddings", L)
            m.scheme.set_scaling(scaling, opts["factor"], **params)
        if finetune:
            cfg = TrainConfig(steps=opts["ft_steps"],
                              batch_size=opts["ft_batch"], lr=opts["ft_lr"],
                              warmup=5, log_every=10, seed=spec.seed + 100,
                              progress=False, device=device)
            train(m, long_task, cfg)
        return m

    as_trained = base["table"] if grid is None else scored(base["model"])
    rows = [{"variant": "as trained", "scaling": None, "finetuned": False, **r}
            for r in as_trained]
    for name, scaling, params, finetune in opts["variants"]:
        rows += [{"variant": name, "scaling": scaling,
                  "finetuned": bool(finetune), **r}
                 for r in scored(variant(scaling, params, finetune))]
    return {**base, "table": rows}


@recipe("cnn_position")
def cnn_position(spec, device: str = "cpu") -> dict:
    """Chapter 12: a CNN (`spec.scheme` = its padding: zero, valid, circular) regresses each pixel's position.

    model: channels, dilations. The read-out grid is task size x size; a valid CNN gets its
    margin of extra input (options fit_margin). One row: {radius, r2, error_px,
    chance_error_px}, plus with options maps: the error map and one predicted column map.
    """
    from ..vision.cnn import PositionCNN, position_loss
    from .train import pick_device, train
    torch.manual_seed(spec.seed)
    model = PositionCNN(spec.scheme, channels=spec.model["channels"], dilations=tuple(spec.model["dilations"]))
    kwargs = dict(spec.task_kwargs)
    if spec.options.get("fit_margin"):
        kwargs["margin"] = model.margin
    task = make_task(spec.task, **kwargs)
    model.to(pick_device(device))
    result = train(model, task, train_config(spec, device), loss_fn=position_loss)
    model.cpu()
    row = {"radius": model.radius, **task.evaluate(model)}
    if spec.options.get("maps"):
        images, _ = task.batch(1, torch.Generator().manual_seed(0))
        with torch.no_grad():
            row["prediction"] = model(images)[0, 1].tolist()
        row["error_map"] = task.error_map(model).tolist()
    return {"table": [row], "history": result.history, "final_loss": result.final_loss, "model": model}


@split_recipe("vit")
def vit(spec, device: str = "cpu") -> Training:
    """Chapter 13: a ViT (`posenc.vision.build_vit`) on the shipped digits, and its change of resolution.

    model: patch_size, stem, d_model, n_heads, n_layers; the task's image_size is the training
    resolution; options["train_images"] = n trains on the first n images of the fixed training split.
    Rows: {"part": "base", "test accuracy"} (a learned table adds its patch table before and after
    training); with options["variants"] = [[name, resize mode or None, scaled coordinates], ...] and
    options hi, ft_steps, ft_lr: one {"part": "resolution", variant, "low res", "high res, no
    fine-tune", "high res, fine-tuned"} row per variant (each fine-tuned from a copy of the model).
    """
    from ..vision import PatchLearned, build_vit
    from .train import pick_device
    lo = make_task(spec.task, **spec.task_kwargs)
    if spec.options.get("train_images"):                    # the data-size sweep: the first n training images
        lo = lo.subset(spec.options["train_images"])
    torch.manual_seed(spec.seed)
    model = build_vit(spec.scheme, image_size=lo.image_size, num_classes=10, **spec.model)
    learned = model.scheme if isinstance(model.scheme, PatchLearned) else None        # the "learned" scheme
    init_table = None if learned is None else learned.patch_table().detach().clone()
    model.to(pick_device(device))

    def finish(result) -> dict:
        row = {"part": "base", "test accuracy": lo.accuracy(model)}
        if learned is not None and init_table is not None:
            row |= {"init_patch_table": init_table.tolist(),
                    "patch_table": learned.patch_table().detach().cpu().tolist()}
        rows = [row] + (resolution_rows(model, lo, spec, device) if spec.options.get("variants") else [])
        return {"table": rows, "history": result.history, "final_loss": result.final_loss, "model": model}
    return Training(model, lo, train_config(spec, device), finish, vit_loss(None))


def vit_loss(ref_grid):
    """The ViT's classification loss with its patch coordinates read on `ref_grid` (None: its own grid)."""
    from ..model import classification_loss
    return lambda m, x, y: classification_loss(m, x, y, ref_grid=ref_grid)


def resolution_rows(model, lo, spec, device: str) -> list:
    """The `vit` recipe's change of resolution: each variant of options["variants"] on a copy of the model."""
    import copy
    from .train import train
    opts = spec.options
    hi = make_task(spec.task, **{**spec.task_kwargs, "image_size": opts["hi"],
                                 "max_shift": 2 * spec.task_kwargs.get("max_shift", 0)})
    patch = spec.model["patch_size"]
    g_lo, g_hi = (lo.image_size // patch,) * 2, (opts["hi"] // patch,) * 2
    rows = []
    for name, mode, scaled in opts["variants"]:
        m = copy.deepcopy(model)
        ref = g_lo if scaled else None
        r = {"part": "resolution", "variant": name, "low res": lo.accuracy(m)}
        if mode:
            m.scheme.resize_(g_hi, mode)
        r["high res, no fine-tune"] = hi.accuracy(m, ref_grid=ref)
        ft = opts["ft_steps"]
        cfg = TrainConfig(steps=ft, batch_size=spec.train["batch_size"], lr=opts["ft_lr"],
                          warmup=max(1, min(100, ft // 5)), seed=spec.seed, log_every=max(1, ft // 20),
                          progress=False, device=device)
        train(m, hi, cfg, loss_fn=vit_loss(ref))
        r["high res, fine-tuned"] = hi.accuracy(m, ref_grid=ref)
        rows.append(r)
    return rows


def stack_refusal(specs) -> str | None:
    """Why `specs` cannot be trained as one stacked model, or None when they can: at least two, one
    recipe with a stacked form, equal but for the seed, a scheme that runs under vmap, and a task
    whose batches have one shape or a causal model (whose batches are padded to one length,
    `posenc.runs.stacked.pad_right`). Read from the specs alone: nothing is built."""
    from ..scheme import SCHEMES
    from ..schemes.rotary import LENGTH_DEPENDENT
    if len(specs) < 2:
        return "a single seed"
    first = specs[0]
    if first.recipe not in SPLIT:
        return f"recipe {first.recipe!r} has no stacked form"
    if len({s.replace(seed=0).key for s in specs}) > 1 or len({s.seed for s in specs}) < len(specs):
        return "the specs differ in more than their seeds"
    if first.train.get("random_positions"):
        return "random_positions"
    if not getattr(SCHEMES.get(first.scheme), "vmappable", True):
        return f"scheme {first.scheme!r} does not run under torch.func.vmap"
    low, length = first.task_kwargs.get("min_train_length"), first.task_kwargs.get("train_length")
    if low is not None and length is not None and low < length:      # a length drawn per batch: padded
        if not first.model.get("causal"):
            return f"task {first.task!r} draws a length per batch, and a bidirectional model cannot be padded"
        if first.model.get("scaling") in LENGTH_DEPENDENT:
            return f"task {first.task!r} draws a length per batch, and RoPE's {first.model['scaling']!r} scaling depends on it"
    return None


def run_stacked(specs, device: str = "cpu") -> list[dict]:
    """The outputs of a `split_recipe` for several seeds of one spec, their trainings stacked into one
    (`posenc.runs.stacked.train_stacked`): each model prepared as alone, trained with the others, then
    finished with the global RNG where its own preparation left it (as when it trains alone, which
    draws nothing from it)."""
    from .stacked import train_stacked
    prepare = SPLIT[specs[0].recipe]
    trainings, states = [], []
    for spec in specs:
        trainings.append(prepare(spec, device))
        states.append(torch.get_rng_state())
    first = trainings[0]
    results = train_stacked([t.model for t in trainings], first.task, [t.cfg for t in trainings], first.loss_fn)
    outs = []
    for t, result, state in zip(trainings, results, states):
        torch.set_rng_state(state)
        outs.append(t.finish(result))
    return outs
