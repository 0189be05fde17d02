"""Multi-head self-attention with one hook for each place position can enter.

    a_ij = scale * <q_i, k_j> + b_ij + b^l_ij + e_ij,   o_i = sum_j softmax_j(a_ij) v_j + u_i

with (q_i, k_j) possibly rotated by `Scheme.layer_transform_qk` (by default the same
`Scheme.transform_qk` in every layer), b the layer-shared
`Scheme.logit_bias` merged with the causal mask (`PositionContext.attn_mask`), b^l the
per-layer `Scheme.layer_logit_bias`, e the per-layer `Scheme.extra_logits` and u the
per-layer `Scheme.extra_values`.
When u is absent the computation is PyTorch's `scaled_dot_product_attention`, with three
exceptions: schemes that add to the values, or a caller asking for the attention weights,
take the explicit softmax path; seeds stacked under `vmap` with a bias take it too (SDPA
fails there on CUDA); and on the CPU a bias that learns, under gradients, takes SDPA's own
math path written out (`learned_bias_attention`: the fused CPU kernel gives no gradient for
a mask). When the model chose FlexAttention for a bias scheme (`PositionContext.score_mod`,
see `Transformer.context`), b comes from the scheme's `score_mod` inside the kernel and no
[H, N, N] bias exists.
"""
from __future__ import annotations

import copy
import functools
import math
from typing import TypeGuard, overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .compiled import CompiledOrEager
from .scheme import PositionContext, Scheme


def check_sizes(**sizes) -> None:
    """ValueError naming each of `sizes` (d_model=..., n_heads=...) that is not a positive int; and unless
    n_heads divides d_model when both are given. None is allowed for d_ff and num_classes (their defaults)."""
    for arg, value in sizes.items():
        if value is None and arg in ("d_ff", "num_classes"):
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{arg} must be a positive int{' or None' if arg in ('d_ff', 'num_classes') else ''}; "
                             f"got {value!r}")
    if "d_model" in sizes and "n_heads" in sizes and sizes["d_model"] % sizes["n_heads"]:
        raise ValueError(f"d_model={sizes['d_model']} must be divisible by n_heads={sizes['n_heads']}")


def check_dropout(dropout) -> None:
    """ValueError naming `dropout` unless it is a number in [0, 1)."""
    if not isinstance(dropout, (int, float)) or isinstance(dropout, bool) or not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be a number in [0, 1); got {dropout!r}")


