"""What each scheme costs a whole model, relative to NoPE and to x-transformers.

Every model has the same sizes and sees the same batch; the schemes are timed in
turns (`interleaved_times`) and each statistic is the best (minimum) over rounds, the
one least disturbed by the rest of the machine. A second, identical NoPE model
("nope (control)") is timed like the others: its ratio to NoPE, which should be 1,
shows the noise of the measurement.

* train: one step of forward, loss, backward and AdamW, in ms and / NoPE;
* eval: forward tokens per second without autograd, and / NoPE;
* memory: bytes autograd keeps for the backward pass of one training step (the
  activations, counted storage by storage: deterministic and device-independent) and
  / NoPE; on CUDA also the allocator's peak over the step.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .costs import saved_bytes, train_steps
from .gpu import peak_bytes
from ..model import build_model
from ..scheme import SCHEMES
from ..table import Table
from ..model import lm_loss
from .timing import interleaved_times

CONTROL = "nope (control)"
#: NoPE forced through the written-out attention softmax(q k^T / sqrt(d_h) + mask) v: what a scheme whose
#: bias needs a gradient pays on CPU before its own work (SDPA's fused CPU kernel returns no gradient for a
#: mask, and FlexAttention has no CPU backward), so T5's row reads as this row times the bias's own cost.
UNFUSED = "nope (unfused attention)"

#: The hooks that force attention off the fused kernel, or add a per-layer term to it.
_CUSTOM_HOOKS = ("extra_logits", "extra_values", "custom_attention")

#: Our scheme name -> (x-transformers Decoder kwargs, TransformerWrapper kwargs).
XT_OPTIONS = {
    "nope": ({}, {"use_abs_pos_emb": False}),
    "learned": ({}, {"use_abs_pos_emb": True}),
    "sinusoidal": ({}, {"scaled_sinu_pos_emb": True}),      # learnable scale, as ours
    "rope": ({"rotary_pos_emb": True}, {"use_abs_pos_emb": False}),
    "alibi": ({"alibi_pos_bias": True}, {"use_abs_pos_emb": False}),
    "t5": ({"rel_pos_bias": True}, {"use_abs_pos_emb": False}),
}


def scheme_kind(name: str) -> str:
    """"custom" (per-layer logits/values or own attention), "bias", "q/k" or "input": which hooks it overrides."""
    cls = SCHEMES[name]
    overrides = set(cls.overridden_hooks())
    if overrides & set(_CUSTOM_HOOKS) or getattr(cls, "uses_extra_values", False) is True:
        return "custom"
    for hook, kind in (("logit_bias", "bias"), ("layer_logit_bias", "bias"), ("transform_qk", "q/k"),
                       ("layer_transform_qk", "q/k")):
        if hook in overrides:
            return kind
    return "input"


def _batch(vocab_size, batch_size, seq_len, device):
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab_size, (batch_size, seq_len), generator=g).to(device) for _ in range(2)]


def _eval_forward(model, x):
    def forward():
        with torch.inference_mode():
            model(x)
    return forward


def scheme_costs(schemes=None, *, vocab_size: int = 64, seq_len: int = 256, batch_size: int = 16, d_model: int = 128,
                 n_heads: int = 4, n_layers: int = 2, rounds: int = 5, device: str = "cpu", clock: str = "wall",
                 rotate: bool = False) -> Table:
    """One row per scheme (NoPE first, then its control and NoPE unfused): kind, params, train ms (the best round)
    and / NoPE, the train ms of every round in timing order (`train_rounds_ms`: round i of two rows was timed
    in the same turn, so their ratio per round pairs, `round_ratios`; `rotate` varies who goes first,
    `interleaved_times`), eval tok/s and / NoPE, activation MiB and / NoPE."""
    schemes = ["nope", CONTROL, UNFUSED] + [s for s in (schemes or sorted(SCHEMES)) if s != "nope"]
    x, y = _batch(vocab_size, batch_size, seq_len, device)
    models = {}
    for name in schemes:
        torch.manual_seed(0)
        models[name] = build_model("nope" if name in (CONTROL, UNFUSED) else name, vocab_size, causal=True,
                                   max_len=seq_len, d_model=d_model, n_heads=n_heads, n_layers=n_layers).to(device)
        if name == UNFUSED:                 # the model's explicit path (the one for schemes that add to the values)
            models[name].scheme.uses_extra_values = True
    train = interleaved_times({n: train_steps(m.train(), x, y) for n, m in models.items()}, rounds=rounds, device=device,
                              clock=clock, rotate=rotate)
    evals = interleaved_times({n: _eval_forward(m, x) for n, m in models.items()}, rounds=rounds, device=device,
                              clock=clock)
    rows = Table()
    for name, model in models.items():
        model.train()
        act = saved_bytes(lambda: lm_loss(model(x), y))
        row = {"scheme": name, "kind": scheme_kind("nope" if name in (CONTROL, UNFUSED) else name),
               "params": sum(p.numel() for p in model.parameters()), "train_ms": 1e3 * min(train[name]),
               "train_rounds_ms": [1e3 * t for t in train[name]],
               "eval_tok_s": batch_size * seq_len / min(evals[name]), "act_MiB": act / 2 ** 20}
        if torch.device(device).type == "cuda":
            row["peak_MiB"] = peak_bytes(train_steps(model, x, y), device) / 2 ** 20
        rows.append(row)
    base = rows[0]
    for row in rows:
        row["train/nope"] = row["train_ms"] / base["train_ms"]
        row["eval/nope"] = row["eval_tok_s"] / base["eval_tok_s"]
        row["act/nope"] = row["act_MiB"] / base["act_MiB"]
        if "peak_MiB" in row:
            row["peak/nope"] = row["peak_MiB"] / base["peak_MiB"]
    return rows


def xtransformers_model(name: str, vocab_size: int, *, seq_len: int, d_model: int, n_heads: int, n_layers: int,
                        flash: bool = False):
    """x-transformers' decoder with the positional option matching our scheme `name` (see XT_OPTIONS)."""
    from x_transformers import Decoder, TransformerWrapper
    if name not in XT_OPTIONS:
        raise ValueError(f"name must be one of {sorted(XT_OPTIONS)} (schemes x-transformers has); got {name!r}")
    layer_kw, wrap_kw = XT_OPTIONS[name]
    layers = Decoder(dim=d_model, depth=n_layers, heads=n_heads, attn_dim_head=d_model // n_heads,
                     attn_flash=flash, **layer_kw)
    return TransformerWrapper(num_tokens=vocab_size, max_seq_len=seq_len, attn_layers=layers, **wrap_kw)


