"""Vision Transformer positions (Dosovitskiy et al., ICLR 2021): patches, a 2-D grid, resolution change.

An image x in R^{H x W x C} is cut into N = HW / P^2 patches x_p^n in R^{P^2 C} (raster
order: patch n sits at row r = n // w, column c = n % w of the h x w = H/P x W/P grid),
and ViT's Eq. (1) builds the token sequence

    z_0 = [x_class; x_p^1 E; ...; x_p^N E] + E_pos,   E in R^{(P^2 C) x D},  E_pos in R^{(N+1) x D}.

The 2-D schemes below are `Scheme`s, so they plug into `posenc.model.Block` like text
schemes; they read the grid from a `GridContext`:

    learned   p_n = E_pos[n]                                  (a 1-D table over the raster index)
    sincos2d  p_{r,c} = [PE_{D/2}(r) ; PE_{D/2}(c)]           (Vaswani's table per axis, concatenated)
    rope2d    q -> [R(r) q_{:d/2} ; R(c) q_{d/2:}], same for k   (axial RoPE: rows, then columns)

At a new resolution the grid grows (P fixed). `interpolate_pos_embed` resizes a learned
table bicubically (ViT section 3.2); `GridContext.ref_grid` makes the fixed schemes use
the same fractional coordinates r' = (r + 1/2) h_ref / h - 1/2 that interpolation uses.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..attention import merge_mask
from ..host import assert_values, to_device, values_checked_on_host
from ..schemes.absolute import sinusoidal_at
from ..model import Block, _init_weights, run_blocks
from ..schemes.nope import NoPE
from ..schemes.rotary import rotate_at_positions
from ..scheme import PositionContext, Scheme
from ..model import classification_loss  # noqa: F401  (re-exported: the loss_fn for this module's tasks)


# -- the grid ---------------------------------------------------------------------
def check_grid(name: str, grid) -> tuple[int, int]:
    """(h, w) as a tuple of two positive ints, or a ValueError naming the argument."""
    if (not isinstance(grid, (tuple, list)) or len(grid) != 2
            or not all(isinstance(g, int) and not isinstance(g, bool) and g > 0 for g in grid)):
        raise ValueError(f"{name} must be a pair of positive ints (rows, columns); got {grid!r}")
    return int(grid[0]), int(grid[1])


def grid_coords(grid, ref_grid=None) -> tuple[Tensor, Tensor]:
    """Float (rows, cols), each [h*w] in raster order; with `ref_grid`, in
    that grid's units.

        r' = (r + 1/2) h_ref / h - 1/2  (the sampling points of bicubic
                                         interpolation, align_corners=False)
    """
    h, w = check_grid("grid", grid)
    r, c = torch.meshgrid(torch.arange(h, dtype=torch.float32),
                          torch.arange(w, dtype=torch.float32), indexing="ij")
    if ref_grid is not None:
        rh, rw = check_grid("ref_grid", ref_grid)
        r, c = (r + 0.5) * rh / h - 0.5, (c + 0.5) * rw / w - 0.5
    return r.flatten(), c.flatten()  # 2 x (h*w,)


@dataclass
class GridContext(PositionContext):
    """A `PositionContext` whose tokens (after an optional [CLS])
    are an h x w patch grid."""

    grid: tuple = (1, 1)
    # express coordinates in this (training) grid's units
    ref_grid: tuple | None = None

    def coords(self) -> tuple[Tensor, Tensor]:
        """(rows, cols) of the patch tokens, float [h*w] each,
        on the positions' device."""
        r, c = grid_coords(self.grid, self.ref_grid)
        return (to_device(r, self.positions.device),
                to_device(c, self.positions.device))


def _grid_of(ctx: PositionContext) -> GridContext:
    if not isinstance(ctx, GridContext):
        raise TypeError(f"2-D schemes need a posenc.vision.GridContext (built by ViT); got {type(ctx).__name__}")
    return ctx