class Attention(nn.Module):
    """One multi-head attention layer, the `layer`-th of a model, with every position hook of the module docstring.

    q, k, v = x W_qkv (one [d_model, 3 d_model] projection, no bias), split into `n_heads` heads of
    d_h = d_model / n_heads; the output is concat_h(o^h) W_out. The scheme and its `PositionContext`
    come with each call (`forward`), so one layer serves any scheme::

        attn = Attention(512, 8, layer=0)
        ctx = PositionContext(torch.arange(T), causal=True)
        y, _ = attn(x, scheme, ctx)                # x, y [B, T, 512]

    `layer` picks the scheme's per-layer parameters (FLOATER's and DeBERTa's inputs, KERPLE's and FIRE's
    biases, CoPE's tables); `dropout` is applied to the attention weights while training.
    """

    def __init__(self, d_model: int, n_heads: int, layer: int, dropout: float = 0.0):
        super().__init__()
        check_sizes(d_model=d_model, n_heads=n_heads)
        check_dropout(dropout)
        if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
            raise ValueError(f"layer must be an int >= 0 (which block of the model this is); got {layer!r}")
        self.n_heads, self.layer, self.dropout = n_heads, layer, dropout
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x: Tensor, scheme: Scheme, ctx: PositionContext,
                need_weights: bool = False, memory: Tensor | None = None,
                kv: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """x [B, T, D] -> ([B, T, D], weights or None); `memory` [B, M, D]
        adds M earlier keys/values (XL); `kv` [B, T, D] gives the keys and
        values while x gives only the queries (a decoder pass).

        `ctx` as `Transformer.context` builds it. A context built by hand
        (`PositionContext(positions, causal)`) is filled in a copy at every
        call, the scheme's tables and its shared bias merged with the causal
        mask (`merge_mask`), and the caller's stays as given: it can serve
        another scheme or the next step."""
        if not ctx.ready:
            _check_hand_built(self.layer, x, scheme, ctx, memory, kv)
            ctx = _filled(scheme, ctx, memory)
        B, T, D = x.shape
        # a RoPE for other heads rotates part of each
        if scheme.n_heads != self.n_heads or scheme.d_model != D:
            scheme.check_fits("Attention", n_heads=self.n_heads, d_model=D)
        if memory is not None and kv is not None:
            raise ValueError("pass memory or kv, not both")
        source = kv if kv is not None else x
        if memory is not None:  # Transformer-XL: keys = [memory; x]
            source = torch.cat([memory, x], 1)  # (B, M+T, D)
        q, k, v = self.qkv(source).view(
            B, source.shape[1], 3, self.n_heads, D // self.n_heads
        ).permute(2, 0, 3, 1, 4)
        if kv is not None:  # queries from x, with the same W_q
            q = F.linear(x, self.qkv.weight[:D]).view(
                B, T, self.n_heads, D // self.n_heads
            ).transpose(1, 2)
        q = q[:, :, -T:]  # 3 x (B, H, T or M+T, Dh)
        # hook 2: rotate q, k (this layer's way)
        q, k = scheme.layer_transform_qk(q, k, ctx, self.layer)
        mask = ctx.attn_mask  # hook 3: (H|1, T, T) bias + causal mask, or None
        # hook 3b: (H|1, T, T) per layer, or None
        layer_bias = scheme.layer_logit_bias(ctx, self.layer)
        if layer_bias is not None:
            mask = layer_bias if mask is None else mask + layer_bias
        # hook 4: (B, H, T, T) or None
        extra = scheme.extra_logits(q, k, ctx, self.layer)
        if extra is not None:
            mask = extra if mask is None else mask + extra
        scale, p = scheme.logit_scale(), self.dropout if self.training else 0.0
        causal_only = mask is None and ctx.causal
        if (ctx.score_mod is not None and mask is None
                and not (need_weights or scheme.uses_extra_values)):
            y, probs = flex_attention(
                q, k, v, score_mod=ctx.score_mod,
                block_mask=ctx.block_mask, scale=scale), None
        elif need_weights or scheme.uses_extra_values:
            y, probs = explicit_attention(
                q, k, v, mask, scale, causal_only,
                0.0 if scheme.uses_extra_values else p)
            weights = probs
            # one dropped set of weights for both terms
            if scheme.uses_extra_values and p:
                weights = F.dropout(probs, p)
                y = weights @ v
            # hook 4: (B, H, T, Dh) or None
            u = scheme.extra_values(weights, ctx, self.layer)
            y = y if u is None else y + u
        elif _stacked(q) and not causal_only:
            # seeds under vmap: SDPA fails there on CUDA
            y, probs = explicit_attention(
                q, k, v, _cast(mask, q), scale, False, p)[0], None
        elif (q.device.type == "cpu" and _learns(mask)
                and torch.is_grad_enabled() and not p):
            # SDPA's math path, leaner
            y, probs = learned_bias_attention(
                q, k, v, _cast(mask, q), scale), None
        else:
            y, probs = F.scaled_dot_product_attention(
                q, k, v, attn_mask=_cast(mask, q), dropout_p=p,
                is_causal=causal_only, scale=scale), None
        y = y.transpose(1, 2).reshape(B, T, D)  # (B, T, D)
        return self.out(y), probs


def _check_hand_built(layer: int, x, scheme: Scheme, ctx: PositionContext, memory, kv) -> None:
    """What a context built by hand must agree on with the layer's input and its scheme (a model's own
    context, `Transformer.context`, agrees by construction): a ValueError or TypeError naming the argument,
    where a mismatch would otherwise give a silent wrong answer or fail deep inside a kernel."""
    if not isinstance(scheme, Scheme):
        raise TypeError(f"scheme must be a posenc Scheme; got {type(scheme).__name__}")
    if not isinstance(x, Tensor) or x.dim() != 3:
        raise ValueError(f"x must be a [batch, seq, d_model] tensor; got "
                         f"{tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__}")
    if scheme.input_only():
        hooks = [h for h in scheme.overridden_hooks() if h != "prepare"]
        raise ValueError(f"{type(scheme).__name__} adds position to the layer's input "
                         f"({', '.join(hooks)}), not inside attention: in one "
                         f"Attention layer it would be position-free, the same as NoPE. Apply its "
                         f"`embed`/`layer_input` to x yourself and give this layer a NoPE built like it "
                         f"(posenc.SCHEMES['nope'](d_model=..., n_heads=..., ...)), or "
                         f"build a whole model with posenc.build_model")
    if ctx.causal != scheme.causal:
        raise ValueError(f"ctx.causal={ctx.causal} but the scheme was built with causal={scheme.causal}: its "
                         f"tables and biases assume the other masking")
    if layer >= scheme.n_layers:
        raise ValueError(f"layer={layer} but the scheme has per-layer parameters for n_layers={scheme.n_layers} "
                         f"(layers 0 to {scheme.n_layers - 1})")
    if memory is None and kv is None and ctx.seq_len != x.shape[1]:
        raise ValueError(f"ctx.positions has {ctx.seq_len} positions but x has {x.shape[1]} tokens: one "
                         f"position per token")