def xtransformers_costs(schemes=None, *, vocab_size: int = 64, seq_len: int = 256, batch_size: int = 16,
                        d_model: int = 128, n_heads: int = 4, n_layers: int = 2, rounds: int = 5,
                        device: str = "cpu", clock: str = "wall") -> Table:
    """Best training-step time of our model / x-transformers' (default attention, and flash where it allows the scheme).

    Also each library's own scheme/NoPE step ratio, the form of ALiBi's Table 1.
    """
    import logging
    logging.getLogger("x_transformers").setLevel(logging.ERROR)
    schemes = ["nope"] + [s for s in (schemes or XT_OPTIONS) if s in XT_OPTIONS and s != "nope"]
    sizes: dict[str, Any] = dict(seq_len=seq_len, d_model=d_model, n_heads=n_heads, n_layers=n_layers)
    x, y = _batch(vocab_size, batch_size, seq_len, device)
    fns: dict[tuple[str, str], Callable[[], object]] = {}
    for name in schemes:
        torch.manual_seed(0)
        ours = build_model(name, vocab_size, causal=True, max_len=seq_len, d_model=d_model, n_heads=n_heads,
                           n_layers=n_layers).to(device).train()
        fns[("ours", name)] = train_steps(ours, x, y)
        fns[("xt", name)] = train_steps(xtransformers_model(name, vocab_size, **sizes).to(device).train(), x, y)
        if name != "t5":                                        # x-transformers: flash is incompatible with T5 bias
            fns[("xt flash", name)] = train_steps(
                xtransformers_model(name, vocab_size, flash=True, **sizes).to(device).train(), x, y)
    times = {k: min(v) for k, v in interleaved_times(fns, rounds=rounds, device=device,
                                                                                  clock=clock).items()}
    rows = Table()
    for name in schemes:
        flash = times.get(("xt flash", name))
        rows.append({"scheme": name, "ours_ms": 1e3 * times[("ours", name)], "xt_ms": 1e3 * times[("xt", name)],
                     "ours/xt": times[("ours", name)] / times[("xt", name)],
                     "ours/xt_flash": None if flash is None else times[("ours", name)] / flash,
                     "ours: /nope": times[("ours", name)] / times[("ours", "nope")],
                     "xt: /nope": times[("xt", name)] / times[("xt", "nope")]})
    return rows


def round_ratios(rows, scheme: str, reference: str) -> dict[int, float]:
    """{round: train step of `scheme` / of `reference`} in each interleaved round of a `scheme_costs` table.

    The two were timed in the same turn, so what disturbed the machine in that round touched both: the
    per-round ratios are the replicates a claim about relative speed is judged on (`posenc.record_claim`)."""
    by_name = {r["scheme"]: r for r in rows}
    for name in (scheme, reference):
        if name not in by_name:
            raise ValueError(f"no row for scheme {name!r}; the table has {sorted(by_name)}")
        if "train_rounds_ms" not in by_name[name]:
            raise ValueError(f"row {name!r} keeps no per-round times (a table made before `train_rounds_ms`): "
                             "run `python -m posenc.bench` again")
    a, b = by_name[scheme]["train_rounds_ms"], by_name[reference]["train_rounds_ms"]
    if len(a) != len(b):
        raise ValueError(f"{scheme!r} has {len(a)} rounds and {reference!r} {len(b)}: not one interleaved run")
    return {i: x / y for i, (x, y) in enumerate(zip(a, b))}
