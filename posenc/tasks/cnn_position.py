"""The CNN position task (chapter 12): noise images whose target at each pixel is that pixel's position."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .scoring import scoring


def position_targets(size: int) -> Tensor:
    """(row, col) of every location of a size x size map, scaled to [-1, 1]:
    [2, size, size].

    These are the vertical and horizontal "gradient" masks of Islam et al.
    """
    if not isinstance(size, int) or size < 2:
        raise ValueError(f"size must be an int >= 2; got {size!r}")
    r = torch.linspace(-1.0, 1.0, size)
    return torch.stack(torch.meshgrid(r, r, indexing="ij"))  # (2, S, S)


@dataclass
class PositionTask:
    """Noise images whose output map is `size` x `size`; targets = each location's position.

    Args:
        size: side of the read-out map (the image a same-padded CNN sees).
        margin: extra pixels per side of input (a valid CNN's `margin`), so every
            model is read out on the same size x size grid.
        channels: image channels; pixels are i.i.d. N(0, 1).
    """

    size: int = 16
    margin: int = 0
    channels: int = 1

    def __post_init__(self):
        if not isinstance(self.size, int) or self.size < 2:
            raise ValueError(f"size must be an int >= 2; got {self.size!r}")
        if not isinstance(self.margin, int) or self.margin < 0:
            raise ValueError(f"margin must be a non-negative int; got {self.margin!r}")

    def batch(self, batch_size: int,
              g: torch.Generator) -> tuple[Tensor, Tensor]:
        """images [B, C, size + 2 margin, same], targets [B, 2, size, size]."""
        side = self.size + 2 * self.margin
        images = torch.randn(batch_size, self.channels, side, side,
                             generator=g)
        return images, position_targets(self.size).expand(
            batch_size, -1, -1, -1)

    def train_batch(self, batch_size: int, g: torch.Generator, causal: bool = False):
        """The `posenc.train` interface (`causal` is ignored)."""
        return self.batch(batch_size, g)

    @scoring
    def evaluate(self, model: "torch.nn.Module", *, n_samples: int = 256, seed: int = 12345) -> dict:
        """R^2 of the (row, col) prediction (0 = a constant guess) and mean error in pixels."""
        images, targets = self.batch(n_samples, torch.Generator().manual_seed(seed))
        device = next(model.parameters()).device
        pred = model(images.to(device)).float().cpu()
        err = pred - targets                                                       # (N, 2, S, S)
        r2 = 1 - err.square().mean() / targets.var(unbiased=False)
        pixels = err.abs().mean() * (self.size - 1) / 2                           # [-1, 1] -> pixels
        return {"r2": r2.item(), "error_px": pixels.item(), "chance_error_px": chance_error_px(self.size)}

    @scoring
    def error_map(self, model: "torch.nn.Module", *, n_samples: int = 128, seed: int = 12345) -> Tensor:
        """Mean Euclidean position error in pixels at each location: [size, size]."""
        images, targets = self.batch(n_samples, torch.Generator().manual_seed(seed))
        pred = model(images.to(next(model.parameters()).device)).float().cpu()
        return ((pred - targets).square().sum(1).sqrt().mean(0) * (self.size - 1) / 2)


def chance_error_px(size: int) -> float:
    """Mean |coordinate - centre| in pixels: the error of the best constant guess (per axis)."""
    c = torch.arange(size, dtype=torch.float64)
    return (c - c.mean()).abs().mean().item()
