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

from typing import Literal

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

    def __init__(self, padding: str = "zero", *, channels: int = 16,
                 dilations=(1, 2, 4, 1), in_channels: int = 1):
        super().__init__()
        if padding not in PADDINGS:
            raise ValueError(
                f"padding must be one of {PADDINGS}; got {padding!r}")
        if not dilations or any(not isinstance(d, int) or d < 1
                                for d in dilations):
            raise ValueError(
                f"dilations must be a non-empty sequence of positive ints; "
                f"got {dilations!r}")
        self.padding, self.dilations = padding, tuple(dilations)
        mode: dict[str, Literal["zeros", "circular"]] = {
            "zero": "zeros", "circular": "circular", "valid": "zeros"}
        layers, c = [], in_channels
        for d in self.dilations:
            layers += [nn.Conv2d(c, channels, 3, dilation=d,
                                 padding=0 if padding == "valid" else d,
                                 padding_mode=mode[padding]),
                       nn.ReLU()]
            c = channels
        self.features = nn.Sequential(*layers)
        # the same linear map at every location
        self.readout = nn.Conv2d(channels, 2, 1)

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


def position_loss(model: PositionCNN, images: Tensor, targets: Tensor) -> Tensor:
    """Mean squared error of the predicted (row, col) map: the `loss_fn` for `posenc.train`."""
    return F.mse_loss(model(images).float(), targets)


from ..tasks.cnn_position import PositionTask, chance_error_px, position_targets  # noqa: E402,F401
