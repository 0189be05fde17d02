"""The `Scheme` interface: every place where position can enter attention.

For attention logits (row vectors, one head)

    a_ij = (x_i + p_i) W_q W_k^T (x_j + p_j)^T / sqrt(d_h),

a positional scheme changes one or more of four places, and a `Scheme` overrides
the matching hook. Every default does nothing, so `Scheme` itself is NoPE.

| hook             | changes                                   | e.g.                     |
| ---------------- | ----------------------------------------- | ------------------------ |
| `embed`          | x_i -> x_i + p_i (or x_i * p_i)           | learned, sinusoidal      |
| `layer_input`    | the same, before every block              | FLOATER, DeBERTa's EMD   |
| `decoder_queries`| the last block rerun `decoder_passes`     | DeBERTa's EMD as the     |
|                  | times, queries h + P, keys/values h       | paper builds it          |
| `transform_qk`   | q_i -> R_i q_i, k_j -> R_j k_j            | RoPE                     |
| `layer_transform_qk` | the same, in block l only (default:   | Llama 4's NoPE layers    |
|                  | `transform_qk` in every block)            |                          |
| `logit_bias`     | a_ij += b_ij, shared by all layers        | T5, ALiBi                |
| `score_mod`      | the same b_ij as a FlexAttention function | T5, ALiBi                |
|                  | of (head, i, j): no [H, N, N] tensor      |                          |
| `layer_logit_bias` | a_ij += b^l_ij, one per layer           | FIRE, KERPLE             |
| `extra_logits`,  | per-layer terms from q, k and positions   | Shaw, Transformer-XL,    |
| `extra_values`   | in the logits (and in the values)         | TUPE, DeBERTa            |

`prepare` runs once per forward pass, before the first layer; whatever it returns
(cos/sin tables, bias matrices, relative-position ids) is stored in the
`PositionContext` that every layer receives, so tables are computed once and shared
by all layers.

Conventions, fixed for the whole package:
    * positions are a 1-D tensor `[seq]` (long or float), one per token the layers
      see (a [CLS] token included);
    * relative position is `key_pos - query_pos` (j - i), as in T5;
    * `logit_bias` and `extra_logits` are added *after* the 1/sqrt(d_h) scaling,
      i.e. to `q k^T * scale`, which is what `scaled_dot_product_attention` does with
      a float `attn_mask`.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Callable, TypeVar

import torch
from torch import Tensor, nn


def check_positions(positions, seq_len: int | None = None, *, finite: str = "always") -> Tensor:
    """The one rule for positions, wherever they come in (the model, the public functions): a 1-D tensor
    [seq] (of length `seq_len` when given) of integers or of float32/float64 values, finite.

    bool and complex are refused (TypeError), and so are float16 and bfloat16, which round the integers
    above 2048 and 256: pass positions before a cast. `finite`: "always" reads the values wherever they are
    (one wait on a GPU), "on cpu" only where reading is free, "never" leaves it to the caller.
    Returns `positions` unchanged."""
    if finite not in ("always", "on cpu", "never"):
        raise ValueError(f"finite must be 'always', 'on cpu' or 'never'; got {finite!r}")
    if not isinstance(positions, Tensor) or positions.dim() != 1 or (seq_len is not None and len(positions) != seq_len):
        got = tuple(positions.shape) if isinstance(positions, Tensor) else type(positions).__name__
        raise ValueError(f"positions must be a 1-D tensor [seq{'' if seq_len is None else f'={seq_len}'}]; got {got}")
    if positions.dtype == torch.bool or positions.is_complex():
        raise TypeError(f"positions must be an integer, float32 or float64 tensor; got {positions.dtype}")
    if positions.dtype in (torch.float16, torch.bfloat16):
        raise TypeError(f"positions must be an integer, float32 or float64 tensor; got {positions.dtype}, which "
                        f"rounds positions (bfloat16 above 256, float16 above 2048): pass them before the cast")
    read = finite == "always" or (finite == "on cpu" and positions.device.type == "cpu")
    if read and positions.is_floating_point() and not bool(torch.isfinite(positions).all()):
        raise ValueError("positions must be finite; got NaN or inf")
    return positions


def stamp(t: Tensor) -> tuple | None:
    """What identifies `t`'s current values in a cache key: its storage and its in-place version counter
    (bumped by every in-place write: an optimizer step, `load_state_dict`, `mul_`; None for an inference
    tensor, which keeps none). None for a `torch.func` wrapper (vmap), which has no storage of its own:
    nothing is cached for it."""
    if torch._C._functorch.is_functorch_wrapped_tensor(t):
        return None
    return t.data_ptr(), None if t.is_inference() else t._version


def summarise_positions(positions: Tensor) -> tuple[int | None, tuple | None]:
    """(p_0 if positions are the integers p_0, p_0 + 1, ... else None, (min, max) or None if empty),
    read in one transfer from wherever `positions` [seq] live."""
    if not positions.numel():
        return None, None
    low, high = positions.min(), positions.max()
    if positions.is_floating_point():
        return None, tuple(torch.stack([low, high]).tolist())
    one = torch.ones((), dtype=torch.bool, device=positions.device)    # where positions are: stacked with them
    steps = (positions.diff() == 1).all() if len(positions) > 1 else one
    low, high, consecutive = torch.stack([low, high, steps.long()]).tolist()
    return (low if consecutive else None), (low, high)


def whole_distances(rel: Tensor, scheme: str) -> Tensor:
    """Distances j - i as long, for a scheme that looks them up in a table or a bucket; a ValueError naming
    the positions if any is fractional (rounding them would silently move keys to other buckets)."""
    if not rel.is_floating_point():
        return rel.long()
    whole = rel.round()
    if not torch.equal(rel, whole):
        raise ValueError(f"positions must be whole numbers for {scheme}, which looks distances up by index; "
                         f"got fractional positions")
    return whole.long()


def caching() -> bool:
    """Whether a scheme may look tables up in, or add them to, its cache of earlier forwards: not inside a
    graph that `torch.compile` traces (the graph recomputes its tables, and a tensor it makes must not
    outlive it)."""
    return not torch.compiler.is_compiling()


def cacheable(t: Tensor) -> bool:
    """Whether a scheme may keep `t` for later forwards: not while compiling (`caching`), not made in
    inference mode (it could not be used with autograd) and not a `torch.func` wrapper (vmap, grad),
    which must not escape its transform."""
    return (caching() and not torch.is_inference_mode_enabled()
            and not torch._C._functorch.is_functorch_wrapped_tensor(t))


@dataclass
class PositionContext:
    """What every layer knows about positions in one forward pass."""

    positions: Tensor  #: [seq] long or float
    causal: bool  #: whether keys after the query are masked
    has_cls: bool = False  #: positions[0] belongs to a [CLS] token
    tables: dict = field(default_factory=dict)  #: filled once by Scheme.prepare
    attn_mask: Tensor | None = None  #: [h or 1, seq, seq] float: bias + causal mask
    start: int | None = None  #: positions are start, start + 1, ... (set with `extent` by the model)
    score_mod: object = None  #: set instead of attn_mask on the FlexAttention path (`Scheme.score_mod`)
    block_mask: object = None  #: FlexAttention's causal block mask on that path (None: bidirectional)
    extent: tuple | None = None  #: (min, max) of positions as Python numbers, read on the host by the model
    host_positions: Tensor | None = None  #: the same positions on the CPU, when the model received them there
    ready: bool = False  #: tables and attn_mask filled (`Transformer.context`, `posenc.attention.merge_mask`)
    _read: tuple | None = field(default=None, repr=False, compare=False)  # (start, minmax): one read of the tensor

    def __post_init__(self):
        if not isinstance(self.positions, Tensor) or self.positions.dim() != 1:
            shape = tuple(self.positions.shape) if isinstance(self.positions, Tensor) else type(self.positions).__name__
            raise TypeError(f"positions must be a 1-D tensor, one position per token (torch.arange(n)); got {shape}")
        for name in ("causal", "has_cls", "ready"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False; got {getattr(self, name)!r}")

    @property
    def seq_len(self) -> int:
        return self.positions.shape[0]

    def minmax(self) -> tuple | None:
        """(min, max) of `positions` as Python numbers, None for no positions.

        `extent` when the model set it (it reads positions where they are free to read: known for
        its default 0..n-1, on the host for positions passed from the CPU), else read from the
        tensor, which on a GPU waits for it, once per context however many ask (xPos checks its span,
        then RoPE's tables read the start and the largest: `_summary`). Schemes check positions through this, so a training
        step never waits.
        """
        if self.extent is not None or not self.positions.numel():
            return self.extent
        return self._summary()[1]

    def _summary(self) -> tuple:
        """`summarise_positions(positions)`, read from the tensor at most once for this context."""
        if self._read is None:
            self._read = summarise_positions(self.positions)
        return self._read

    def positions_on_host(self) -> Tensor | None:
        """`positions` as a CPU tensor if known without reading the device (on the CPU already, a copy
        the model kept, or the model's start, start + 1, ...), else None."""
        if self.positions.device.type == "cpu":
            return self.positions
        if self.host_positions is not None:
            return self.host_positions
        start = self.start if self.extent is not None else None
        return None if start is None else torch.arange(start, start + self.seq_len)

    def consecutive_start(self) -> int | None:
        """p_0 when positions are the integers p_0, p_0 + 1, ..., p_0 + n - 1, else None.

        `start` when the model set it (with `extent`), else read from the tensor (a wait on a GPU)."""
        if self.start is not None or self.extent is not None:
            return self.start
        return self._summary()[0]


class Scheme(nn.Module):
    """Base positional scheme; each hook's default leaves attention position-free.

    Args:
        d_model: width of the residual stream.
        n_heads: attention heads per layer.
        n_layers: Transformer blocks (for schemes with per-layer parameters).
        max_len: the longest sequence a table-based scheme must serve.
        causal: whether the model masks future keys.
    """

    # -- capabilities: class attributes that the shared tests and the model read -------
    #: `extra_values` adds to the attention output (needs the explicit softmax).
    uses_extra_values = False
    #: Works with Transformer-XL's memory (keys longer than queries).
    supports_memory = False
    #: The output is unchanged when every position is shifted by the same constant.
    shift_invariant = False
    #: Only defined for causal models (e.g. xPos's decaying scale).
    causal_only = False
    #: Runs under `torch.func.vmap` (seeds trained as one stacked model, `posenc.runs.stacked`).
    vmappable = True
    #: A training step can be captured as a CUDA graph (`posenc.runs.graphed`): no host work that changes
    #: from one step to the next at a fixed batch shape.
    graph_safe = True

    #: The hooks a scheme may override, in the order a forward pass calls them.
    HOOKS = ("prepare", "embed", "layer_input", "transform_qk", "layer_transform_qk", "logit_bias", "layer_logit_bias",
             "extra_logits", "extra_values", "logit_scale")

    def __init__(self, *, d_model: int, n_heads: int, n_layers: int, max_len: int, causal: bool):
        super().__init__()
        for arg, value in (("d_model", d_model), ("n_heads", n_heads), ("n_layers", n_layers), ("max_len", max_len)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{arg} must be a positive int; got {value!r}")
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be True or False; got {causal!r}")
        self.d_model, self.n_heads, self.n_layers = d_model, n_heads, n_layers
        self.max_len, self.causal = max_len, causal
        self.head_dim = d_model // n_heads

    def check_fits(self, owner: str, **sizes: int) -> None:
        """Raise a ValueError naming each of `sizes` (d_model=..., n_heads=...) this scheme was not built for:
        a RoPE built for 4-dim heads would rotate half of an 8-dim head, silently."""
        differ = {k: (getattr(self, k), v) for k, v in sizes.items() if getattr(self, k) != v}
        if differ:
            raise ValueError("the scheme was built for another model: " + ", ".join(
                f"scheme {k}={a!r} but {owner} {k}={b!r}" for k, (a, b) in differ.items()))

    # -- once per forward ------------------------------------------------------
    def prepare(self, ctx: PositionContext) -> dict:
        """Tables shared by all layers of this forward pass."""
        return {}

    # -- hook 1: input ---------------------------------------------------------
    def embed(self, x: Tensor, ctx: PositionContext) -> Tensor:
        """x: [batch, seq, d_model] -> same; absolute schemes add or multiply p_i."""
        return x

    def layer_input(self, x: Tensor, ctx: PositionContext, layer: int) -> Tensor:
        """Per-layer input injection before block `layer` (FLOATER, DeBERTa's EMD); identity by default."""
        return x

    #: Extra passes of the last block as a decoder (DeBERTa's EMD as the paper builds it): 0 for none.
    decoder_passes = 0

    def decoder_queries(self, h: Tensor, ctx: PositionContext) -> Tensor:
        """Hook 1c: the query stream I_0 of the decoder passes, from the last block's input h [B, N, D].

        Used only when `decoder_passes` > 0: the model then runs the last block that many times as
        I_{t+1} = Block(queries I_t, keys and values h) and returns I_passes instead of Block(h)."""
        return h

    # -- hook 2: q/k transform -------------------------------------------------
    def transform_qk(self, q: Tensor, k: Tensor, ctx: PositionContext) -> tuple[Tensor, Tensor]:
        """q, k: [batch, heads, seq, head_dim] -> same; rotary schemes rotate them."""
        return q, k

    def layer_transform_qk(self, q: Tensor, k: Tensor, ctx: PositionContext, layer: int) -> tuple[Tensor, Tensor]:
        """The q/k transform of block `layer` (what attention calls); `transform_qk` in every block by default."""
        return self.transform_qk(q, k, ctx)

    # -- hook 3: logit bias ----------------------------------------------------
    def logit_bias(self, ctx: PositionContext) -> Tensor | None:
        """b_ij added to every layer's scaled logits: [heads or 1, seq, seq] or None."""
        return None

    def score_mod(self, ctx: PositionContext) -> Callable[..., Tensor] | None:
        """Hook 3 for FlexAttention: b_ij as a function `(score, b, h, i, j) -> score + b_hij` of indices,
        built from O(N) tables, so that no [H, N, N] bias is materialised; None (the default) when the
        scheme has none, and then the model builds `logit_bias`. It must equal `logit_bias(ctx)[h, i, j]`."""
        return None

    def layer_logit_bias(self, ctx: PositionContext, layer: int) -> Tensor | None:
        """b^l_ij added to layer `layer`'s scaled logits: [heads or 1, seq, seq] or None (FIRE, KERPLE)."""
        return None

    # -- hook 4: custom logits / values ---------------------------------------
    def extra_logits(self, q: Tensor, k: Tensor, ctx: PositionContext, layer: int) -> Tensor | None:
        """Per-layer terms added to the scaled logits: [batch, heads, seq, seq] or None."""
        return None

    def extra_values(self, probs: Tensor, ctx: PositionContext, layer: int) -> Tensor | None:
        """Per-layer term added to the output `probs @ v`: [batch, heads, seq, head_dim]."""
        return None

    def clear_cache(self) -> None:
        """Drop what the scheme keeps between forwards (none by default; ALiBi its last bias): a benchmark
        measuring one step's peak memory calls it first, so that the step builds its tables as it would anew."""

    def logit_scale(self) -> float:
        """The factor on q k^T; 1/sqrt(d_h) unless the scheme changes it (TUPE, DeBERTa)."""
        return 1.0 / math.sqrt(self.head_dim)

    @classmethod
    def overridden_hooks(cls) -> tuple[str, ...]:
        """The hooks this scheme class overrides (NoPE: none), in `HOOKS` order."""
        return tuple(h for h in cls.HOOKS if getattr(cls, h) is not getattr(Scheme, h))

    @classmethod
    def input_only(cls) -> bool:
        """Whether every hook this scheme overrides acts on the residual stream (`embed`, `layer_input`, and
        `prepare` for their tables), none inside attention: alone, one `Attention` layer would leave it
        position-free. False for NoPE (no hooks at all) and for a scheme with decoder passes."""
        hooks = set(cls.overridden_hooks())
        return bool(hooks) and hooks <= {"prepare", "embed", "layer_input"} and not cls.decoder_passes

    @property
    def custom_attention(self) -> bool:
        """Whether attention gets per-layer terms (hook 3b or 4): the mask is then built explicitly."""
        return bool({"layer_logit_bias", "extra_logits", "extra_values"} & set(self.overridden_hooks()))


#: name -> Scheme class; every module of `posenc.schemes` adds its schemes on import.
SCHEMES: dict[str, type[Scheme]] = {}
S = TypeVar("S", bound=Scheme)                   # the class `register` adds, returned as it came


def register(name: str, *, replace: bool = False) -> Callable[[type[S]], type[S]]:
    """Class decorator adding a scheme to `SCHEMES` under `name`.

    A name already bound to another class is refused unless `replace=True`: a run's key names its scheme,
    not the class, so a silently replaced "rope" would read, or overwrite, the records the book's RoPE made.
    (The same class defined again, as a module reload does, replaces itself.)"""
    if not isinstance(name, str) or not name:         # a tuple among the names breaks every sorted() of them
        raise TypeError(f"register's name must be a non-empty str; got {name!r}")
    if not isinstance(replace, bool):
        raise TypeError(f"replace must be True or False; got {replace!r}")
    def add(cls: type[S]) -> type[S]:
        if not (isinstance(cls, type) and issubclass(cls, Scheme)):
            raise TypeError(f"register({name!r}) expects a Scheme subclass; got {cls!r}")
        old = SCHEMES.get(name)
        same = old is not None and (old.__module__, old.__qualname__) == (cls.__module__, cls.__qualname__)
        if old is not None and not same and not replace:
            raise ValueError(f"scheme name {name!r} is taken by {old.__module__}.{old.__qualname__}; choose "
                             f"another name, or register({name!r}, replace=True) to replace it")
        SCHEMES[name] = cls
        return cls
    return add


def get_scheme(name: str) -> type[Scheme]:
    """The scheme class called `name`; a ValueError lists the known names otherwise."""
    if not isinstance(name, str) or name not in SCHEMES:
        raise ValueError(f"unknown scheme {name!r}; known schemes: {', '.join(sorted(SCHEMES))}")
    return SCHEMES[name]


def scheme_parameters(name: str) -> set[str] | None:
    """The keywords the scheme called `name` accepts: those of its `__init__` and of each parent's that
    the child passes on through `**kwargs`. None when one of them takes `**kwargs` of its own (any name)."""
    accepted: set[str] = set()
    for cls in get_scheme(name).__mro__:
        if "__init__" not in cls.__dict__ or cls in (nn.Module, object):
            continue
        params = inspect.signature(cls.__dict__["__init__"]).parameters.values()
        accepted |= {p.name for p in params if p.name != "self" and p.kind is not p.VAR_KEYWORD
                     and p.kind is not p.VAR_POSITIONAL}
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return accepted
    return None
