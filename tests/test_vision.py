"""posenc.vision: patches, 2-D schemes, resizing a learned table, and the small ViT."""
import math

import pytest
import torch

import posenc
from posenc import vision as V
from posenc.absolute import sinusoidal_table

ViTConfig = pytest.importorskip("transformers").ViTConfig
from transformers.models.vit.modeling_vit import ViTEmbeddings  # noqa: E402


def tiny_vit(scheme, image_size=8, patch_size=2, **kw):
    kw = {"d_model": 32, "n_heads": 2, "n_layers": 2, "num_classes": 10, **kw}
    return V.build_vit(scheme, image_size=image_size, patch_size=patch_size, **kw).eval()


# -- interpolate_pos_embed (contract) against transformers ----------------------------------
@pytest.mark.parametrize("new_size", [(12, 12), (12, 16), (4, 6), (8, 8)])
def test_interpolate_pos_embed_equals_transformers_vit(new_size):
    """Same numbers as ViTEmbeddings.interpolate_pos_encoding (bicubic, size=, align_corners=False)."""
    cfg = ViTConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                    image_size=8, patch_size=2, num_channels=1)
    emb = ViTEmbeddings(cfg)
    with torch.no_grad():
        emb.position_embeddings.normal_()
    H, W = new_size
    n_new = (H // 2) * (W // 2)
    ref = emb.interpolate_pos_encoding(torch.zeros(1, 1 + n_new, 16), H, W)         # (1, 1+n_new, 16)
    ours = V.interpolate_pos_embed(emb.position_embeddings.detach()[0], (4, 4), (H // 2, W // 2), num_prefix_tokens=1)
    assert ours.shape == (1 + n_new, 16)
    torch.testing.assert_close(ours, ref[0].detach(), rtol=0, atol=1e-6)
    batched = V.interpolate_pos_embed(emb.position_embeddings.detach(), (4, 4), (H // 2, W // 2), num_prefix_tokens=1)
    torch.testing.assert_close(batched[0], ours)


def test_interpolate_keeps_the_cls_row_and_constant_tables():
    table = torch.randn(1 + 12, 8)
    table[1:] = torch.randn(8)                                  # the same vector at every patch
    out = V.interpolate_pos_embed(table, (3, 4), (5, 7), num_prefix_tokens=1)
    torch.testing.assert_close(out[0], table[0])
    torch.testing.assert_close(out[1:], table[1:2].expand(35, -1), rtol=0, atol=1e-5)
    same = V.interpolate_pos_embed(table[1:], (3, 4), (3, 4))    # no prefix; same grid: identity
    torch.testing.assert_close(same, table[1:], rtol=0, atol=1e-6)


def keys_cubic(t: float, a: float = -0.75) -> float:
    """Keys' cubic convolution kernel W(t) (a = -0.75, PyTorch's and OpenCV's choice)."""
    t = abs(t)
    if t <= 1:
        return (a + 2) * t ** 3 - (a + 3) * t ** 2 + 1
    return a * t ** 3 - 5 * a * t ** 2 + 8 * a * t - 4 * a if t < 2 else 0.0


def bicubic_loop(grid: torch.Tensor, new_h: int, new_w: int) -> torch.Tensor:
    """The naive separable sum: out[i, j] = sum_{m, n} W(y_i - m) W(x_j - n) grid[clamp(m), clamp(n)],
    at the sampling points y_i = (i + 1/2) h / h' - 1/2 (align_corners=False)."""
    h, w = grid.shape[:2]
    out = torch.zeros(new_h, new_w, *grid.shape[2:], dtype=torch.float64)
    for i in range(new_h):
        y = (i + 0.5) * h / new_h - 0.5
        for j in range(new_w):
            x = (j + 0.5) * w / new_w - 0.5
            for m in range(math.floor(y) - 1, math.floor(y) + 3):
                for n in range(math.floor(x) - 1, math.floor(x) + 3):
                    wgt = keys_cubic(y - m) * keys_cubic(x - n)
                    out[i, j] += wgt * grid[min(max(m, 0), h - 1), min(max(n, 0), w - 1)].double()
    return out


def test_interpolation_is_keys_bicubic_at_fractional_coordinates():
    """New patch (i, j) is the old table sampled at ((i + 1/2) h/h' - 1/2, (j + 1/2) w/w' - 1/2)."""
    table = torch.randn(3 * 4, 5)
    out = V.interpolate_pos_embed(table, (3, 4), (5, 7))              # (35, 5)
    ref = bicubic_loop(table.view(3, 4, 5), 5, 7).reshape(35, 5).float()
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)


def test_bicubic_a075_reproduces_constants_but_not_ramps_exactly():
    """Partition of unity holds; a linear ramp comes back within 3/64 of the sampled value (a = -0.75)."""
    r, c = V.grid_coords((6, 6))
    out = V.interpolate_pos_embed(torch.stack([r, c], -1), (6, 6), (12, 12))
    r2, c2 = V.grid_coords((12, 12), ref_grid=(6, 6))
    inside = (r2 >= 1) & (r2 <= 4) & (c2 >= 1) & (c2 <= 4)           # no clamped taps
    err = (out[inside] - torch.stack([r2, c2], -1)[inside]).abs()
    assert err.max() <= 3 / 64 + 1e-5 and err.max() > 1e-2


@pytest.mark.parametrize("args, name", [
    ((torch.randn(17, 8), (4, 5), (6, 6)), "old_grid"),                      # 4*5 != 16
    ((torch.randn(16, 8), (4, 4), (0, 6)), "new_grid"),
    ((torch.randn(16, 8), (4.0, 4), (6, 6)), "old_grid"),
    ((torch.randn(2, 16, 8), (4, 4), (6, 6)), "pos_embed"),
])
def test_interpolate_rejects_bad_input(args, name):
    with pytest.raises(ValueError, match=name):
        V.interpolate_pos_embed(*args)
    with pytest.raises(ValueError, match="num_prefix_tokens"):
        V.interpolate_pos_embed(torch.randn(17, 8), (4, 4), (6, 6), num_prefix_tokens=-1)


# -- image -> tokens ------------------------------------------------------------------------------
def test_patchify_is_raster_order_and_conv_is_a_linear_map_of_patches():
    images = torch.randn(2, 3, 8, 12)
    x = V.patchify(images, 4)                                        # (2, 6, 48)
    assert x.shape == (2, 6, 48)
    for n in range(6):
        r, c = divmod(n, 3)
        torch.testing.assert_close(x[:, n], images[:, :, 4 * r:4 * r + 4, 4 * c:4 * c + 4].flatten(1))
    embed = V.PatchEmbed(3, 16, 4)
    tokens, grid = embed(images)
    assert grid == (2, 3)
    linear = x @ embed.proj.weight.flatten(1).T + embed.proj.bias   # x_p E + b, ViT Eq. (1)
    torch.testing.assert_close(tokens, linear, rtol=1e-5, atol=1e-5)


def test_image_size_not_divisible_by_patch_size_is_a_clear_error():
    with pytest.raises(ValueError, match="patch_size"):
        V.patchify(torch.randn(1, 1, 10, 8), 4)
    with pytest.raises(ValueError, match="patch_size"):
        tiny_vit("learned")(torch.randn(1, 1, 9, 8))
    with pytest.raises(ValueError, match="patch_size"):
        V.build_vit("learned", image_size=10, patch_size=4, num_classes=10)
    with pytest.raises(ValueError, match="images"):
        tiny_vit("none")(torch.randn(1, 8, 8))


# -- the 2-D schemes ------------------------------------------------------------------------------
def test_sincos2d_is_the_1d_table_per_axis_and_zero_for_cls():
    model = tiny_vit("sincos2d", d_model=16)
    ctx = V.GridContext(torch.arange(1 + 12), causal=False, has_cls=True, grid=(3, 4))
    out = model.scheme.embed(torch.zeros(1, 13, 16), ctx)[0]         # (13, 16)
    assert out[0].abs().max() == 0
    expect = torch.cat([sinusoidal_table(3, 8).repeat_interleave(4, 0), sinusoidal_table(4, 8).repeat(3, 1)], -1)
    torch.testing.assert_close(out[1:], expect)
    with pytest.raises(ValueError, match="d_model"):
        tiny_vit("sincos2d", d_model=18, n_heads=2)


def test_ref_grid_coordinates_are_the_identity_on_the_training_grid():
    r, c = V.grid_coords((4, 5))
    r2, c2 = V.grid_coords((4, 5), ref_grid=(4, 5))
    torch.testing.assert_close((r, c), (r2, c2))
    r3, _ = V.grid_coords((8, 5), ref_grid=(4, 5))
    torch.testing.assert_close(r3[::5], torch.tensor([-0.25, 0.25, 0.75, 1.25, 1.75, 2.25, 2.75, 3.25]))


def test_axial_rope_scores_depend_only_on_the_2d_offset():
    """<R(r_m, c_m) q, R(r_n, c_n) k> is unchanged when every (r, c) moves by the same offset."""
    q, k = torch.randn(2, 3, 12, 16), torch.randn(2, 3, 12, 16)
    r, c = V.grid_coords((3, 4))
    scores = V.axial_rope(q, r, c) @ V.axial_rope(k, r, c).transpose(-1, -2)
    moved = V.axial_rope(q, r + 5, c - 2.5) @ V.axial_rope(k, r + 5, c - 2.5).transpose(-1, -2)
    torch.testing.assert_close(moved, scores, rtol=1e-4, atol=1e-4)
    swapped = V.axial_rope(q, c, r) @ V.axial_rope(k, c, r).transpose(-1, -2)   # rows and columns differ
    assert not torch.allclose(swapped, scores, atol=1e-3)


def test_axial_rope_equals_rotary_embedding_torch_axial_freqs():
    rotary = pytest.importorskip("rotary_embedding_torch")
    h, w, d = 3, 5, 16
    rot = rotary.RotaryEmbedding(dim=d // 2, theta=100)             # per axis: d/2 dims, interleaved pairs
    freqs = rot.get_axial_freqs(h, w)                               # (h, w, d)
    x = torch.randn(2, h, w, d)
    ref = rotary.apply_rotary_emb(freqs, x).flatten(1, 2)           # (2, h*w, d)
    r, c = V.grid_coords((h, w))
    torch.testing.assert_close(V.axial_rope(x.flatten(1, 2), r, c, base=100.0), ref, rtol=1e-5, atol=1e-5)


def test_rope2d_leaves_cls_unrotated_and_checks_head_dim():
    model = tiny_vit("rope2d")
    q, k = torch.randn(1, 2, 17, 16), torch.randn(1, 2, 17, 16)
    ctx = V.GridContext(torch.arange(17), causal=False, has_cls=True, grid=(4, 4))
    q2, k2 = model.scheme.transform_qk(q, k, ctx)
    torch.testing.assert_close(q2[..., 0, :], q[..., 0, :])
    torch.testing.assert_close(q2[..., 1, :], q[..., 1, :])        # patch (0, 0): angle 0
    assert not torch.allclose(k2[..., 2:, :], k[..., 2:, :])
    with pytest.raises(ValueError, match="head_dim"):
        tiny_vit("rope2d", d_model=20, n_heads=2)
    with pytest.raises(TypeError, match="GridContext"):
        model.scheme.transform_qk(q, k, posenc.PositionContext(torch.arange(17), causal=False))


@pytest.mark.parametrize("grid, ref_grid", [((2, 4), None), ((4, 2), None), ((3, 6), (2, 4))])
def test_rope2d_rotates_each_patch_by_its_own_row_and_column(grid, ref_grid):
    """The scheme is `axial_rope` at the grid's coordinates (rows in the first half of each head, columns in
    the second), in the training grid's units under `ref_grid`; [CLS] is left as it is. A non-square grid
    tells rows from columns."""
    torch.manual_seed(0)
    model = tiny_vit("rope2d")
    n = 1 + grid[0] * grid[1]
    q, k = torch.randn(1, 2, n, 16), torch.randn(1, 2, n, 16)
    ctx = V.GridContext(torch.arange(n), causal=False, has_cls=True, grid=grid, ref_grid=ref_grid)
    q2, k2 = model.scheme.transform_qk(q, k, ctx)
    rows, cols = V.grid_coords(grid, ref_grid)
    for x, x2 in ((q, q2), (k, k2)):
        torch.testing.assert_close(x2[..., 0, :], x[..., 0, :])
        torch.testing.assert_close(x2[..., 1:, :], V.axial_rope(x[..., 1:, :], rows, cols, 100.0))
    swapped = V.axial_rope(q[..., 1:, :], cols, rows, 100.0)
    assert not torch.allclose(q2[..., 1:, :], swapped, atol=1e-4)


# -- the ViT --------------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", sorted(V.VISION_SCHEMES))
@pytest.mark.parametrize("stem", ["patch", "cnn"])
def test_every_vision_scheme_runs_forward_and_backward(scheme, stem):
    model = tiny_vit(scheme, stem=stem).train()
    logits = model(torch.randn(3, 1, 8, 8))
    assert logits.shape == (3, 10)
    logits.logsumexp(-1).mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    maps = model.attention_maps(torch.randn(2, 1, 8, 8))
    assert len(maps) == 2 and maps[0].shape == (2, 2, 17, 17)


def test_fixed_schemes_serve_any_resolution_the_learned_table_must_be_resized():
    images = torch.randn(2, 1, 12, 12)                               # a 6 x 6 grid instead of 4 x 4
    for scheme in ("none", "sincos2d", "rope2d"):
        assert tiny_vit(scheme)(images).shape == (2, 10)
    model = tiny_vit("learned")
    with pytest.raises(ValueError, match="resize_"):
        model(images)
    old = model.scheme.table.detach().clone()
    model.scheme.resize_((6, 6), mode="interpolate")
    assert model(images).shape == (2, 10)
    torch.testing.assert_close(model.scheme.table[0], old[0])          # [CLS] row kept
    torch.testing.assert_close(model.scheme.table.detach(),            # ViT's bicubic 2-D resize of the patch rows
                               V.interpolate_pos_embed(old, (4, 4), (6, 6), num_prefix_tokens=1))
    resized = model.scheme.table.detach().clone()
    model.scheme.resize_((4, 4), mode="extend")                          # back to 17 rows: first rows kept
    assert model.scheme.table.shape == (17, 32)
    torch.testing.assert_close(model.scheme.table.detach(), resized[:17])
    model.scheme.resize_((5, 5), mode="extend")                          # grown: the 17 rows, then zero rows
    torch.testing.assert_close(model.scheme.table.detach()[:17], resized[:17])
    assert model.scheme.table.shape == (26, 32) and not model.scheme.table.detach()[17:].any()
    with pytest.raises(ValueError, match="mode"):
        model.scheme.resize_((6, 6), mode="crop")


def test_sincos2d_with_ref_grid_is_unchanged_at_the_training_grid():
    model = tiny_vit("sincos2d")
    images = torch.randn(2, 1, 8, 8)
    torch.testing.assert_close(model(images, ref_grid=(4, 4)), model(images))


def test_bidirectional_vit_without_positions_ignores_patch_order():
    """No position: shuffling the patches (with a 1x1-patch model) leaves the [CLS] output unchanged."""
    model = tiny_vit("none", patch_size=1, image_size=4)
    images = torch.randn(2, 1, 4, 4)
    perm = torch.randperm(16)
    shuffled = images.flatten(2)[..., perm].view(2, 1, 4, 4)
    torch.testing.assert_close(model(shuffled), model(images), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(tiny_vit("learned", patch_size=1, image_size=4)(shuffled),
                              tiny_vit("learned", patch_size=1, image_size=4)(images), atol=1e-4)


def test_unknown_vision_scheme_and_stem():
    with pytest.raises(ValueError, match="known"):
        V.build_vit("alibi", image_size=8, patch_size=2, num_classes=10)
    with pytest.raises(ValueError, match="stem"):
        tiny_vit("none", stem="resnet")


# -- data and training ------------------------------------------------------------------------------
def test_digits_task_shapes_split_and_determinism():
    task = V.DigitsTask(16)
    assert task.train_x.shape[1:] == (1, 16, 16) and len(task.test_y) + len(task.train_y) == 1797
    assert abs(float(task.train_x.mean())) < 1e-4 and abs(float(task.train_x.std()) - 1) < 1e-3
    a = task.train_batch(8, torch.Generator().manual_seed(3))
    b = task.train_batch(8, torch.Generator().manual_seed(3))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    with pytest.raises(ValueError, match="image_size"):
        V.DigitsTask(4)


def test_a_small_vit_learns_digits():
    torch.manual_seed(0)
    task = V.DigitsTask(8)
    model = V.build_vit("sincos2d", image_size=8, patch_size=2, num_classes=10, d_model=32, n_heads=2, n_layers=1)
    cfg = posenc.TrainConfig(steps=150, batch_size=64, lr=3e-3, warmup=20, progress=False)
    posenc.train(model, task, cfg, loss_fn=V.classification_loss)
    assert task.accuracy(model) > 0.3                                # chance is 0.1


def test_patch_similarity_grid_plot_and_bad_grid():
    import matplotlib.pyplot as plt
    ax = posenc.plots.patch_similarity_grid(torch.randn(12, 8), (3, 4), title="t")
    image = ax.images[0].get_array()
    assert image.shape == (3 * 4 - 1, 4 * 5 - 1)                  # h*(h+1)-1 by w*(w+1)-1 tiles with gaps
    assert abs(float(image[0, 0]) - 1) < 1e-5                      # patch (0, 0) with itself
    plt.close("all")
    with pytest.raises(ValueError, match="grid"):
        posenc.plots.patch_similarity_grid(torch.randn(12, 8), (4, 4))


def test_grid_similarity_of_an_axial_table():
    """A table made of one vector per row plus one per column has positive row/column excess;
    a random table has about none; the numbers are cosine means by relation."""
    from posenc.vision import grid_similarity
    torch.manual_seed(0)
    h = w = 6
    rows, cols = torch.randn(h, 64), torch.randn(w, 64)
    axial = (rows[:, None] + cols[None]).reshape(h * w, 64)
    got = grid_similarity(axial, (h, w))
    assert got["same row"] == pytest.approx(0.5, abs=0.15) and got["same column"] == pytest.approx(0.5, abs=0.15)
    assert got["row_column_excess"] > 0.3
    assert abs(grid_similarity(torch.randn(h * w, 256), (h, w))["row_column_excess"]) < 0.05
    with pytest.raises(ValueError, match="table"):
        grid_similarity(torch.randn(10, 4), (h, w))


def test_grid_similarity_tells_rows_and_columns_from_nearness():
    """A table that knows only the distance between patches (random Fourier features of the 2-D
    coordinates: cosines depend on the offset's length) scores on the row/column excess too, since
    grid neighbours are same-row-or-column pairs; line_over_diagonal is negative for it, positive
    for a table of rows plus columns, and about 0 for noise."""
    from posenc.vision import grid_similarity
    from posenc.vision import grid_coords
    torch.manual_seed(0)
    h = w = 8
    xy = torch.stack(grid_coords((h, w)), 1).float()                               # (hw, 2): row, column
    for sigma in (0.3, 0.5, 0.8):                                                  # how fast nearness decays
        freqs, phase = torch.randn(2048, 2) * sigma, torch.rand(2048) * 2 * math.pi
        nearness = grid_similarity(torch.cos(xy @ freqs.T + phase), (h, w))
        assert nearness["row_column_excess"] > 0.1 and nearness["line_over_diagonal"] < -0.05
        assert nearness["diagonal neighbours"] > nearness["two apart in a line"]
    axial = (torch.randn(h, 64)[:, None] + torch.randn(w, 64)[None]).reshape(h * w, 64)
    assert grid_similarity(axial, (h, w))["line_over_diagonal"] > 0.3
    assert abs(grid_similarity(torch.randn(h * w, 256), (h, w))["line_over_diagonal"]) < 0.05


def test_digits_subset_keeps_the_split_and_the_first_images():
    from posenc.vision import DigitsTask
    task = DigitsTask(16)
    small = task.subset(100)
    assert torch.equal(small.train_x, task.train_x[:100]) and torch.equal(small.test_x, task.test_x)
    assert len(task.train_y) == 1348 and len(small.train_y) == 100
    for bad in (5, 2000, 1.5, True):
        with pytest.raises(ValueError, match="n must"):
            task.subset(bad)


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_classes=0), "num_classes must be a positive int"),
    (dict(num_classes=2.5), "num_classes must be a positive int"),
    (dict(n_heads=0), "n_heads must be a positive int"),
    (dict(d_model=0), "d_model must be a positive int"),
    (dict(image_size=-8), "image_size must be a positive int"),
    (dict(patch_size=0, stem="cnn"), "patch_size must be a positive int"),
    (dict(dropout=1.0), "dropout must be a number in"),
    (dict(d_ff=0), "d_ff must be a positive int or None"),
])
def test_build_vit_names_a_bad_size(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tiny_vit("sincos2d", **kwargs)


def test_a_vit_refuses_a_scheme_built_for_another_model_and_patchify_a_bad_patch():
    scheme = V.VISION_SCHEMES["rope2d"](d_model=32, n_heads=4, n_layers=2, max_len=17, causal=False)
    with pytest.raises(ValueError, match="scheme n_heads=4 but ViT n_heads=2"):
        V.ViT(scheme, patch_size=2, num_classes=10, d_model=32, n_heads=2, n_layers=2)
    for bad in (0, 2.0):
        with pytest.raises(ValueError, match="patch_size must be a positive int"):
            V.patchify(torch.randn(1, 1, 8, 8), bad)
    with pytest.raises(ValueError, match="at least two rows and two columns"):
        V.grid_similarity(torch.randn(4, 8), (1, 4))


@pytest.mark.parametrize("stem", ["patch", "cnn"])
def test_images_with_other_channels_than_the_stem_are_refused_by_name(stem):
    """Three-channel images to a one-channel stem failed inside the convolution ("expected input ... to have 1
    channels"); the model names its in_channels."""
    model = V.build_vit("rope2d", image_size=8, patch_size=2, num_classes=3, stem=stem)
    with pytest.raises(ValueError, match="images have 3 channels but the model was built for in_channels=1"):
        model(torch.randn(2, 3, 8, 8))
    assert model(torch.randn(2, 1, 8, 8)).shape == (2, 3)


@pytest.mark.parametrize("stem", ["patch", "cnn"])
def test_images_of_another_dtype_than_the_model_are_refused_by_name(stem):
    """numpy's float64 images met float32 weights in the convolution: "Input type (double) and bias type
    (float) should be the same". Under autocast the convolution casts half-precision images, not float64."""
    model = V.build_vit("sincos2d", image_size=16, patch_size=4, num_classes=10, stem=stem)
    images = torch.rand(2, 1, 16, 16)
    with pytest.raises(TypeError, match="images must have the model's dtype, torch.float32; got torch.float64"):
        model(images.double())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(images.bfloat16()).shape == (2, 10)                       # autocast casts these
        with pytest.raises(TypeError, match="got torch.float64"):
            model(images.double())                                              # but never float64
    assert model.double()(images.double()).dtype == torch.float64                 # a float64 model takes them


def test_grid_similarity_groups_are_the_hand_counted_pair_means():
    """On a 3x3 grid every group is the mean cosine over the ordered pairs its docstring names: same row and
    same column at distance >= 2 (so not the neighbours), neighbours at |dr| + |dc| = 1, diagonal neighbours,
    two apart in a line, and different row and column; the two summary numbers are differences of those."""
    g = torch.Generator().manual_seed(0)
    h = w = 3
    table = torch.randn(h * w, 16, generator=g, dtype=torch.float64)
    got = V.grid_similarity(table, (h, w))
    unit = table / table.norm(dim=-1, keepdim=True)
    pairs = {name: [] for name in ("neighbours", "same row", "same column", "different row and column",
                                   "diagonal neighbours", "two apart in a line", "line")}
    for i in range(h * w):
        for j in range(h * w):
            (ri, ci), (rj, cj) = divmod(i, w), divmod(j, w)
            dr, dc, cos = abs(ri - rj), abs(ci - cj), float(unit[i] @ unit[j])
            if dr + dc == 1:
                pairs["neighbours"].append(cos)
            if dr == 0 and dc >= 2:
                pairs["same row"].append(cos)
            if dc == 0 and dr >= 2:
                pairs["same column"].append(cos)
            if dr > 0 and dc > 0:
                pairs["different row and column"].append(cos)
            if dr == 1 and dc == 1:
                pairs["diagonal neighbours"].append(cos)
            if dr + dc == 2 and (dr == 0 or dc == 0):
                pairs["two apart in a line"].append(cos)
            if (dr == 0 or dc == 0) and i != j:
                pairs["line"].append(cos)
    mean = {name: sum(v) / len(v) for name, v in pairs.items()}
    assert len(pairs["same row"]) == len(pairs["same column"]) == 6          # (c0, c2) and back, per row
    for name in ("neighbours", "same row", "same column", "different row and column", "diagonal neighbours",
                 "two apart in a line"):
        assert got[name] == pytest.approx(mean[name], abs=1e-6), name
    assert got["row_column_excess"] == pytest.approx(mean["line"] - mean["different row and column"], abs=1e-6)
    assert got["line_over_diagonal"] == pytest.approx(mean["two apart in a line"] - mean["diagonal neighbours"],
                                                      abs=1e-6)


def test_patch_table_is_the_table_without_its_cls_row():
    """`PatchLearned.patch_table()` is rows 1.. of the learned table (row 0 is [CLS]): h*w rows in raster order."""
    torch.manual_seed(0)
    s = V.PatchLearned(grid=(3, 4), d_model=8, n_heads=2, n_layers=1, max_len=13, causal=False)
    assert s.table.shape == (13, 8)
    assert torch.equal(s.patch_table(), s.table[1:]) and s.patch_table().shape == (12, 8)
    assert not torch.equal(s.patch_table()[0], s.table[0])                      # the [CLS] row stays out


def test_digit_shifts_reach_both_ends_of_max_shift():
    """Training shifts are drawn uniformly from -max_shift..max_shift per axis (one per batch): over 200 batches
    with max_shift=1 each axis is rolled by -1, 0 and +1, and by nothing else."""
    task = V.DigitsTask(8, max_shift=1)
    pattern = torch.arange(64, dtype=torch.float32).view(1, 1, 8, 8)            # every roll is distinguishable
    task.train_x, task.train_y = pattern, torch.tensor([3])
    rolls = {(dy, dx): torch.roll(pattern, (dy, dx), dims=(-2, -1))[0] for dy in (-1, 0, 1) for dx in (-1, 0, 1)}
    g, seen = torch.Generator().manual_seed(0), set()
    for _ in range(200):
        x, y = task.train_batch(4, g)
        assert (y == 3).all()
        match = [s for s, r in rolls.items() if all(torch.equal(row, r) for row in x)]
        assert len(match) == 1
        seen.add(match[0])
    assert {dy for dy, _ in seen} == {-1, 0, 1} and {dx for _, dx in seen} == {-1, 0, 1}


def test_digits_accuracy_scores_the_split_it_names():
    """accuracy("test") runs the model on exactly the test images (in batches) and compares with the test labels;
    accuracy("train") on exactly the training images."""
    task = V.DigitsTask(8)

    class Zero(torch.nn.Module):
        """Predicts class 0 for every image and keeps what it was shown."""

        def __init__(self):
            super().__init__()
            self.w, self.seen = torch.nn.Parameter(torch.zeros(1)), []

        def forward(self, x):
            self.seen.append(x)
            logits = torch.zeros(len(x), 10)
            logits[:, 0] = 1.0
            return logits

    for split, xs, ys in (("test", task.test_x, task.test_y), ("train", task.train_x, task.train_y)):
        model = Zero()
        acc = task.accuracy(model, split, batch_size=100)
        assert sum(len(x) for x in model.seen) == len(ys)
        assert torch.equal(torch.cat(model.seen), xs)
        assert acc == int((ys == 0).sum()) / len(ys)
    assert len(task.test_y) != len(task.train_y)
