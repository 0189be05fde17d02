"""scikit-learn's 8x8 digits (shipped with the package, no download), upsampled: the ViT chapter's images."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .scoring import scoring


class DigitsTask:
    """The 1797 8x8 digits of `sklearn.datasets.load_digits`, bilinearly upsampled to `image_size`.

    A fixed split (`test_fraction`, drawn once from `split_seed`); training batches come
    from the generator `posenc.train` passes, with random shifts of up to `max_shift`
    pixels (of the upsampled image) as augmentation: one shift (dy, dx) per batch, each drawn
    uniformly from -max_shift..max_shift, applied with `torch.roll` (what leaves one edge comes
    back at the other). Pixels are standardised with the
    training split's mean and standard deviation.
    """

    num_classes = 10

    def __init__(self, image_size: int = 16, *, test_fraction: float = 0.25, split_seed: int = 0, max_shift: int = 0):
        if not isinstance(image_size, int) or image_size < 8:
            raise ValueError(f"image_size must be an int >= 8; got {image_size!r}")
        if isinstance(test_fraction, bool) or not isinstance(test_fraction, (int, float)) or not 0 < test_fraction < 1:
            raise ValueError(f"test_fraction must be a number in (0, 1); got {test_fraction!r}")
        if isinstance(max_shift, bool) or not isinstance(max_shift, int) or not 0 <= max_shift < image_size:
            raise ValueError(f"max_shift must be an int in [0, image_size={image_size}); got {max_shift!r}")
        from sklearn.datasets import load_digits  # ships with scikit-learn, no download
        digits = load_digits()
        x = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16.0    # (1797, 1, 8, 8)
        x = F.interpolate(x, size=(image_size, image_size), mode="bilinear", align_corners=False)
        y = torch.tensor(digits.target, dtype=torch.long)
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(split_seed))
        n_test = int(round(test_fraction * len(y)))
        self.image_size, self.max_shift = image_size, max_shift
        mean, std = x[order[n_test:]].mean(), x[order[n_test:]].std()
        x = (x - mean) / std
        self.test_x, self.test_y = x[order[:n_test]], y[order[:n_test]]
        self.train_x, self.train_y = x[order[n_test:]], y[order[n_test:]]

    def subset(self, n: int) -> "DigitsTask":
        """A copy that trains on the first `n` images of the fixed training split (same test split and
        standardisation): the data-size sweep of the ViT chapter."""
        import copy
        if isinstance(n, bool) or not isinstance(n, int) or not 10 <= n <= len(self.train_y):
            raise ValueError(f"n must be an int in [10, {len(self.train_y)}]; got {n!r}")
        out = copy.copy(self)
        out.train_x, out.train_y = self.train_x[:n], self.train_y[:n]
        return out

    def train_batch(self, batch_size: int, generator: torch.Generator, causal: bool = False):
        """(images [B, 1, S, S], labels [B]) drawn with replacement, the whole batch rolled by one random shift."""
        idx = torch.randint(0, len(self.train_y), (batch_size,), generator=generator)
        x = self.train_x[idx]
        if self.max_shift:
            dy, dx = torch.randint(-self.max_shift, self.max_shift + 1, (2,), generator=generator).tolist()
            x = torch.roll(x, (dy, dx), dims=(-2, -1))
        return x, self.train_y[idx]

    @scoring
    def accuracy(self, model: nn.Module, split: str = "test", batch_size: int = 512, **forward_kwargs) -> float:
        """Fraction of `split` ("test" or "train") images classified correctly."""
        if split not in ("test", "train"):
            raise ValueError(f"split must be 'test' or 'train'; got {split!r}")
        xs, ys = (self.test_x, self.test_y) if split == "test" else (self.train_x, self.train_y)
        device, correct = next(model.parameters()).device, 0
        for i in range(0, len(ys), batch_size):
            pred = model(xs[i:i + batch_size].to(device), **forward_kwargs).argmax(-1).cpu()
            correct += int((pred == ys[i:i + batch_size]).sum())
        return correct / len(ys)