def _filled(scheme: Scheme, ctx: PositionContext, memory) -> PositionContext:
    """A copy of a hand-built `ctx` with the scheme's tables (unless the caller set some) and the merged mask."""
    if memory is not None and getattr(ctx, "key_positions", None) is None:
        raise ValueError("memory needs a context whose keys include it: a posenc.model.SegmentContext with "
                         "key_positions (the memory's positions, then the segment's), or Transformer.context")
    ctx = copy.copy(ctx)
    if not ctx.tables:
        ctx.tables = scheme.prepare(ctx)
    return merge_mask(scheme, ctx)


def merge_mask(scheme: Scheme, ctx: PositionContext) -> PositionContext:
    """Set ctx.attn_mask = b + M once for all layers, mark ctx ready and return it.

    b is the scheme's shared bias (hook 3, `Scheme.logit_bias`), or the mask a caller set in ctx.attn_mask;
    M is the causal mask (`causal_mask`: 0 where key j <= query i, right-aligned to the keys; -inf after),
    added when the model is causal and the mask must be explicit: there is a bias, per-layer terms (hooks 3b
    and 4: `Scheme.custom_attention`) will be added to it, or the keys outnumber the queries (a memory).
    Otherwise ctx.attn_mask stays None, and a causal model takes SDPA's `is_causal`.
    """
    bias = scheme.logit_bias(ctx) if ctx.attn_mask is None else ctx.attn_mask
    keys = getattr(ctx, "key_positions", None)
    k_len = ctx.seq_len if keys is None else keys.shape[0]
    if ctx.causal and (bias is not None or scheme.custom_attention or k_len != ctx.seq_len):
        mask = causal_mask(ctx.seq_len, k_len, ctx.positions.device)
        bias = mask if bias is None else bias + mask
    ctx.attn_mask, ctx.ready = bias, True
    return ctx


#: The smallest head dimension for which the CPU runs FlexAttention's compiled kernel. Below it, PyTorch's
#: compiled CPU kernel can be silently wrong: on an AVX2 machine (torch 2.13) heads of 8 and 16 dimensions
#: came out 0.69 off and NaN against SDPA while 32 and 64 agreed to 1e-6 (NATTEN's maintainers found the
#: same below 32). The eager kernel is right at every size.
FLEX_CPU_MIN_HEAD_DIM = 32


def flex_attention(q, k, v, *, score_mod, block_mask, scale):
    """PyTorch's FlexAttention, compiled once per process into its fused kernel. Where it cannot be
    compiled (a CPU machine without a C++ compiler, say) it warns once and uses the eager kernel, as it
    does on the CPU for heads narrower than `FLEX_CPU_MIN_HEAD_DIM`."""
    if q.device.type == "cpu" and q.shape[-1] < FLEX_CPU_MIN_HEAD_DIM:
        return _eager_flex()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)
    return _FLEX(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale)


def _eager_flex():
    from torch.nn.attention.flex_attention import flex_attention as eager
    return eager


_FLEX = CompiledOrEager(_eager_flex, "FlexAttention")


def causal_block_mask(q_len: int, k_len: int, device):
    """FlexAttention's block mask for causal attention, right-aligned like `causal_mask`.

    Built once per (q_len, k_len, device) and reused (a `BlockMask` is never modified): every
    forward of a bias scheme on the FlexAttention path needs it, and building it is a few
    kernels that a training step at a fixed length would otherwise repeat."""
    return _causal_block_mask(int(q_len), int(k_len), torch.device(device))


