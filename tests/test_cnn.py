"""How CNNs know position (Islam et al. 2020): equivariance claims per padding, and the read-out."""
import pytest
import torch
import torch.nn.functional as F

import posenc
from posenc.vision.cnn import PositionCNN, PositionTask, chance_error_px, position_loss, position_targets


def net(padding, dilations=(1, 2, 1)):
    return PositionCNN(padding, channels=6, dilations=dilations).eval()


def test_circular_padding_is_exactly_shift_equivariant():
    model, x = net("circular"), torch.randn(2, 1, 12, 12)
    for shift in ((3, 0), (0, 5), (-4, 7)):
        rolled = torch.roll(x, shift, dims=(-2, -1))
        assert torch.allclose(model(rolled), torch.roll(model(x), shift, dims=(-2, -1)), atol=1e-5)


def test_valid_padding_is_equivariant_to_shift_and_crop():
    model, x = net("valid"), torch.randn(2, 1, 20, 20)
    a, b = 3, 5
    assert model(x).shape[-1] == 20 - 2 * model.radius
    assert torch.allclose(model(x[..., a:, b:]), model(x)[..., a:, b:], atol=1e-5)


def test_zero_padding_is_equivariant_only_away_from_the_border():
    model, x = net("zero"), torch.randn(2, 1, 24, 24)
    r, s = model.radius, 2
    shifted = model(torch.roll(x, s, dims=-1))
    unshifted = torch.roll(model(x), s, dims=-1)
    inner = slice(r + s, 24 - r)  # locations whose receptive field never touches the border or the wrap
    assert torch.allclose(shifted[..., inner, inner], unshifted[..., inner, inner], atol=1e-5)
    assert not torch.allclose(shifted, unshifted, atol=1e-3)


def test_constant_image_reveals_position_only_with_zero_padding():
    x = torch.ones(1, 1, 16, 16)
    for padding, constant in (("zero", False), ("circular", True), ("valid", True)):
        out = net(padding)(x)
        assert bool((out - out[..., :1, :1]).abs().max() < 1e-5) == constant, padding


def test_targets_and_task_shapes():
    t = position_targets(5)
    assert t.shape == (2, 5, 5) and t[0, 0, 0] == -1 and t[1, 0, 4] == 1 and t[0, 4, 0] == 1
    assert chance_error_px(16) == 4.0
    model = net("valid")
    task = PositionTask(size=8, margin=model.margin)
    images, targets = task.batch(3, torch.Generator().manual_seed(0))
    assert images.shape == (3, 1, 8 + 2 * model.radius, 8 + 2 * model.radius) and targets.shape == (3, 2, 8, 8)
    assert model(images).shape == targets.shape
    assert task.error_map(model, n_samples=4).shape == (8, 8)


def test_bad_arguments():
    with pytest.raises(ValueError, match="padding"):
        PositionCNN("reflect")
    with pytest.raises(ValueError, match="dilations"):
        PositionCNN("zero", dilations=(1, 0))
    with pytest.raises(ValueError, match="size"):
        PositionTask(size=1)
    with pytest.raises(ValueError, match="margin"):
        net("valid")(torch.randn(1, 1, 8, 8))


def test_position_decodable_with_zero_padding_not_with_circular():
    results = {}
    for padding in ("zero", "circular"):
        torch.manual_seed(0)
        model = PositionCNN(padding, channels=8, dilations=(1, 2, 2))
        task = PositionTask(size=8, margin=model.margin)
        cfg = posenc.TrainConfig(steps=120, batch_size=8, lr=3e-3, warmup=10, progress=False, device="cpu")
        posenc.train(model, task, cfg, loss_fn=position_loss)
        results[padding] = task.evaluate(model, n_samples=64)["r2"]
    assert results["zero"] > 0.8 and abs(results["circular"]) < 0.05


def test_position_loss_is_the_mean_squared_error_of_the_map():
    """`position_loss` is the mean squared error between the predicted (row, col) map and the targets (not L1)."""
    torch.manual_seed(0)
    model = net("zero")
    images, targets = PositionTask(size=8).batch(3, torch.Generator().manual_seed(0))
    pred = model(images)
    expected = ((pred - targets) ** 2).mean()
    assert not torch.allclose(expected, (pred - targets).abs().mean())          # L1 would differ here
    assert torch.allclose(position_loss(model, images, targets), expected, rtol=1e-6, atol=0)
    assert torch.allclose(position_loss(model, images, targets), F.mse_loss(pred, targets), rtol=1e-6, atol=0)


class _Offset(torch.nn.Module):
    """Predicts every location's target plus a fixed (row, col) offset `d` in target units."""

    def __init__(self, size, d):
        super().__init__()
        self.size, self.d = size, torch.nn.Parameter(torch.tensor(d).view(1, 2, 1, 1))

    def forward(self, images):
        return position_targets(self.size).expand(len(images), -1, -1, -1) + self.d


@pytest.mark.parametrize("d, length", [((0.2, 0.0), 0.2), ((0.0, -0.2), 0.2), ((0.3, 0.4), 0.5)])
def test_error_map_is_the_euclidean_error_in_pixels(d, length):
    """Targets span [-1, 1] over size pixels, so an offset d (target units) is everywhere an error of
    |d| (size - 1) / 2 pixels, |d| the Euclidean length of (d_row, d_col)."""
    size = 8
    task = PositionTask(size=size)
    emap = task.error_map(_Offset(size, d), n_samples=4)
    assert emap.shape == (size, size)
    assert torch.allclose(emap, torch.full((size, size), length * (size - 1) / 2), rtol=1e-5, atol=1e-6)
    assert torch.allclose(task.error_map(_Offset(size, (0.0, 0.0)), n_samples=4), torch.zeros(size, size))