# -- resolution change of a learned table ------------------------------------------
def grid_similarity(table: Tensor, grid) -> dict:
    """Mean cosine similarity of the position vectors of patch pairs, by how they sit on the grid.

    table: [h*w, d] (raster order). Returns the means over pairs of grid neighbours (|dr| + |dc| = 1),
    same row at distance >= 2, same column at distance >= 2, different row and column, diagonal
    neighbours (|dr| = |dc| = 1) and two apart in a line (|dr| + |dc| = 2, one of them 0), plus ViT
    Fig. 7's structure in one number:

        row_column_excess = mean cos(same row or column, not itself) - mean cos(different row and column).

    The excess counts the grid neighbours among the same-row-or-column pairs, so a table that only
    knows nearness (its vectors depend on the distance between patches alone) scores well on it too.
    What sets rows and columns apart from nearness is

        line_over_diagonal = mean cos(two apart in a line) - mean cos(diagonal neighbours):

    a diagonal neighbour is nearer (sqrt 2 against 2) but shares neither row nor column, so the
    difference is negative for a table of nearness and positive for one of rows and columns.
    """
    h, w = check_grid("grid", grid)
    if h < 2 or w < 2:
        raise ValueError(f"grid must have at least two rows and two columns (else no pair of patches differs in both, "
                         f"and the row/column excess is undefined); got {grid!r}")
    if table.dim() != 2 or table.shape[0] != h * w:
        raise ValueError(f"table must be [h*w={h * w}, d]; got {tuple(table.shape)}")
    t = F.normalize(table.detach().float().cpu(), dim=-1)
    sim = t @ t.T                                                           # (hw, hw)
    r, c = grid_coords((h, w))
    dr, dc = (r[:, None] - r[None]).abs(), (c[:, None] - c[None]).abs()
    groups = {"neighbours": dr + dc == 1, "same row": (dr == 0) & (dc >= 2), "same column": (dc == 0) & (dr >= 2),
              "different row and column": (dr > 0) & (dc > 0), "diagonal neighbours": (dr == 1) & (dc == 1),
              "two apart in a line": (dr + dc == 2) & ((dr == 0) | (dc == 0))}
    out = {name: float(sim[mask].mean()) if mask.any() else float("nan") for name, mask in groups.items()}
    line = ((dr == 0) | (dc == 0)) & (dr + dc > 0)
    out["row_column_excess"] = float(sim[line].mean() - sim[groups["different row and column"]].mean())
    out["line_over_diagonal"] = out["two apart in a line"] - out["diagonal neighbours"]
    return out


def interpolate_pos_embed(pos_embed: Tensor, old_grid: tuple[int, int],
                          new_grid: tuple[int, int], *,
                          num_prefix_tokens: int = 0) -> Tensor:
    """Resize a learned [prefix + old_h*old_w, D] table to
    [prefix + new_h*new_w, D] (ViT section 3.2).

    The patch rows are reshaped to the (old_h, old_w) grid, resampled
    bicubically to (new_h, new_w) exactly as `transformers`'
    `ViTEmbeddings.interpolate_pos_encoding`
    (`F.interpolate(size=new_grid, mode="bicubic", align_corners=False)`),
    and flattened back in raster order; the first `num_prefix_tokens` rows
    (0, or 1 for a [CLS] row) are kept unchanged. A leading batch axis
    [1, L, D] is accepted and kept. Half-precision tables are resampled in
    float32, float64 ones in float64; an integer table is refused.
    """
    if (not isinstance(pos_embed, Tensor) or pos_embed.dim() not in (2, 3)
            or (pos_embed.dim() == 3 and pos_embed.shape[0] != 1)):
        got = (tuple(pos_embed.shape) if isinstance(pos_embed, Tensor)
               else type(pos_embed).__name__)
        raise ValueError(
            f"pos_embed must be a tensor [length, dim] or [1, length, dim]; "
            f"got {got}")
    if (not isinstance(num_prefix_tokens, int)
            or isinstance(num_prefix_tokens, bool) or num_prefix_tokens < 0):
        raise ValueError(f"num_prefix_tokens must be a non-negative int "
                         f"(1 for a [CLS] row); got {num_prefix_tokens!r}")
    (oh, ow), (nh, nw) = (check_grid("old_grid", old_grid),
                          check_grid("new_grid", new_grid))
    table = pos_embed[0] if pos_embed.dim() == 3 else pos_embed  # (L, D)
    if table.shape[0] != num_prefix_tokens + oh * ow:
        raise ValueError(
            f"pos_embed has {table.shape[0]} rows but old_grid={old_grid!r} "
            f"with num_prefix_tokens={num_prefix_tokens} "
            f"needs {num_prefix_tokens + oh * ow}")
    if not table.is_floating_point():
        raise TypeError(
            f"pos_embed must be a floating-point table "
            f"(bicubic resampling of {table.dtype} would truncate it); "
            f"got dtype {table.dtype}")
    prefix, patches = table[:num_prefix_tokens], table[num_prefix_tokens:]
    dim = table.shape[1]
    # float64 stays float64
    wide = torch.promote_types(table.dtype, torch.float32)
    # (1, D, oh, ow)
    grid = patches.to(wide).reshape(1, oh, ow, dim).permute(0, 3, 1, 2)
    # (1, D, nh, nw)
    grid = F.interpolate(grid, size=(nh, nw), mode="bicubic",
                         align_corners=False)
    # (nh*nw, D)
    patches = grid.permute(0, 2, 3, 1).reshape(nh * nw, dim).to(table.dtype)
    out = torch.cat([prefix, patches], 0)
    return out[None] if pos_embed.dim() == 3 else out


