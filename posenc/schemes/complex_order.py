"""Complex-order embeddings (Wang et al., ICLR 2020) and a complex-valued Transformer.

Word j at position pos gets, in every dimension k, one complex number

    f(j, pos)_k = r_{j,k} exp(i (w_{j,k} pos + theta_{j,k}))                     (complex order)

with a word-dependent amplitude r_j, frequency w_j and initial phase theta_j. It is
the general solution of the paper's two requirements (derived in chapter 10):
a position-free offset transform, f(j, pos + n) = exp(i w_j n) * f(j, pos), the same
map for every pos, and boundedness, |f(j, pos)_k| = |r_{j,k}| for every pos.

Two ways to use it, both here:

* `ComplexOrderTransformer`: the paper's model, complex-valued throughout (complex
  embedding, complex linear layers, layer norm, activations and attention), built on
  PyTorch complex tensors; the chapter's experiment trains it.
* the scheme registered as `complex`: the same embedding inside the package's *real*
  Transformer through the `embed` hook. The hook sees the word vector x_j, not the word
  id, so it reads x_j in R^D as D/2 complex numbers z_k = x_{2k} + i x_{2k+1} (the
  word's r e^{i theta}), gives the word the frequencies w_j = w_0 + W x_j (word-dependent
  because x_j is; `word_frequencies=False` keeps the shared w_0 = base^{-2k/D}), and
  returns the real 2x view (Re z_k, Im z_k) interleaved. With shared frequencies this is
  a rotation of the input by angle w_k pos: RoPE's rotation applied to the embedding.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, TypedDict

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..scheme import register
from ..scheme import PositionContext, Scheme

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..model import Transformer


# -- the embedding ------------------------------------------------------------------
def complex_order_embedding(amplitude: Tensor, frequency: Tensor,
                            phase: Tensor, positions: Tensor) -> Tensor:
    """f = r * exp(i (w * pos + theta)): r, w, theta [..., seq, D],
    positions [seq] -> complex [..., seq, D].

    Angles are computed in float32 at least (float64 if the inputs are
    float64).
    """
    if positions.dim() != 1 or positions.shape[0] != amplitude.shape[-2]:
        raise ValueError(f"positions must be 1-D [seq={amplitude.shape[-2]}]; "
                         f"got {tuple(positions.shape)}")
    if amplitude.is_complex() or frequency.is_complex() or phase.is_complex():
        raise TypeError("amplitude, frequency and phase must be real tensors")
    dtype = torch.promote_types(amplitude.dtype, torch.float32)
    # (..., T, D)
    angle = (frequency.to(dtype) * positions.to(dtype)[:, None]
             + phase.to(dtype))
    return torch.polar(amplitude.to(dtype), angle)              # r e^{i angle}


def shared_frequencies(dim: int, base: float = 10000.0) -> Tensor:
    """w_k = base^{-2k/(2 dim)}, k < dim: the sinusoidal frequencies of a 2*dim real table."""
    if not isinstance(dim, int) or dim < 1:
        raise ValueError(f"dim must be a positive int; got {dim!r}")
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not 1 < base < math.inf:
        raise ValueError(f"base must be a finite number > 1; got {base!r}")
    return base ** (-torch.arange(dim, dtype=torch.float64) / dim).float()           # (dim,)


#: How each of the word's three tables is stored (Wang et al. 2020, Section 3.1 and Table 4):
#: "per-word" a [vocab, D] table, x_{j,d} (every word, every dimension: the unshared embedding);
#: "word-sharing" one [D] vector for all words, x_{.,d} (the paper's word-sharing schema);
#: "dimension-sharing" one number per word for all its dimensions, x_{j,.} (dimension-sharing schema);
#: and for the phase only, "zero": theta = 0, no parameter (the paper's default "shared constant value").
SHARING = ("per-word", "word-sharing", "dimension-sharing")
PHASE_SHARING = SHARING + ("zero",)


class ComplexOrderEmbedding(nn.Module):
    """Word id -> f(j, pos) in C^dim, with per-word amplitude, frequency and phase tables.

    Initialisation: every word's frequencies start at the sinusoidal w_k = base^{-k/dim}
    (the authors' released code: base^{-2 floor(k/2)/dim}, each value twice), phases at 0, so at step 0 the real and
    imaginary parts are the word amplitude times the cos and sin columns of the
    sinusoidal table. `order=False` freezes w = 0: a complex word vector with no
    position (the paper's "complex vanilla" ablation).

    Parameter sharing (`amplitude`, `frequency`, `phase`: one of `SHARING`, and "zero" for
    the phase) replaces a [vocab, dim] table by its shared part, [1, dim] ("word-sharing":
    the same vector for every word) or [vocab, 1] ("dimension-sharing": one number per word),
    broadcast to [..., dim] on lookup. The shared part is the first row or column of the
    table the default would have drawn (a N(0, 1) amplitude, the sinusoidal frequencies,
    whose first column is w_0 = 1, zero phases), so every variant consumes the same random
    numbers and a seed gives the same Transformer blocks in all of them. The default
    ("per-word" for all three) is the unshared embedding with 3 * vocab * dim parameters.
    """

    def __init__(self, vocab_size: int, dim: int, *, base: float = 10000.0, order: bool = True,
                 amplitude: str = "per-word", frequency: str = "per-word", phase: str = "per-word"):
        for arg, value, allowed in (("amplitude", amplitude, SHARING), ("frequency", frequency, SHARING),
                                    ("phase", phase, PHASE_SHARING)):
            if value not in allowed:
                raise ValueError(f"{arg} must be one of {allowed}; got {value!r}")
        super().__init__()
        self.dim = dim
        self.sharing = {"amplitude": amplitude, "frequency": frequency, "phase": phase}
        self.amplitude = nn.Embedding(vocab_size, dim)                               # r_j
        self.phase = nn.Embedding(vocab_size, dim)                                   # theta_j
        self.frequency = nn.Embedding(vocab_size, dim)                               # w_j
        nn.init.normal_(self.amplitude.weight, std=1.0)
        nn.init.zeros_(self.phase.weight)
        with torch.no_grad():
            self.frequency.weight.copy_(shared_frequencies(dim, base).expand(vocab_size, dim) * order)
        self.frequency.weight.requires_grad_(order)
        for name, mode in self.sharing.items():                                      # the shared part of a table
            if mode == "zero":
                setattr(self, name, None)
            elif mode != "per-word":
                full = getattr(self, name).weight.detach()
                part = full[:1] if mode == "word-sharing" else full[:, :1]           # (1, dim) or (vocab, 1)
                table = nn.Embedding(part.shape[0], part.shape[1], _weight=part.clone())   # draws no random numbers
                table.weight.requires_grad_(name != "frequency" or order)
                setattr(self, name, table)

    def lookup(self, name: str, tokens: Tensor) -> Tensor:
        """The word's `name` ("amplitude", "frequency" or "phase") values, [B, T, dim] (shared parts broadcast)."""
        table, mode = getattr(self, name), self.sharing[name]
        if table is None:                                                            # phase "zero"
            return self.amplitude.weight.new_zeros(()).expand(*tokens.shape, self.dim)
        values = table(torch.zeros_like(tokens) if mode == "word-sharing" else tokens)
        return values if mode == "per-word" else values.expand(*tokens.shape, self.dim)

    def forward(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """tokens [B, T] long, positions [T] -> complex [B, T, dim]."""
        return complex_order_embedding(self.lookup("amplitude", tokens),
                                       self.lookup("frequency", tokens),
                                       self.lookup("phase", tokens), positions)


# -- the scheme for the shared real model ------------------------------------------
@register("complex")
class ComplexOrder(Scheme):
    """embed: x -> real view of z * exp(i w(x) pos), z_k = x_{2k} + i x_{2k+1} (see module docstring).

    Args:
        base: sets the initial frequencies w_0 = base^{-2k/d_model}.
        word_frequencies: add the word-dependent part W x_j to the frequencies.
    """

    def __init__(self, *, d_model: int, n_heads: int, n_layers: int, max_len: int, causal: bool,
                 base: float = 10000.0, word_frequencies: bool = True):
        if d_model % 2:
            raise ValueError(f"d_model must be even for the complex scheme (pairs are complex numbers); got {d_model}")
        if not isinstance(word_frequencies, bool):       # "no" would be truthy
            raise TypeError(f"word_frequencies must be True or False; got {word_frequencies!r}")
        super().__init__(d_model=d_model, n_heads=n_heads, n_layers=n_layers, max_len=max_len, causal=causal)
        self.freq = nn.Parameter(shared_frequencies(d_model // 2, base))             # w_0: (D/2,)
        self.word_freq = nn.Linear(d_model, d_model // 2, bias=False) if word_frequencies else None

    def frequencies(self, x: Tensor) -> Tensor:
        """w_j = w_0 (+ W x_j): [B, T, D/2]."""
        w = self.freq.expand(*x.shape[:-1], -1)
        return w if self.word_freq is None else w + self.word_freq(x)

    def embed(self, x: Tensor, ctx: PositionContext) -> Tensor:
        # (B, T, D/2) r e^{i theta}
        z = torch.view_as_complex(
            x.float().unflatten(-1, (-1, 2)).contiguous())
        # (B, T, D/2) w_j pos
        angle = self.frequencies(x).float() * ctx.positions.float()[:, None]
        rotated = z * torch.polar(torch.ones_like(angle), angle)  # f(j, pos)
        # (B, T, D) interleaved
        return torch.view_as_real(rotated).flatten(-2).to(x.dtype)


# -- complex layers -------------------------------------------------------------------
class ComplexLinear(nn.Module):
    """y = x W^T + b with W = A + iB, b complex; A, B stored as real parameters.

    Initialisation: Re and Im of W ~ N(0, 1/(2 d_in)), so E|W_ij|^2 = 1/d_in.
    """

    def __init__(self, d_in: int, d_out: int, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(2, d_out, d_in) / math.sqrt(2 * d_in))   # (re|im, out, in)
        self.bias = nn.Parameter(torch.zeros(2 * d_out)) if bias else None          # (out*[re, im],) 1-D: no decay

    def forward(self, x: Tensor) -> Tensor:
        w = torch.complex(self.weight[0], self.weight[1])
        b = None if self.bias is None else torch.view_as_complex(self.bias.view(-1, 2))
        return F.linear(x, w, b)


class ComplexLayerNorm(nn.Module):
    """(z - mean z) / sqrt(mean |z - mean z|^2 + eps) * gamma + beta, gamma real, beta complex."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.ones(dim))
        self.beta = nn.Parameter(torch.zeros(2 * dim))                               # (dim*[re, im],)

    def forward(self, z: Tensor) -> Tensor:
        z = z - z.mean(-1, keepdim=True)
        z = z * torch.rsqrt(z.abs().square().mean(-1, keepdim=True) + self.eps)
        return z * self.gamma + torch.view_as_complex(self.beta.view(-1, 2))


def complex_gelu(z: Tensor) -> Tensor:
    """Split activation: GELU(Re z) + i GELU(Im z) (Trabelsi et al. 2018's split type)."""
    return torch.complex(F.gelu(z.real), F.gelu(z.imag))


class ComplexAttention(nn.Module):
    """Complex multi-head self-attention, real softmax weights, complex values.

        s_ij = q_i . conj(k_j)                    (complex, [B, H, T, T])
        a_ij = |s_ij| / sqrt(d_h)   (score="modulus"; the authors' released code takes |q_i . k_j|,
                                     without the conjugate, in which the phases add)
             = Re s_ij / sqrt(d_h)  (score="real": the real inner product of the 2x views)
        o_i  = sum_j softmax_j(a_ij) v_j
    """

    def __init__(self, dim: int, n_heads: int, score: str = "modulus"):
        super().__init__()
        if dim % n_heads:
            raise ValueError(f"dim={dim} must be divisible by n_heads={n_heads}")
        if score not in ("modulus", "real"):
            raise ValueError(f"score must be 'modulus' or 'real'; got {score!r}")
        self.n_heads, self.score = n_heads, score
        self.qkv = ComplexLinear(dim, 3 * dim, bias=False)
        self.out = ComplexLinear(dim, dim, bias=False)

    def weights(self, q: Tensor, k: Tensor) -> Tensor:
        """Softmax attention weights [B, H, T, T] (real)
        from complex q, k [B, H, T, Dh]."""
        s = q @ k.conj().transpose(-2, -1)              # (B, H, T, T) complex
        a = ((s.abs() if self.score == "modulus" else s.real)
             / math.sqrt(q.shape[-1]))
        return a.softmax(-1)

    def forward(self, z: Tensor, need_weights: bool = False):
        B, T, D = z.shape
        q, k, v = self.qkv(z).view(B, T, 3, self.n_heads, D // self.n_heads).permute(2, 0, 3, 1, 4)  # 3 x (B,H,T,Dh)
        probs = self.weights(q, k)                                                   # (B, H, T, T)
        y = (probs.to(v.dtype) @ v).transpose(1, 2).reshape(B, T, D)               # (B, T, D) complex
        return self.out(y), (probs if need_weights else None)


class ComplexBlock(nn.Module):
    """Pre-LN block: z + Attn(LN z), then z + W_2 GELU_split(W_1 LN z), all complex."""

    def __init__(self, dim: int, n_heads: int, d_ff: int, score: str):
        super().__init__()
        self.ln1, self.ln2 = ComplexLayerNorm(dim), ComplexLayerNorm(dim)
        self.attn = ComplexAttention(dim, n_heads, score)
        self.ff1, self.ff2 = ComplexLinear(dim, d_ff), ComplexLinear(d_ff, dim)

    def forward(self, z: Tensor, need_weights: bool = False):
        a, probs = self.attn(self.ln1(z), need_weights)
        z = z + a
        return z + self.ff2(complex_gelu(self.ff1(self.ln2(z)))), probs


class ComplexOrderTransformer(nn.Module):
    """The paper's complex-valued Transformer encoder for sequence classification.

    tokens -> complex-order embedding -> `n_layers` complex blocks -> complex LN ->
    mean over positions -> [Re, Im] -> real linear classifier. Training runs in
    complex64 even under autocast (there is no complex bfloat16).

    Args:
        order: use the position phases (False: the complex vanilla ablation, no position).
        score: attention score, "modulus" or "real" (see `ComplexAttention`).
        amplitude, frequency, phase: parameter sharing of the embedding's tables (`ComplexOrderEmbedding`;
            default "per-word" for all three, phase="zero" drops the phase as the paper's Table 4 does).
    """

    causal = False  # an encoder: train() reads this flag

    def __init__(self, vocab_size: int, num_classes: int, *, d_model: int = 64, n_heads: int = 4, n_layers: int = 1,
                 d_ff: int | None = None, base: float = 10000.0, order: bool = True, score: str = "modulus",
                 amplitude: str = "per-word", frequency: str = "per-word", phase: str = "per-word"):
        super().__init__()
        for arg, value in (("vocab_size", vocab_size), ("num_classes", num_classes), ("d_model", d_model),
                           ("n_heads", n_heads), ("n_layers", n_layers)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{arg} must be a positive int; got {value!r}")
        self.vocab_size = vocab_size
        self.embed = ComplexOrderEmbedding(vocab_size, d_model, base=base, order=order, amplitude=amplitude,
                                           frequency=frequency, phase=phase)
        self.blocks = nn.ModuleList(ComplexBlock(d_model, n_heads, d_ff or 4 * d_model, score) for _ in range(n_layers))
        self.ln_f = ComplexLayerNorm(d_model)
        self.classifier = nn.Linear(2 * d_model, num_classes)

    def hidden_states(self, tokens: Tensor, positions: Tensor | None = None, need_weights: bool = False):
        """Complex final states [B, T, d_model] and the attention weights of every layer."""
        if not isinstance(tokens, Tensor) or tokens.dtype != torch.long or tokens.dim() != 2:
            raise TypeError(f"tokens must be a long tensor [batch, seq]; got {getattr(tokens, 'dtype', type(tokens))}")
        if positions is None:
            positions = torch.arange(tokens.shape[1], device=tokens.device)
        with torch.autocast(tokens.device.type, enabled=False):
            z = self.embed(tokens, positions)                                        # (B, T, D) complex
            maps = []
            for block in self.blocks:
                z, probs = block(z, need_weights)
                maps.append(probs)
            return self.ln_f(z), maps

    def classify(self, tokens: Tensor, positions: Tensor | None = None) -> Tensor:
        """Class logits [B, num_classes] from the mean complex state, read as [Re, Im]."""
        h, _ = self.hidden_states(tokens, positions)
        pooled = h.mean(1)                                                           # (B, D) complex
        return self.classifier(torch.cat([pooled.real, pooled.imag], -1).float())

    forward = classify

    @torch.no_grad()
    def attention_maps(self, tokens: Tensor, positions: Tensor | None = None) -> list[Tensor]:
        return self.hidden_states(tokens, positions, need_weights=True)[1]


def xavier_init_(model: Transformer) -> Transformer:
    """Re-initialise a real `posenc.Transformer` as the Annotated Transformer does.

    Token embeddings ~ N(0, 1) (Vaswani et al.'s sqrt(d)-scaled embedding) and every
    linear layer of the blocks and the classifier Xavier-uniform, so the real baselines
    start at the same scale as `ComplexOrderTransformer` (whose `ComplexLinear` has
    E|W_ij|^2 = 1/d_in). The scheme's own parameters are left as the scheme made them.
    """
    nn.init.normal_(model.tok.weight, std=1.0)
    for module in [*model.blocks.modules(), *filter(None, [model.classifier])]:
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
    return model


#: Keyword arguments that put a real scheme's positions on the N(0, 1) scale of `xavier_init_`'s tokens.
UNIT_SCALE: dict[str, dict[str, Any]] = {"sinusoidal": {"scale": 1.0}, "learned": {"init_std": 1.0}}


class Sharing(TypedDict, total=False):
    """What each part of a complex model's embedding shares (`ComplexOrderEmbedding`): one of `SHARING`,
    and "zero" for the phase."""
    amplitude: str
    frequency: str
    phase: str


def build_classifier(name: str, vocab_size: int, num_classes: int, *, d_model: int, n_heads: int, n_layers: int,
                     max_len: int, **sharing: Unpack[Sharing]) -> nn.Module:
    """A sequence classifier for the chapter's comparison, all with mean pooling and Xavier-scale init.

    name: "complex-order" (`ComplexOrderTransformer`, d_model/2 complex dims, so the same
    d_model real numbers per token), "complex-vanilla" (the same with no position), or
    any name in `posenc.SCHEMES` (the real `posenc.Transformer` with that scheme,
    re-initialised by `xavier_init_`, with `UNIT_SCALE` for sinusoidal and learned).
    sharing: amplitude=, frequency=, phase= of the complex models' embedding (`ComplexOrderEmbedding`),
    e.g. phase="zero", frequency="word-sharing"; a run spec's `model` carries them only when set.
    """
    unknown = sorted(set(sharing) - {"amplitude", "frequency", "phase"})
    if unknown:
        raise TypeError(f"build_classifier got unknown keyword arguments {unknown}; "
                        f"the complex models take amplitude, frequency and phase")
    if name in ("complex-order", "complex-vanilla"):
        return ComplexOrderTransformer(vocab_size, num_classes, d_model=d_model // 2, n_heads=n_heads,
                                       n_layers=n_layers, order=name == "complex-order", **sharing)
    if sharing:
        raise ValueError(f"amplitude, frequency and phase sharing apply to complex-order and complex-vanilla only; "
                         f"got {sorted(sharing)} for {name!r}")
    from ..model import build_model
    model = build_model(name, vocab_size, d_model=d_model, n_heads=n_heads, n_layers=n_layers, causal=False,
                        max_len=max_len, num_classes=num_classes, **UNIT_SCALE.get(name, {}))
    return xavier_init_(model)