@functools.lru_cache(maxsize=32)
def _causal_block_mask(q_len: int, k_len: int, device: torch.device):
    from torch.nn.attention.flex_attention import create_block_mask
    offset = k_len - q_len

    def causal(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset
    return create_block_mask(causal, B=None, H=None, Q_LEN=q_len, KV_LEN=k_len, device=device)


def learned_bias_attention(q, k, v, mask: Tensor, scale: float) -> Tensor:
    """softmax(q k^T * scale + mask) v [B, H, Tq, Dh] as PyTorch's math SDPA computes it, minus one pass.

    On the CPU, SDPA's fused kernel gives no gradient for a mask, so a bias that learns (T5,
    KERPLE, FIRE) goes through its math path: q and k each times sqrt(scale), q k^T, the mask
    added in place, then `_safe_softmax`, which also reads every score to zero the rows whose
    keys are all masked (-inf). No row here is (every query sees at least itself), and that
    read (isneginf, all, where over [B, H, Tq, Tk]) was about 8% of such a training step.
    Otherwise the same operations: the same numbers and gradients, bit for bit
    (`tests/test_model.py::test_the_learned_bias_path_is_sdpas_math_path_bit_for_bit`).
    """
    root = math.sqrt(scale)
    scores = (q * root) @ (k.transpose(-2, -1) * root)             # (B, H, Tq, Tk)
    scores.add_(mask)
    return scores.softmax(-1) @ v


def explicit_attention(q, k, v, mask, scale, is_causal=False, dropout_p=0.0):
    """softmax(q k^T * scale + mask) v with the weights returned; same contract as SDPA."""
    scores = (q @ k.transpose(-2, -1)) * scale                    # (B, H, Tq, Tk)
    if is_causal:
        scores = scores + causal_mask(q.shape[-2], k.shape[-2], q.device)
    if mask is not None:
        scores = scores + mask
    probs = scores.float().softmax(-1).to(q.dtype)
    return F.dropout(probs, dropout_p) @ v, probs


def causal_mask(q_len: int, k_len: int, device=None) -> Tensor:
    """Float mask (q_len, k_len): 0 where key j <= query i (right-aligned), -inf after.

    The queries are the last q_len of the k_len keys' positions, so q_len <= k_len (more queries would
    leave the first ones no key to attend to, and softmax over a row of -inf has no value)."""
    for arg, value in (("q_len", q_len), ("k_len", k_len)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{arg} must be an int >= 0; got {value!r}")
    if q_len > k_len:
        raise ValueError(f"q_len={q_len} > k_len={k_len}: the first {q_len - k_len} queries would have no key "
                         f"(the queries are the last q_len positions of the keys)")
    i = torch.arange(q_len, device=device)[:, None] + (k_len - q_len)
    j = torch.arange(k_len, device=device)[None, :]
    return torch.zeros(q_len, k_len, device=device).masked_fill(j > i, float("-inf"))


def _stacked(q: Tensor) -> bool:
    """Whether q is batched by `torch.func.vmap`: seeds trained as one stacked model (`posenc.runs.stacked`).

    There, attention with a mask or without causality takes `explicit_attention` (plain matmuls and a float32
    softmax, which vmap and autograd batch like any op), not SDPA: on the H200 (torch 2.11, bf16 autocast,
    2026-12-04) SDPA's math kernel under vmap gave every such stacked group (ALiBi, T5, DeBERTa, ViTs, ...) a
    softmax whose backward saw two dtypes ("expected input and grad types to match"). The causal, unmasked
    case stays on SDPA: it trained stacked there, 1.24x faster than seed by seed with the same losses."""
    return torch._C._functorch.is_batchedtensor(q)


def _learns(mask: Tensor | None) -> TypeGuard[Tensor]:
    """Whether a bias needs a gradient. (Under `torch.func.vmap`, where `requires_grad` reads False on the
    wrapper, q is batched too and attention takes the explicit path before this is asked: `_stacked`.)"""
    return mask is not None and mask.requires_grad


@overload
def _cast(mask: Tensor, like: Tensor) -> Tensor: ...
@overload
def _cast(mask: None, like: Tensor) -> None: ...
@overload
def _cast(mask: Tensor | None, like: Tensor) -> Tensor | None: ...


def _cast(mask: Tensor | None, like: Tensor) -> Tensor | None:
    """The mask in q's dtype and 4-D: PyTorch's CPU SDPA takes its fused (flash) kernel only
    for a 4-D float mask; a 3-D one silently falls back to the math path, which keeps the
    [B, H, T, T] weights for backward."""
    if mask is None:
        return None
    return mask.to(like.dtype).reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