# -- image -> tokens ----------------------------------------------------------------
def check_image_dtype(images: Tensor, weight: Tensor) -> None:
    """TypeError unless `images` have the stem's dtype (numpy's float64 against float32 weights, say);
    under autocast the convolution casts float32 and half-precision images, never float64 ones."""
    cast = torch.is_autocast_enabled(images.device.type) and images.dtype != torch.float64
    if images.dtype != weight.dtype and not cast:
        raise TypeError(f"images must have the model's dtype, {weight.dtype}; got {images.dtype} "
                        f"(convert them: images.to({weight.dtype}))")


def check_image_size(images: Tensor, patch_size: int, in_channels: int | None = None) -> tuple[int, int]:
    """The patch grid (H/P, W/P) of `images` [batch, channels, H, W], or a ValueError (also when the images do
    not have the `in_channels` channels the stem was built for)."""
    if not isinstance(images, Tensor) or images.dim() != 4:
        got = tuple(images.shape) if isinstance(images, Tensor) else type(images).__name__
        raise ValueError(f"images must be a tensor [batch, channels, height, width]; got {got}")
    if in_channels is not None and images.shape[1] != in_channels:
        raise ValueError(f"images have {images.shape[1]} channels but the model was built for "
                         f"in_channels={in_channels}")
    if isinstance(patch_size, bool) or not isinstance(patch_size, int) or patch_size < 1:
        raise ValueError(f"patch_size must be a positive int; got {patch_size!r}")
    if not images.is_floating_point():
        raise TypeError(f"images must be a float tensor; got {images.dtype}")
    if not values_checked_on_host():                                          # see posenc.host
        if torch.compiler.is_compiling():                                     # checked by the kernels
            assert_values(torch.isfinite(images), "images must be finite; got NaN or infinite pixels")
        elif not torch.isfinite(images).all():                                # a wait on a GPU
            raise ValueError("images must be finite; got NaN or infinite pixels")
    H, W = images.shape[-2:]
    if H % patch_size or W % patch_size:
        raise ValueError(f"image size {H}x{W} must be divisible by patch_size={patch_size}")
    return H // patch_size, W // patch_size


def patchify(images: Tensor, patch_size: int) -> Tensor:
    """[B, C, H, W] -> flattened patches x_p [B, N, P^2 C] in raster order (ViT Eq. 1's x_p^n)."""
    check_image_size(images, patch_size)
    cols = F.unfold(images, kernel_size=patch_size, stride=patch_size)        # (B, C*P*P, N)
    return cols.transpose(1, 2)                                               # (B, N, C*P*P)


class PatchEmbed(nn.Module):
    """x_p^n E + b for every patch: a P x P convolution with stride P (= `patchify` then a linear map)."""

    def __init__(self, in_channels: int, d_model: int, patch_size: int):
        super().__init__()
        if not isinstance(patch_size, int) or patch_size < 1:
            raise ValueError(f"patch_size must be a positive int; got {patch_size!r}")
        self.patch_size = patch_size
        self.proj = nn.Conv2d(in_channels, d_model, kernel_size=patch_size, stride=patch_size)

    def forward(self, images: Tensor) -> tuple[Tensor, tuple[int, int]]:
        grid = check_image_size(images, self.patch_size, self.proj.in_channels)
        check_image_dtype(images, self.proj.weight)
        return self.proj(images).flatten(2).transpose(1, 2), grid              # (B, h*w, D), (h, w)


