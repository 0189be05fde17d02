"""How CNNs know position (Islam et al., ICLR 2020): zero padding leaks it.

A stack of 3x3 convolutions is translation-equivariant away from the image border:

    conv(shift_s x) = shift_s conv(x)                       (equivariance)

so on an input whose statistics are the same at every location (i.i.d. noise), the
features at every location are identically distributed and no location-independent
read-out can tell where it is. The border breaks this only through the padding:

* `zero`:     pads with zeros; a location near the border sees zeros that stand
              where content would be, so the distance to the border is readable;
* `circular`: wraps the image (a torus); exactly equivariant to cyclic shifts,
              so the border does not exist;
* `valid`:    no padding; each output sees only real pixels, and the output is
              exactly equivariant to shifts followed by cropping.

`PositionCNN` is the conv stack with a 1x1 read-out predicting each output location's
normalised (row, column); `PositionTask` feeds it noise images and the targets.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

PADDINGS = ("zero", "valid", "circular")


class PositionCNN(nn.Module):
    """Dilated 3x3 conv stack + 1x1 read-out: image [B, C, H, W] -> (row, col) map [B, 2, H', W'].

    Args:
        padding: "zero", "valid" or "circular".
        channels: feature channels of every conv layer.
        dilations: one 3x3 layer per entry; the receptive-field radius is their sum.
        in_channels: image channels.
    """

    causal = False  # posenc.train reads this flag

    def __init__(self, padding: str = "zero", *, channels: int = 16, dilations=(1, 2, 4, 1), in_channels: int = 1):
        super().__init__()
        if padding not in PADDINGS:
            raise ValueError(f"padding must be one of {PADDINGS}; got {padding!r}")
        if not dilations or any(not isinstance(d, int) or d < 1 for d in dilations):
            raise ValueError(f"dilations must be a non-empty sequence of positive ints; got {dilations!r}")
        self.padding, self.dilations = padding, tuple(dilations)
        mode = {"zero": "zeros", "circular": "circular", "valid": "zeros"}[padding]
        layers, c = [], in_channels
        for d in self.dilations:
            layers += [nn.Conv2d(c, channels, 3, dilation=d, padding=0 if padding == "valid" else d,
                                 padding_mode=mode), nn.ReLU()]
            c = channels
        self.features = nn.Sequential(*layers)
        self.readout = nn.Conv2d(channels, 2, 1)          # the same linear map at every location

    @property
    def radius(self) -> int:
        """Receptive-field radius in pixels: sum of dilations (kernel 3)."""
        return sum(self.dilations)

    @property
    def margin(self) -> int:
        """Pixels lost per side: `radius` for valid convolutions, else 0."""
        return self.radius if self.padding == "valid" else 0

    def forward(self, images: Tensor) -> Tensor:
        """[B, C, H, W] -> [B, 2, H - 2 margin, W - 2 margin] predicted (row, col) in [-1, 1] units."""
        if images.dim() != 4:
            raise ValueError(f"images must be [batch, channels, height, width]; got {tuple(images.shape)}")
        if min(images.shape[-2:]) <= 2 * self.margin:
            raise ValueError(f"images must be larger than 2 * margin = {2 * self.margin} pixels for valid padding; "
                             f"got {tuple(images.shape[-2:])}")
        return self.readout(self.features(images))


def position_targets(size: int) -> Tensor:
    """(row, col) of every location of a size x size map, scaled to [-1, 1]: [2, size, size].

    These are the vertical and horizontal "gradient" masks of Islam et al.
    """
    if not isinstance(size, int) or size < 2:
        raise ValueError(f"size must be an int >= 2; got {size!r}")
    r = torch.linspace(-1.0, 1.0, size)
    return torch.stack(torch.meshgrid(r, r, indexing="ij"))                        # (2, S, S)


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

    def batch(self, batch_size: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
        """images [B, C, size + 2 margin, same], targets [B, 2, size, size]."""
        side = self.size + 2 * self.margin
        images = torch.randn(batch_size, self.channels, side, side, generator=g)
        return images, position_targets(self.size).expand(batch_size, -1, -1, -1)

    def train_batch(self, batch_size: int, g: torch.Generator, causal: bool = False):
        """The `posenc.train` interface (`causal` is ignored)."""
        return self.batch(batch_size, g)

    @torch.no_grad()
    def evaluate(self, model: PositionCNN, *, n_samples: int = 256, seed: int = 12345) -> dict:
        """R^2 of the (row, col) prediction (0 = a constant guess) and mean error in pixels."""
        images, targets = self.batch(n_samples, torch.Generator().manual_seed(seed))
        device = next(model.parameters()).device
        pred = model(images.to(device)).float().cpu()
        err = pred - targets                                                       # (N, 2, S, S)
        r2 = 1 - err.square().mean() / targets.var(unbiased=False)
        pixels = err.abs().mean() * (self.size - 1) / 2                           # [-1, 1] -> pixels
        return {"r2": r2.item(), "error_px": pixels.item(), "chance_error_px": chance_error_px(self.size)}

    @torch.no_grad()
    def error_map(self, model: PositionCNN, *, n_samples: int = 128, seed: int = 12345) -> Tensor:
        """Mean Euclidean position error in pixels at each location: [size, size]."""
        images, targets = self.batch(n_samples, torch.Generator().manual_seed(seed))
        pred = model(images.to(next(model.parameters()).device)).float().cpu()
        return ((pred - targets).square().sum(1).sqrt().mean(0) * (self.size - 1) / 2)


def chance_error_px(size: int) -> float:
    """Mean |coordinate - centre| in pixels: the error of the best constant guess (per axis)."""
    c = torch.arange(size, dtype=torch.float64)
    return (c - c.mean()).abs().mean().item()


def position_loss(model: PositionCNN, images: Tensor, targets: Tensor) -> Tensor:
    """Mean squared error of the predicted (row, col) map: the `loss_fn` for `posenc.train`."""
    return F.mse_loss(model(images).float(), targets)
