"""Absolute positional encodings added to (or multiplied into) the input (hook `embed`).

Sinusoidal table (Vaswani et al. 2017, section 3.5), interleaved layout:

    PE(p, 2i)   = sin(p / base^(2i/d))
    PE(p, 2i+1) = cos(p / base^(2i/d)),     i = 0 .. d/2 - 1

Schemes (all act once, on the token embeddings x_i, before the first block):

    learned         h_i = x_i + P[i]           P: trainable [max_len, d]   (Gehring et al. 2017; BERT, GPT)
    sinusoidal      h_i = x_i + s * PE(i)      s: learnable scalar (see `Sinusoidal`)
    multiplicative  h_i = x_i * M[i]           M: trainable [max_len, d], init near 1

Scale. The model initialises token embeddings N(0, 0.02) (GPT-2). A learned table
gets the same N(0, 0.02) init, so content and position start at equal size. The
sinusoidal table has entries of RMS 1/sqrt(2) ~ 0.71, 35x the tokens: added as is it
would drown the content, which is why Vaswani et al. multiply the token embeddings by
sqrt(d). We keep the model untouched and put the remedy in the scheme: a learnable
scalar s (as x-transformers' `ScaledSinusoidalEmbedding`) initialised so that s * PE
has the tokens' RMS, 0.02.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..scheme import register
from ..scheme import PositionContext, Scheme

TOKEN_INIT_STD = 0.02  # std of the model's token embeddings (posenc.model._init_weights)
OVERFLOW = ("error", "clamp")


def sinusoidal_angles(positions: Tensor, dim: int,
                      base: float = 10000.0) -> Tensor:
    """theta[p, i] = p / base^(2i/dim): [len(positions), dim/2], float64
    then float32-safe."""
    if not isinstance(dim, int) or dim < 2 or dim % 2:
        raise ValueError(f"dim must be a positive even int; got {dim!r}")
    if isinstance(base, bool) or not (isinstance(base, (int, float))
                                      and 1 < base < float("inf")):
        raise ValueError(f"base must be a finite number > 1; got {base!r}")
    # (dim/2,)
    inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64,
                                      device=positions.device) / dim)
    # (P, dim/2)
    return positions.to(torch.float64)[:, None] * inv_freq[None, :]


def sinusoidal_table(num_positions: int, dim: int, base: float = 10000.0) -> Tensor:
    """The [num_positions, dim] float32 table, interleaved as in Vaswani et al.::

        PE[p, 2i] = sin(p / base^(2i/dim)),   PE[p, 2i + 1] = cos(p / base^(2i/dim))

    (contract)."""
    if isinstance(num_positions, bool) or not isinstance(num_positions, int) or num_positions < 0:
        raise ValueError(f"num_positions must be a non-negative int; got {num_positions!r}")
    return sinusoidal_at(torch.arange(num_positions), dim, base)


def sinusoidal_at(positions: Tensor, dim: int,
                  base: float = 10000.0) -> Tensor:
    """PE at arbitrary (integer or fractional) positions:
    [len(positions), dim] float32."""
    angles = sinusoidal_angles(positions, dim, base)  # (P, dim/2)
    # (P, dim) interleaved
    return torch.stack([angles.sin(), angles.cos()], -1).flatten(-2).float()


def sinusoidal_shift_matrix(k: float, dim: int, base: float = 10000.0) -> Tensor:
    """M_k with PE(p + k) = M_k PE(p) for every p: block-diagonal 2x2 rotations [dim, dim].

    Per pair (sin, cos) at frequency w_i = base^(-2i/dim) (angle addition):
        [sin(w(p+k))]   [ cos wk   sin wk] [sin wp]
        [cos(w(p+k))] = [-sin wk   cos wk] [cos wp]
    """
    a = sinusoidal_angles(torch.tensor([float(k)]), dim, base)[0]                  # (dim/2,)
    c, s = a.cos(), a.sin()
    blocks = torch.stack([torch.stack([c, s], -1), torch.stack([-s, c], -1)], -2)  # (dim/2, 2, 2)
    return torch.block_diag(*blocks).float()                                        # (dim, dim)


def integer_positions(positions: Tensor, argument: str = "positions", minmax: tuple | None = None) -> Tensor:
    """Check that positions are non-negative integers (a table index); return them as long.

    `minmax`: their (min, max) when already known on the host (`PositionContext.minmax`); else read."""
    if positions.is_floating_point():
        if not torch.equal(positions, positions.round()):
            raise ValueError(f"{argument} must be integers for a table lookup; got fractional values")
        positions = positions.long()
    if minmax is None and positions.numel():
        minmax = (int(positions.min()), None)
    if minmax is not None and minmax[0] < 0:
        raise ValueError(f"{argument} must be >= 0 for a table lookup; got min {int(minmax[0])}")
    return positions


class _TableScheme(Scheme):
    """A trainable [max_len, d_model] table looked up at each (integer) position.

    Args:
        init_std: the standard deviation of the table's initial rows.
        overflow: "error" (default) raises for a position >= max_len; "clamp" reuses the
            last row, to measure what an overlong input does to a trained model.
    """

    init_mean = 0.0

    def __init__(self, *, init_std: float = TOKEN_INIT_STD, overflow: str = "error", **kw):
        super().__init__(**kw)
        if overflow not in OVERFLOW:
            raise ValueError(f"overflow must be one of {OVERFLOW}; got {overflow!r}")
        if isinstance(init_std, bool) or not isinstance(init_std, (int, float)) or not 0 < init_std < math.inf:
            raise ValueError(f"init_std must be a finite number > 0; got {init_std!r}")
        self.overflow, self.init_std = overflow, init_std
        self.table = nn.Parameter(torch.randn(self.max_len, self.d_model) * init_std + self.init_mean)

    def rows(self, ctx: PositionContext) -> Tensor:
        """P[positions]: [seq, d_model]; ValueError (naming max_len) past
        the table."""
        n = ctx.seq_len
        # consecutive positions: a view and a cheap backward, no host sync
        if (ctx.start is not None and 0 <= ctx.start
                and ctx.start + n <= self.max_len):
            return self.table.narrow(0, ctx.start, n)
        minmax = ctx.minmax()
        pos, high = (integer_positions(ctx.positions, minmax=minmax),
                     (minmax or (0, -1))[1])
        if high >= self.max_len:
            if self.overflow == "error":
                cls = (", a [CLS] token at position 0 included"
                       if ctx.has_cls else "")
                raise ValueError(
                    f"positions reach {int(high)}{cls}, "
                    f"but the learned table has {self.max_len} rows "
                    f"(positions 0 to {self.max_len - 1}); "
                    f"build with a larger max_len, "
                    f"extend it (posenc.absolute.extend_learned_table) "
                    f"or pass overflow='clamp'")
            pos = pos.clamp(max=self.max_len - 1)
        return self.table[pos]  # (T, D)


@register("learned")
class LearnedAbsolute(_TableScheme):
    """h_i = x_i + P[i], P trainable, init N(0, 0.02) like the tokens
    (Gehring et al. 2017, eq. in section 3.1).

    Args:
        init_std: the standard deviation of P's initial rows (0.02).
        overflow: "error" (default) raises for a position >= max_len; "clamp"
            reuses the last row, to measure what an overlong input does to a
            trained model.
    """

    def embed(self, x: Tensor, ctx: PositionContext) -> Tensor:
        return x + self.rows(ctx)  # (B, T, D)


@register("multiplicative")
class Multiplicative(_TableScheme):
    """h_i = x_i * M[i] (elementwise), M trainable, init N(1, init_std).

    Initialised around 1 so that h_i starts as the content x_i with a
    relative position modulation of size `init_std` (default 0.5); 0 would
    erase content.
    """

    init_mean = 1.0

    def __init__(self, *, init_std: float = 0.5, **kw):
        super().__init__(init_std=init_std, **kw)

    def embed(self, x: Tensor, ctx: PositionContext) -> Tensor:
        return x * self.rows(ctx)  # (B, T, D)


@register("sinusoidal")
class Sinusoidal(Scheme):
    """h_i = x_i + s * PE(i) (Vaswani et al. 2017, section 3.5), any
    (float) position.

    Args:
        base: the wavelength base (10000).
        scale: "learned" (default): a trainable scalar s, initialised to
            0.02 * sqrt(2) so that s * PE has RMS 0.02 like the token
            embeddings; a float: a fixed s (1.0 is the paper's table as is);
            or "vaswani": the paper's section 3.4, token embeddings
            multiplied by sqrt(d_model) and the table added as is,
            h_i = sqrt(d) x_i + PE(i). With the package's N(0, 0.02^2) token
            init the table's RMS (1/sqrt(2)) is then 1/(0.02 sqrt(2d)) times
            the tokens' (0.02 sqrt(d)): 3.1 times at d = 128.
    """

    def __init__(self, *, base: float = 10000.0,
                 scale: str | float = "learned", **kw):
        super().__init__(**kw)
        if self.d_model % 2:
            raise ValueError(f"d_model must be even for a sinusoidal table; "
                             f"got {self.d_model}")
        if (isinstance(base, bool) or not isinstance(base, (int, float))
                or not 1 < base < math.inf):
            raise ValueError(
                f"base must be a finite number > 1; got {base!r}")
        self.base = base
        init = TOKEN_INIT_STD * math.sqrt(2)
        self.token_scale = (math.sqrt(self.d_model) if scale == "vaswani"
                            else 1.0)
        if scale == "vaswani":
            self.register_buffer("scale", torch.tensor(1.0), persistent=False)
        elif scale == "learned":
            self.scale = nn.Parameter(torch.tensor(init))
        elif (isinstance(scale, (int, float))
              and not isinstance(scale, bool) and math.isfinite(scale)):
            self.register_buffer("scale", torch.tensor(float(scale)),
                                 persistent=False)
        else:
            raise ValueError(
                f"scale must be 'learned', 'vaswani' or a finite number; "
                f"got {scale!r}")

    def prepare(self, ctx: PositionContext) -> dict:
        low = (ctx.minmax() or (0, 0))[0]
        if low < 0:
            raise ValueError(f"positions must be >= 0; got min {float(low)}")
        # (T, D)
        return {"pe": sinusoidal_at(
            ctx.positions, self.d_model, self.base).to(ctx.positions.device)}

    def embed(self, x: Tensor, ctx: PositionContext) -> Tensor:
        if self.token_scale != 1.0:  # Vaswani: sqrt(d) x + PE
            x = x * self.token_scale
        return x + self.scale * ctx.tables["pe"].to(x.dtype)  # (B, T, D)


EXTEND_INITS = ("random", "copy", "interpolate")


@torch.no_grad()
def extend_learned_table(model, new_len: int, init: str = "random") -> None:
    """Grow a trained model's learned table from max_len to `new_len` rows,
    in place.

    init:
        "random":      new rows drawn as the table was
                       (N(init_mean, init_std^2): N(0, 0.02^2) for the learned
                       table, N(1, 0.5^2) for the multiplicative one);
        "copy":        row p = old row (p mod max_len), the old table tiled
                       (Longformer's trick);
        "interpolate": the whole old table resampled linearly onto new_len
                       rows, so row p of the new table sits at old position
                       p * (max_len-1)/(new_len-1).
    Rows 0..max_len-1 are kept for "random" and "copy". Fine-tune afterwards.
    """
    scheme = getattr(model, "scheme", None)
    if not isinstance(scheme, _TableScheme):
        raise TypeError(f"model must use a learned table scheme "
                        f"('learned' or 'multiplicative'); "
                        f"got {type(scheme).__name__}")
    old = scheme.table.data  # (L, D)
    if not isinstance(new_len, int) or new_len <= old.shape[0]:
        raise ValueError(f"new_len must be an int > max_len={old.shape[0]}; "
                         f"got {new_len!r}")
    if init == "random":
        extra = torch.randn(new_len - old.shape[0], old.shape[1],
                            device=old.device) * scheme.init_std
        new = torch.cat([old, extra.to(old.dtype) + type(scheme).init_mean])
    elif init == "copy":
        new = old[torch.arange(new_len, device=old.device) % old.shape[0]]
    elif init == "interpolate":
        new = F.interpolate(old.T[None], size=new_len, mode="linear",
                            align_corners=True)[0].T
    else:
        raise ValueError(f"init must be one of {EXTEND_INITS}; got {init!r}")
    scheme.table = nn.Parameter(new.contiguous())
    scheme.max_len = new_len