class CNNStem(nn.Module):
    """ViT's hybrid input: a small CNN's feature map, each spatial cell one token (patch size 1).

    Two 3x3 conv layers (zero padding 1) and a stride-`patch_size` average pool: the
    grid is the same as `PatchEmbed`'s, but each token sees a (P + 4) x (P + 4) window
    that overlaps its neighbours' and, at the border, the zero padding.
    """

    def __init__(self, in_channels: int, d_model: int, patch_size: int, width: int = 16):
        super().__init__()
        self.patch_size, self.in_channels = patch_size, in_channels
        self.features = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1), nn.GELU(),
                                      nn.Conv2d(width, width, 3, padding=1), nn.GELU(),
                                      nn.AvgPool2d(patch_size))
        self.proj = nn.Conv2d(width, d_model, kernel_size=1)                   # the 1x1 "patch" projection

    def forward(self, images: Tensor) -> tuple[Tensor, tuple[int, int]]:
        grid = check_image_size(images, self.patch_size, self.in_channels)
        check_image_dtype(images, self.proj.weight)
        return self.proj(self.features(images)).flatten(2).transpose(1, 2), grid  # (B, h*w, D), (h, w)


# -- 2-D schemes ----------------------------------------------------------------------
class PatchLearned(Scheme):
    """ViT's E_pos: a learned [1 + h*w, D] table (row 0 for [CLS]) over the raster index, Eq. (1)."""

    def __init__(self, *, grid=(4, 4), **kw):
        super().__init__(**kw)
        self.grid = check_grid("grid", grid)
        self.table = nn.Parameter(torch.randn(1 + self.grid[0] * self.grid[1], self.d_model) * 0.02)

    def embed(self, x: Tensor, ctx: PositionContext) -> Tensor:
        ctx = _grid_of(ctx)
        if tuple(ctx.grid) != self.grid or not ctx.has_cls:
            raise ValueError(f"the learned table serves a [CLS] + {self.grid} grid ({self.table.shape[0]} rows); "
                             f"got grid={tuple(ctx.grid)}: call resize_(new_grid, mode='interpolate' or 'extend')")
        return x + self.table[None]                                            # (B, 1+h*w, D)

    @torch.no_grad()
    def resize_(self, new_grid, mode: str = "interpolate") -> None:
        """Adapt the table to `new_grid` in place.

        mode="interpolate": ViT's bicubic 2-D resize
            (`interpolate_pos_embed`, [CLS] row kept).
        mode="extend": no adaptation, the 1-D view: reuse rows in raster
            order, new rows zero.
        """
        new_grid = check_grid("new_grid", new_grid)
        if mode == "interpolate":
            table = interpolate_pos_embed(self.table, self.grid, new_grid,
                                          num_prefix_tokens=1)
        elif mode == "extend":
            table = self.table.new_zeros(1 + new_grid[0] * new_grid[1],
                                         self.d_model)
            n = min(len(table), len(self.table))
            table[:n] = self.table[:n]
        else:
            raise ValueError(f"mode must be 'interpolate' or 'extend'; "
                             f"got {mode!r}")
        self.table, self.grid = nn.Parameter(table), new_grid

    def patch_table(self) -> Tensor:
        """The patch rows [h*w, D] (no [CLS]) for similarity maps."""
        return self.table[1:]


class SinCos2D(Scheme):
    """Fixed 2-D sinusoidal positions: p_{r,c} = [PE_{D/2}(r) ; PE_{D/2}(c)], [CLS] gets 0.

    PE_k is Vaswani et al.'s interleaved table (`posenc.absolute.sinusoidal_at`); each
    axis gets half the width, so D must be a multiple of 4.
    """

    def __init__(self, *, base: float = 10000.0, grid=None, **kw):
        super().__init__(**kw)
        if self.d_model % 4:
            raise ValueError(f"sincos2d needs d_model divisible by 4; got d_model={self.d_model}")
        self.base = base

    def table(self, ctx: GridContext) -> Tensor:
        """[h*w, D]: row coordinates in the first D/2 columns, column
        coordinates in the rest."""
        # on CPU, where sinusoidal_at works
        r, c = grid_coords(ctx.grid, ctx.ref_grid)
        half = self.d_model // 2
        p = torch.cat([sinusoidal_at(r, half, self.base),
                       sinusoidal_at(c, half, self.base)], -1)  # (h*w, D)
        return to_device(p, ctx.positions.device)

    def embed(self, x: Tensor, ctx: PositionContext) -> Tensor:
        ctx = _grid_of(ctx)
        p = self.table(ctx).to(x.dtype)                                        # (h*w, D)
        if ctx.has_cls:
            p = torch.cat([p.new_zeros(1, p.shape[1]), p], 0)                  # (1+h*w, D)
        return x + p[None]


