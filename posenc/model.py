"""A small pre-LN Transformer that any `Scheme` plugs into.

    h_0 = scheme.embed(E[tokens])
    h_l = h_{l-1} + Attn_l(LN(h_{l-1}));  h_l = h_l + MLP_l(LN(h_l))
    logits = LN(h_L) W_out^T            (W_out = E when the head is tied)

The model never looks at positions itself: it builds one `PositionContext` per
forward (positions, causal flag, the scheme's tables and the merged bias/causal
mask) and hands it to every layer.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import Attention, causal_block_mask, check_dropout, check_sizes, merge_mask
from .host import assert_values, to_device, values_checked_on_host
from .scheme import PositionContext, Scheme, check_positions, get_scheme, scheme_parameters, summarise_positions

IGNORE = -100  # target id that losses and metrics skip
#: Where a bias scheme's b_ij is computed: "auto" (FlexAttention on CUDA from `FLEX_MIN_KEYS` keys, the
#: [H, N, N] tensor otherwise), "flex" (FlexAttention wherever it runs; on CPU for inference only, as PyTorch
#: has no CPU backward for it) or "sdpa" (always the tensor). Per model: `model.attention_backend`.
ATTENTION_BACKENDS = ("auto", "flex", "sdpa")
#: The shortest sequence (keys) for which "auto" takes FlexAttention on CUDA. Below it the bias tensor is
#: small (8 heads x 1024^2 in bf16: 16 MiB) and FlexAttention only adds its compile, seconds for every new
#: shape (`dynamic=False`), which a run over lengths drawn per batch would repeat until torch.compile's
#: recompile limit sends it to the eager kernel. From here on the [H, N, N] tensor is what FlexAttention
#: saves: 64 MiB at 8 heads and 2048 keys, 4 GiB at 16384, and a learned bias's gradient as much again
#: (`python -m posenc.bench --only gpu` times both backends at 4096 and 16384).
FLEX_MIN_KEYS = 2048


def flex_wanted(backend: str, device, keys: int) -> bool:
    """Whether `backend` asks for FlexAttention for `keys` keys on `device` ("auto": CUDA and at least
    `FLEX_MIN_KEYS` keys; "flex": always; "sdpa": never). ValueError names an unknown backend."""
    if backend not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}; got {backend!r}")
    if backend == "auto":
        return torch.device(device).type == "cuda" and keys >= FLEX_MIN_KEYS
    return backend == "flex"


@dataclass
class SegmentContext(PositionContext):
    """A `PositionContext` whose keys start with a memory of earlier tokens (Transformer-XL).

    `positions` are the current segment's (the queries'); `key_positions` [mem + seq]
    are the memory's followed by the segment's. Schemes read them through
    `posenc.relative.key_positions(ctx)`.
    """

    key_positions: Tensor | None = None


def run_blocks(blocks, scheme: Scheme, x: Tensor, ctx: PositionContext, need_weights: bool = False, memory=None):
    """The layer stack shared by every model: hook 1b (`layer_input`) then each block.

    Returns (output, attention maps or Nones, each block's input); `memory[i]` is block
    i's Transformer-XL memory. With `scheme.decoder_passes` = n > 0 the last block runs n
    times as a decoder (hook 1c, DeBERTa's EMD): I_0 = scheme.decoder_queries(h), then
    I_{t+1} = Block(queries I_t; keys, values h) with h the last block's input, weights shared.
    """
    maps, inputs = [], []
    last = len(blocks) - 1
    for i, block in enumerate(blocks):
        x = scheme.layer_input(x, ctx, i)                             # hook 1b: per-layer injection
        inputs.append(x)
        mem = None if memory is None else memory[i]
        if i == last and scheme.decoder_passes:                       # hook 1c: the last block as a decoder
            h, x = x, scheme.decoder_queries(x, ctx)
            for _ in range(scheme.decoder_passes):
                x, probs = block(x, scheme, ctx, need_weights, mem, kv=h)
        else:
            x, probs = block(x, scheme, ctx, need_weights, mem)
        maps.append(probs)
    return x, maps, inputs


class Block(nn.Module):
    """One pre-LN Transformer block: x + Attn(LN(x)), then h + MLP(LN(h)), the MLP d_model -> d_ff -> d_model
    with GELU (GPT-2's layout); returns the new states and the attention weights when asked for them."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, layer: int, dropout: float):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = Attention(d_model, n_heads, layer, dropout)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model), nn.Dropout(dropout))

    def forward(self, x, scheme, ctx, need_weights=False, memory=None, kv=None):
        """`memory` [B, M, D]: earlier inputs of this block (pre-LN), used as extra keys/values;
        `kv` [B, N, D]: keys and values from this stream instead of x (a decoder pass; x gives the queries)."""
        a, probs = self.attn(self.ln1(x), scheme, ctx, need_weights, None if memory is None else self.ln1(memory),
                             None if kv is None else self.ln1(kv))
        x = x + a
        return x + self.mlp(self.ln2(x)), probs


class Transformer(nn.Module):
    """Token embedding, `n_layers` pre-LN blocks sharing one scheme, and a LM head.

    Args:
        scheme: the positional scheme (shared by all layers).
        vocab_size: number of token ids.
        d_model, n_heads, n_layers: the residual width, heads per layer and blocks (the scheme's own).
        causal: mask future keys (decoder) or not (encoder).
        d_ff: the feed-forward width (default 4 d_model).
        dropout: dropout rate in the blocks.
        cls_token: prepend a learned [CLS] vector; it takes the first position and
            the tokens the next ones (default positions: CLS 0, tokens 1..n, as in BERT).
        tie_weights: output head shares the token embedding matrix.
        num_classes: add a sequence classifier read from [CLS] (or the mean state).
    """

    def __init__(self, scheme: Scheme, vocab_size: int, *, d_model: int, n_heads: int, n_layers: int,
                 causal: bool, d_ff: int | None = None, dropout: float = 0.0, cls_token: bool = False,
                 tie_weights: bool = True, num_classes: int | None = None):
        super().__init__()
        if not isinstance(scheme, Scheme):
            raise TypeError(f"scheme must be a posenc Scheme (posenc.SCHEMES[name](...)); got {type(scheme).__name__}")
        check_model_args(vocab_size=vocab_size, d_model=d_model, n_heads=n_heads, n_layers=n_layers, causal=causal,
                         d_ff=d_ff, dropout=dropout, cls_token=cls_token, tie_weights=tie_weights,
                         num_classes=num_classes)
        scheme.check_fits("model", d_model=d_model, n_heads=n_heads, n_layers=n_layers, causal=causal)
        self.scheme, self.vocab_size, self.causal = scheme, vocab_size, causal
        self.tok = nn.Embedding(vocab_size, d_model)
        self.cls = nn.Parameter(torch.zeros(1, 1, d_model)) if cls_token else None
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(d_model, n_heads, d_ff or 4 * d_model, i, dropout) for i in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.classifier = nn.Linear(d_model, num_classes) if num_classes else None
        self.apply(_init_weights)
        if tie_weights:
            self.head.weight = self.tok.weight
        self.attention_backend = "auto"

    # -- public API --------------------------------------------------------------
    def forward(self, tokens: Tensor, positions: Tensor | None = None) -> Tensor:
        """tokens [batch, seq] long -> logits [batch, seq, vocab] (no [CLS] row)."""
        h, _ = self.hidden_states(tokens, positions)
        return self.head(h[:, 1:] if self.cls is not None else h)

    def classify(self, tokens: Tensor, positions: Tensor | None = None) -> Tensor:
        """Sequence logits [batch, num_classes] from [CLS] (or the mean state without one)."""
        if self.classifier is None:
            raise ValueError("classify() needs a model built with num_classes=...")
        h, _ = self.hidden_states(tokens, positions)
        return self.classifier(h[:, 0] if self.cls is not None else h.mean(1))

    @torch.no_grad()
    def attention_maps(self, tokens: Tensor, positions: Tensor | None = None) -> list[Tensor]:
        """Attention weights of every layer, each [batch, heads, seq, seq] ([CLS] included)."""
        maps = self.hidden_states(tokens, positions, need_weights=True)[1]
        return cast("list[Tensor]", maps)                      # need_weights: no layer gives None

    def forward_segment(
            self, tokens: Tensor, memory: list[Tensor] | None = None,
            positions: Tensor | None = None, mem_len: int | None = None
    ) -> tuple[Tensor, list[Tensor]]:
        """Transformer-XL's segment-level recurrence:
        (logits [B, T, vocab], new memory).

        `memory` holds, per layer, the inputs [B, M, D] of that block for the
        M tokens just before this segment (None: no memory). The new memory is
        the last `mem_len` (default T) rows of [memory; this segment's block
        inputs], detached: no gradient flows into earlier segments.
        `positions` [T] are this segment's, default arange(M, M + T); the
        memory's are the M integers before positions[0].
        """
        h, _, inputs = self._run(tokens, positions, False, memory)
        mem_len = tokens.shape[1] if mem_len is None else mem_len
        if not isinstance(mem_len, int) or mem_len < 0:
            raise ValueError(
                f"mem_len must be a non-negative int; got {mem_len!r}")
        new = []
        for m, x in zip(memory or repeat(None), inputs):
            full = x if m is None else torch.cat([m, x], 1)  # (B, M+T, D)
            # stop-gradient (XL, sec. 3.2)
            new.append(full[:, max(0, full.shape[1] - mem_len):].detach())
        return self.head(h), new

    def hidden_states(self, tokens: Tensor, positions: Tensor | None = None,
                      need_weights: bool = False) -> tuple[Tensor, list[Tensor | None]]:
        """Final normed states [batch, seq (+1 for CLS), d_model] and the attention maps."""
        h, maps, _ = self._run(tokens, positions, need_weights)
        return h, maps

    def _run(self, tokens, positions=None, need_weights=False, memory=None):
        """(final normed states, attention maps, each block's input); `memory` as in `forward_segment`.

        An empty sequence (T = 0) gives empty states for every scheme, without calling one."""
        self.check_inputs(tokens)
        x = self.tok(tokens)                                         # (B, T, D)
        if self.cls is not None:
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1)
        if x.shape[0] == 0 or x.shape[1] == 0:                        # nothing to attend to: empty states
            if positions is not None:
                self._check_positions(tokens.shape[1], positions)
            return self.ln_f(x), [None] * len(self.blocks), [x] * len(self.blocks)
        mem_len = self._check_memory(memory, tokens)
        ctx = self.context(tokens.shape[1], positions, tokens.device, mem_len, need_weights)
        x = self.drop(self.scheme.embed(x, ctx))                     # hook 1
        x, maps, inputs = run_blocks(self.blocks, self.scheme, x, ctx, need_weights, memory)
        return self.ln_f(x), maps, inputs

    def context(self, seq_len: int, positions: Tensor | None, device: torch.device | str, mem_len: int = 0,
                need_weights: bool = False) -> PositionContext:
        """Positions, the scheme's shared tables and the merged bias + causal mask.

        With `mem_len` > 0 (Transformer-XL memory) keys are [memory; segment], the
        context is a `SegmentContext` and the causal mask is right-aligned (T, M + T).
        On the FlexAttention path (`attention_backend`; a scheme with a `score_mod`, no
        per-layer terms, no memory, no dropout, no weights asked for) the context holds the
        score_mod and a causal block mask instead of the [H, T, T] bias.
        """
        positions, start, extent, host = self._positions(seq_len, positions, device, mem_len)
        ctx: PositionContext
        if mem_len:
            before = positions[0] - torch.arange(mem_len, 0, -1, device=device).to(positions.dtype)
            ctx = SegmentContext(positions, self.causal, key_positions=torch.cat([before, positions]))
        else:
            ctx = PositionContext(positions, self.causal, has_cls=self.cls is not None)
        ctx.start, ctx.extent, ctx.host_positions = start, extent, host
        ctx.tables = self.scheme.prepare(ctx)
        if self._flex(device, ctx.seq_len, mem_len, need_weights):
            ctx.score_mod = self.scheme.score_mod(ctx)               # hook 3 as a function of (h, i, j)
            if ctx.score_mod is not None:
                ctx.block_mask = causal_block_mask(ctx.seq_len, ctx.seq_len, device) if self.causal else None
                ctx.ready = True
                return ctx
        return merge_mask(self.scheme, ctx)                          # hook 3 + causal mask, once for all layers

    def _flex(self, device, seq_len: int, mem_len: int, need_weights: bool) -> bool:
        """Whether this forward may compute the bias inside FlexAttention (see `attention_backend`)."""
        backend = self.attention_backend
        wanted = flex_wanted(backend, device, seq_len + mem_len)
        if backend == "flex" and torch.device(device).type != "cuda" and torch.is_grad_enabled() and self.training:
            raise ValueError("attention_backend='flex' trains on CUDA only (PyTorch's FlexAttention has no CPU "
                             "backward); on CPU use it for inference (model.eval() or torch.no_grad()) or use 'sdpa'")
        return (wanted and not mem_len and not need_weights and not self.scheme.custom_attention
                and not self.scheme.uses_extra_values and (self.drop.p == 0 or not self.training))

    # -- validation --------------------------------------------------------------
    def _check_memory(self, memory, tokens: Tensor) -> int:
        """Length M of a per-layer memory list (0 for None), after checking it fits."""
        if memory is None:
            return 0
        allowed = self.scheme.supports_memory
        if self.cls is not None or not allowed:
            raise ValueError(f"memory needs a scheme with supports_memory=True (e.g. 'xl', 'nope') and no [CLS]; "
                             f"got {type(self.scheme).__name__}")
        want = (tokens.shape[0], None, self.tok.embedding_dim)
        if (not isinstance(memory, (list, tuple)) or len(memory) != len(self.blocks)
                or any(m.dim() != 3 or m.shape[0] != want[0] or m.shape[2] != want[2] or m.shape[1] != memory[0].shape[1]
                       for m in memory)):
            raise ValueError(f"memory must be a list of {len(self.blocks)} tensors [batch={want[0]}, M, {want[2]}]")
        return memory[0].shape[1]

    def check_inputs(self, tokens: Tensor) -> None:
        """TypeError unless `tokens` is a long tensor [batch, seq]; ValueError for ids outside the vocabulary.

        Every forward runs it; inside `posenc.host.host_checked()` the forward skips the value
        check (it reads the tokens on the host: a wait on a GPU), for a caller that ran this
        on the batch before copying it to the device. Inside a graph that `torch.compile` traces the
        value check is an assertion the kernels run (`posenc.host.assert_values`): a RuntimeError on
        the CPU, a device-side assertion on a GPU."""
        if not isinstance(tokens, Tensor) or tokens.dtype != torch.long or tokens.dim() != 2:
            got = f"{tokens.dtype} of shape {tuple(tokens.shape)}" if isinstance(tokens, Tensor) else type(tokens).__name__
            raise TypeError(f"tokens must be a long tensor [batch, seq]; got {got}")
        if not tokens.numel() or values_checked_on_host():
            return
        if torch.compiler.is_compiling():                   # no read on the host inside a traced graph
            assert_values((tokens >= 0) & (tokens < self.vocab_size),
                          f"tokens must lie in [0, vocab_size={self.vocab_size})")
            return
        low, high = (int(v) for v in torch.aminmax(tokens))
        if low < 0 or high >= self.vocab_size:
            raise ValueError(f"tokens must lie in [0, vocab_size={self.vocab_size}); got values in [{low}, {high}]")

    def _positions(self, seq_len: int, positions: Tensor | None, device, mem_len: int = 0):
        """(the positions the layers see [CLS first] on `device`, consecutive start or None, (min, max),
        the same positions on the CPU if they came from there, else None).

        Default positions are mem_len, mem_len + 1, ... (with [CLS]: CLS mem_len, tokens after it),
        summarised without reading them. Given positions are checked, given their [CLS] position
        (positions[0]; 0 for no tokens, tokens move up by one) and summarised where they are (free
        on the CPU; on a GPU one wait), then copied to `device` without waiting."""
        if positions is None:
            n = seq_len + (self.cls is not None)
            extent = (mem_len, mem_len + n - 1) if n else None
            return torch.arange(mem_len, mem_len + n, device=device), mem_len, extent, None
        positions = self._check_positions(seq_len, positions)
        if self.cls is not None:
            first = positions[:1] if len(positions) else positions.new_zeros(1)
            positions = torch.cat([first, positions + 1])
        start, extent = summarise_positions(positions)
        host = positions if positions.device.type == "cpu" else None
        return to_device(positions, device), start, extent, host

    @staticmethod
    def _check_positions(seq_len: int, positions: Tensor) -> Tensor:
        """Positions validated once, where the model receives them (`check_positions`), every integer dtype
        widened to int64 (so j - i cannot wrap around in uint8 or int8)."""
        check_positions(positions, seq_len)
        return positions if positions.is_floating_point() else positions.long()


def _init_weights(module: nn.Module) -> None:
    """GPT-2's initialisation: N(0, 0.02) weights, zero biases."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def check_model_args(*, vocab_size, d_model, n_heads, n_layers, causal, d_ff, dropout, cls_token, tie_weights,
                     num_classes) -> None:
    """The checks `Transformer` and `build_model` share: sizes positive ints (d_ff, num_classes may be None),
    n_heads dividing d_model, dropout in [0, 1), the flags True or False (a string "no" is truthy), and no
    [CLS] classifier under a causal mask."""
    for arg, value in (("causal", causal), ("cls_token", cls_token), ("tie_weights", tie_weights)):
        if not isinstance(value, bool):
            raise TypeError(f"{arg} must be True or False; got {value!r}")
    check_sizes(vocab_size=vocab_size, d_model=d_model, n_heads=n_heads, n_layers=n_layers, d_ff=d_ff,
                num_classes=num_classes)
    check_dropout(dropout)
    if causal and cls_token and num_classes is not None:
        raise ValueError("cls_token=True with causal=True cannot classify: [CLS] sits at position 0, where the "
                         "causal mask lets it see only itself, so every input would get the same class; use "
                         "causal=False, or cls_token=False (classify() then pools the mean state)")


def build_model(scheme: str, vocab_size: int, *, d_model: int = 128, n_heads: int = 4, n_layers: int = 2,
                causal: bool, max_len: int = 512, d_ff: int | None = None, dropout: float = 0.0,
                cls_token: bool = False, tie_weights: bool = True, num_classes: int | None = None,
                **scheme_kwargs: Any) -> Transformer:
    """A `Transformer` using the scheme called `scheme`: `model(tokens, positions=None)` -> logits [batch, seq, vocab].

    Args:
        scheme: a name in `posenc.SCHEMES`.
        vocab_size: number of token ids.
        d_model: width of the residual stream.
        n_heads: attention heads per layer (d_model / n_heads per head).
        n_layers: Transformer blocks.
        causal: mask future keys (decoder) or not (encoder).
        max_len: the longest token sequence that table-based schemes must serve (with `cls_token`,
            their tables get one more row, for [CLS]).
        d_ff: the feed-forward width (default 4 d_model).
        dropout: dropout rate in the blocks.
        cls_token, tie_weights, num_classes: as in `Transformer`.
        **scheme_kwargs: go to the scheme's constructor (RoPE's `base`, T5's `num_buckets`, ...).
    """
    check_model_args(vocab_size=vocab_size, d_model=d_model, n_heads=n_heads, n_layers=n_layers, causal=causal,
                     d_ff=d_ff, dropout=dropout, cls_token=cls_token, tie_weights=tie_weights, num_classes=num_classes)
    check_sizes(max_len=max_len)
    accepted = scheme_parameters(scheme)           # None: a constructor takes **kwargs of its own (any name)
    unknown = [] if accepted is None else sorted(set(scheme_kwargs) - accepted)
    if accepted is not None and unknown:
        own = sorted(accepted - {"d_model", "n_heads", "n_layers", "max_len", "causal"})
        raise TypeError(f"build_model: scheme {scheme!r} takes no keyword {', '.join(unknown)}; its own keywords: "
                        f"{', '.join(own) or 'none'} (besides build_model's: d_model, n_heads, n_layers, causal, "
                        f"max_len, d_ff, dropout, cls_token, tie_weights, num_classes)")
    scheme_module = get_scheme(scheme)(d_model=d_model, n_heads=n_heads, n_layers=n_layers,
                                       max_len=max_len + int(cls_token), causal=causal, **scheme_kwargs)
    return Transformer(scheme_module, vocab_size, d_model=d_model, n_heads=n_heads, n_layers=n_layers,
                       causal=causal, d_ff=d_ff, dropout=dropout, cls_token=cls_token,
                       tie_weights=tie_weights, num_classes=num_classes)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over targets that are not IGNORE."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=IGNORE)


def classification_loss(model, inputs: torch.Tensor, labels: torch.Tensor, **forward_kwargs) -> torch.Tensor:
    """Cross-entropy of a sequence/image classifier: `model.classify(inputs)` when the model
    has it (token models), else `model(inputs)` (the ViT); pass as `train(..., loss_fn=...)`."""
    logits = getattr(model, "classify", model)(inputs, **forward_kwargs)
    return F.cross_entropy(logits.float(), labels)