def axial_rope(x: Tensor, rows: Tensor, cols: Tensor, base: float = 100.0,
               layout: str = "interleaved") -> Tensor:
    """Axial 2-D RoPE of x [..., h*w, d]: rotate x_{:d/2} by the rows,
    x_{d/2:} by the columns.

        R(r, c) = diag(R_{d/2}(r), R_{d/2}(c)),
        <R(r_m, c_m) q, R(r_n, c_n) k> = f(q, k, r_m - r_n, c_m - c_n)

    since each block is a 1-D RoPE (RoFormer Eq. 16) on its own half;
    `posenc.rotary.apply_rope` does each (`rotate_at_positions`, its body
    without the host read of a NaN check, in a training step).
    """
    half = x.shape[-1] // 2
    if x.shape[-1] % 4:
        raise ValueError(f"axial RoPE needs a head dim divisible by 4 "
                         f"(two rotated halves); got {x.shape[-1]}")
    # (..., h*w, d)
    return torch.cat([
        rotate_at_positions(x[..., :half], rows, base, layout),
        rotate_at_positions(x[..., half:], cols, base, layout)], -1)


class AxialRoPE(Scheme):
    """Axial 2-D RoPE on hook `transform_qk`: half of each head's rotary dims for rows, half for columns.

    The [CLS] query/key is not rotated (it has no place on the grid). `base` defaults to
    100, the value Heo et al. (ECCV 2024) use for image grids: with a grid of tens of
    patches, base 10000 would leave most frequencies nearly constant.
    """

    def __init__(self, *, base: float = 100.0, layout: str = "interleaved", grid=None, **kw):
        super().__init__(**kw)
        if self.head_dim % 4:
            raise ValueError(f"rope2d needs head_dim = d_model / n_heads divisible by 4; got {self.head_dim}")
        self.base, self.layout = float(base), layout

    def transform_qk(self, q: Tensor, k: Tensor,
                     ctx: PositionContext) -> tuple[Tensor, Tensor]:
        ctx = _grid_of(ctx)
        rows, cols = ctx.coords()
        n = int(ctx.has_cls)  # leading [CLS] rows stay as they are

        def rot(x):  # (B, H, n + h*w, d_h)
            return torch.cat([x[..., :n, :],
                              axial_rope(x[..., n:, :], rows, cols,
                                         self.base, self.layout)], -2)
        return rot(q), rot(k)


def _check_vision_scheme(name: str) -> type[Scheme]:
    if name not in VISION_SCHEMES:
        raise ValueError(f"unknown vision scheme {name!r}; known: {', '.join(sorted(VISION_SCHEMES))}")
    return VISION_SCHEMES[name]


VISION_SCHEMES: dict[str, type[Scheme]] = {"none": NoPE, "learned": PatchLearned, "sincos2d": SinCos2D, "rope2d": AxialRoPE}


# -- the model --------------------------------------------------------------------------
class ViT(nn.Module):
    """[CLS] + patch (or CNN) tokens, pre-LN `posenc.model.Block`s sharing one scheme, a linear head on [CLS].

    Args:
        scheme: a (2-D) positional `Scheme`; it sees a `GridContext`.
        stem: "patch" (ViT's linear patch embedding) or "cnn" (the hybrid input).
    """

    causal = False

    def __init__(self, scheme: Scheme, *, patch_size: int, num_classes: int, in_channels: int = 1,
                 d_model: int = 64, n_heads: int = 4, n_layers: int = 2, d_ff: int | None = None,
                 dropout: float = 0.0, stem: str = "patch"):
        super().__init__()
        if stem not in ("patch", "cnn"):
            raise ValueError(f"stem must be 'patch' or 'cnn'; got {stem!r}")
        if not isinstance(scheme, Scheme):
            raise TypeError(f"scheme must be a posenc Scheme; got {type(scheme).__name__}")
        scheme.check_fits("ViT", d_model=d_model, n_heads=n_heads, n_layers=n_layers)
        for arg, value in (("patch_size", patch_size), ("num_classes", num_classes), ("in_channels", in_channels)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{arg} must be a positive int; got {value!r}")
        if d_ff is not None and (isinstance(d_ff, bool) or not isinstance(d_ff, int) or d_ff < 1):
            raise ValueError(f"d_ff must be a positive int or None (4 d_model); got {d_ff!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
            raise ValueError(f"dropout must be a number in [0, 1); got {dropout!r}")
        self.scheme = scheme
        self.stem = (PatchEmbed if stem == "patch" else CNNStem)(in_channels, d_model, patch_size)
        self.cls = nn.Parameter(torch.zeros(1, 1, d_model))
        self.blocks = nn.ModuleList(Block(d_model, n_heads, d_ff or 4 * d_model, i, dropout) for i in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, num_classes)
        self.apply(_init_weights)

    def forward(self, images: Tensor, ref_grid=None) -> Tensor:
        """images [B, C, H, W] -> class logits [B, num_classes] (read from [CLS])."""
        return self.head(self.hidden_states(images, ref_grid)[0][:, 0])

    @torch.no_grad()
    def attention_maps(self, images: Tensor, ref_grid=None) -> list[Tensor]:
        """Every layer's attention weights [B, heads, 1+h*w, 1+h*w] ([CLS] first)."""
        return self.hidden_states(images, ref_grid, need_weights=True)[1]

    def check_inputs(self, images: Tensor) -> None:
        """ValueError or TypeError unless `images` is a finite float tensor [B, C, H, W] of whole patches
        (run by every forward; inside `posenc.host.host_checked()` without the finiteness check)."""
        check_image_size(images, self.stem.patch_size)

    def hidden_states(self, images: Tensor, ref_grid=None,
                      need_weights: bool = False):
        x, grid = self.stem(images)            # (B, N, D), (h, w)
        # (B, 1+N, D)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1)
        ctx = GridContext(torch.arange(x.shape[1], device=x.device),
                          causal=False, has_cls=True, grid=grid,
                          ref_grid=(None if ref_grid is None
                                    else check_grid("ref_grid", ref_grid)),
                          start=0, extent=(0, x.shape[1] - 1))
        ctx.tables = self.scheme.prepare(ctx)
        merge_mask(self.scheme, ctx)           # hook 3, shared by layers
        x = self.scheme.embed(x, ctx)          # hook 1
        x, maps, _ = run_blocks(self.blocks, self.scheme, x, ctx, need_weights)
        return self.ln_f(x), maps


def build_vit(scheme: str, *, image_size: int, patch_size: int, num_classes: int, in_channels: int = 1,
              d_model: int = 64, n_heads: int = 4, n_layers: int = 2, d_ff: int | None = None,
              dropout: float = 0.0, stem: str = "patch", **scheme_kwargs) -> ViT:
    """A `ViT` for square `image_size` images using the vision scheme called `scheme`."""
    cls = _check_vision_scheme(scheme)
    for arg, value in (("image_size", image_size), ("patch_size", patch_size), ("num_classes", num_classes),
                       ("in_channels", in_channels)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{arg} must be a positive int; got {value!r}")
    if image_size % patch_size:
        raise ValueError(f"image_size={image_size!r} must be divisible by patch_size={patch_size!r}")
    if scheme == "learned":
        scheme_kwargs.setdefault("grid", (image_size // patch_size,) * 2)
    n = (image_size // patch_size) ** 2 + 1
    module = cls(d_model=d_model, n_heads=n_heads, n_layers=n_layers, max_len=n, causal=False, **scheme_kwargs)
    return ViT(module, patch_size=patch_size, num_classes=num_classes, in_channels=in_channels, d_model=d_model,
               n_heads=n_heads, n_layers=n_layers, d_ff=d_ff, dropout=dropout, stem=stem)


from ..tasks.digits import DigitsTask  # noqa: E402,F401  (the chapter's data, kept importable here)
