"""Learned, sinusoidal and multiplicative absolute encodings (posenc.absolute)."""
import math

import pytest
import torch

import posenc
from posenc.absolute import (extend_learned_table, sinusoidal_at, sinusoidal_shift_matrix, sinusoidal_table)
from conftest import small_model


def test_table_layout_is_interleaved_sin_cos():
    pe = sinusoidal_table(50, 16)
    p, i = torch.arange(50.0)[:, None], torch.arange(8.0)[None]
    torch.testing.assert_close(pe[:, 0::2], torch.sin(p / 10000 ** (2 * i / 16)))
    torch.testing.assert_close(pe[:, 1::2], torch.cos(p / 10000 ** (2 * i / 16)))


def test_matches_transformers_distilbert_interleaved():
    """DistilBERT's `create_sinusoidal_embeddings` is interleaved like ours (sin at 2i, cos at 2i+1)."""
    from transformers.models.distilbert.modeling_distilbert import create_sinusoidal_embeddings
    ref = create_sinusoidal_embeddings(64, 32, torch.empty(64, 32))
    torch.testing.assert_close(sinusoidal_table(64, 32), ref, rtol=0, atol=1e-6)


def test_matches_transformers_marian_after_permutation():
    """Marian's table is in the half layout [sin_0..sin_{d/2-1}, cos_0..cos_{d/2-1}];
    ours is interleaved [sin_0, cos_0, sin_1, cos_1, ...]: equal after the column permutation."""
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding
    ref = MarianSinusoidalPositionalEmbedding(64, 32).create_weight()
    perm = torch.arange(32).view(2, 16).T.flatten()          # 0, 16, 1, 17, ...: half -> interleaved
    torch.testing.assert_close(sinusoidal_table(64, 32), ref[:, perm], rtol=0, atol=1e-6)


@pytest.mark.parametrize("k", [1, 5, -3, 2.5])
def test_shift_is_a_fixed_rotation(k):
    """PE(p + k) = M_k PE(p) for every p, with M_k block-diagonal orthogonal (independent of p)."""
    p = torch.rand(40) * 500 + 3
    m = sinusoidal_shift_matrix(k, 24)
    torch.testing.assert_close(sinusoidal_at(p + k, 24), sinusoidal_at(p, 24) @ m.T, rtol=0, atol=1e-4)
    torch.testing.assert_close(m @ m.T, torch.eye(24), rtol=0, atol=1e-6)


def test_dot_product_depends_only_on_offset_and_is_symmetric():
    """PE(p).PE(p+k) = sum_i cos(w_i k): the same for every p and for +k and -k."""
    p, k = torch.rand(30) * 300 + 50, 7.0
    dots_right = (sinusoidal_at(p, 32) * sinusoidal_at(p + k, 32)).sum(-1)
    dots_left = (sinusoidal_at(p, 32) * sinusoidal_at(p - k, 32)).sum(-1)
    w = 10000 ** (-torch.arange(0, 32, 2) / 32)
    expected = torch.cos(w * k).sum().float()
    torch.testing.assert_close(dots_right, expected.expand(30), rtol=0, atol=1e-4)
    torch.testing.assert_close(dots_left, dots_right, rtol=0, atol=1e-4)


def test_wavelengths_are_geometric_from_2pi_to_base_2pi():
    """Pair i of the table turns at w_i = base^(-2i/d): wavelengths 2 pi / w_i run geometrically from 2 pi
    (pair 0) towards 2 pi base, by a factor base^(2/d) per pair. Read off the implementation: pair i's
    angle at position 1 is w_i itself, and its sine and cosine columns come back to their start after
    one wavelength."""
    from posenc.absolute import sinusoidal_angles
    w = sinusoidal_angles(torch.tensor([1.0]), 64)[0]                     # angle per unit position
    lam = 2 * math.pi / w
    ratios = lam[1:] / lam[:-1]
    torch.testing.assert_close(ratios, torch.full_like(ratios, 10000 ** (2 / 64)))
    assert lam[0] == pytest.approx(2 * math.pi) and 2 * math.pi * 7000 < lam[-1] < 2 * math.pi * 10000
    for i in (0, 5, 11):                                                  # one full turn later: the same row values
        pe = sinusoidal_at(torch.tensor([3.0, 3.0 + float(lam[i])]), 64)
        torch.testing.assert_close(pe[1, 2 * i:2 * i + 2], pe[0, 2 * i:2 * i + 2], rtol=0, atol=1e-4)


@pytest.mark.parametrize("dim", [7, 0, 3.0])
def test_odd_or_bad_dim_is_rejected(dim):
    with pytest.raises(ValueError, match="dim"):
        sinusoidal_table(10, dim)


def test_odd_model_width_is_rejected_by_the_scheme():
    with pytest.raises(ValueError, match="d_model"):
        posenc.build_model("sinusoidal", 10, causal=True, d_model=33, n_heads=1)


@pytest.mark.parametrize("scheme", ["learned", "multiplicative"])
def test_sequence_longer_than_table_is_a_clear_error(scheme):
    model = small_model(scheme, max_len=16)
    model(torch.randint(0, 23, (2, 16)))
    with pytest.raises(ValueError, match=r"^positions reach 16, but the learned table has 16 rows \(positions 0 to "
                                         r"15\); build with a larger max_len"):
        model(torch.randint(0, 23, (2, 17)))
    classifier = small_model(scheme, max_len=16, causal=False, cls_token=True, num_classes=2)
    classifier.classify(torch.randint(0, 23, (2, 16)))                  # max_len counts tokens; [CLS] has its own row
    with pytest.raises(ValueError, match=r"positions reach 17, a \[CLS\] token at position 0 included, but the "
                                         r"learned table has 17 rows"):
        classifier.classify(torch.randint(0, 23, (2, 17)))


@pytest.mark.parametrize("bad", [torch.arange(5.0) + 0.5, torch.arange(5) - 2])
def test_learned_rejects_fractional_or_negative_positions(bad):
    with pytest.raises(ValueError, match="positions"):
        small_model("learned")(torch.randint(0, 23, (1, 5)), bad)


def test_sinusoidal_rejects_negative_positions():
    with pytest.raises(ValueError, match="positions"):
        small_model("sinusoidal")(torch.randint(0, 23, (1, 5)), torch.arange(5) - 2)


def test_clamp_reuses_the_last_row():
    model = small_model("learned", max_len=8, overflow="clamp")
    h = model.scheme.rows(model.context(12, None, "cpu"))
    torch.testing.assert_close(h[8:], model.scheme.table[7].expand(4, -1))


def test_embeddings_add_and_multiply_the_table():
    x = torch.randn(2, 6, 32)
    for name, op in (("learned", torch.add), ("multiplicative", torch.mul)):
        model = small_model(name)
        ctx = model.context(6, None, "cpu")
        torch.testing.assert_close(model.scheme.embed(x, ctx), op(x, model.scheme.table[:6]))


def test_sinusoidal_scale_matches_token_rms_at_init():
    """The documented choice: s * PE starts with the RMS (0.02) of the N(0, 0.02) token embeddings."""
    model = small_model("sinusoidal", d_model=64)
    pe = model.scheme.scale * sinusoidal_table(512, 64)
    assert pe.pow(2).mean().sqrt().item() == pytest.approx(0.02, rel=0.01)
    assert model.scheme.scale.requires_grad
    fixed = small_model("sinusoidal", scale=1.0)
    assert not any(p is fixed.scheme.scale for p in fixed.parameters())


def test_sinusoidal_vaswani_scales_tokens_by_sqrt_d():
    """Vaswani et al. section 3.4: h = sqrt(d) x + PE, the table unscaled and nothing trainable added."""
    model = small_model("sinusoidal", d_model=64, scale="vaswani")
    x, ctx = torch.randn(2, 6, 64), model.context(6, None, "cpu")
    torch.testing.assert_close(model.scheme.embed(x, ctx), 8.0 * x + sinusoidal_table(6, 64))
    assert list(model.scheme.parameters()) == []
    with pytest.raises(ValueError, match="scale must be"):
        small_model("sinusoidal", scale="sqrt")


def test_unseen_rows_get_no_gradient():
    """Rows of a learned table beyond the training length never receive a gradient."""
    model = small_model("learned", max_len=32).train()
    model(torch.randint(0, 23, (4, 10))).sum().backward()
    g = model.scheme.table.grad
    assert g[:10].abs().sum(-1).gt(0).all() and g[10:].abs().sum() == 0


@pytest.mark.parametrize("init", ["random", "copy", "interpolate"])
def test_extend_learned_table(init):
    model = small_model("learned", max_len=8)
    old = model.scheme.table.detach().clone()
    extend_learned_table(model, 20, init)
    new = model.scheme.table
    assert new.shape == (20, 32) and model.scheme.max_len == 20 and new.requires_grad
    model(torch.randint(0, 23, (2, 20)))                                     # no longer an error
    if init == "copy":
        torch.testing.assert_close(new[8:16], old)
    if init == "interpolate":                   # row p sits at old position t = p (L - 1) / (n - 1), linearly
        t = torch.arange(20, dtype=torch.float64) * 7 / 19
        lo, frac = t.floor().long(), (t - t.floor()).float()[:, None]
        hi = (lo + 1).clamp(max=7)
        torch.testing.assert_close(new.detach(), (1 - frac) * old[lo] + frac * old[hi])
        assert 0.2 < float(frac[1]) < 0.8                  # a row between two old rows, not on one
    else:
        torch.testing.assert_close(new[:8], old)


@pytest.mark.parametrize("scheme, mean, std", [("learned", 0.0, 0.02), ("multiplicative", 1.0, 0.5)])
def test_extend_random_draws_new_rows_as_the_table_was_drawn(scheme, mean, std):
    torch.manual_seed(0)
    model = small_model(scheme, max_len=8, d_model=64)
    extend_learned_table(model, 264, "random")
    new = model.scheme.table.detach()[8:]                                   # 256 x 64 fresh values
    assert abs(new.mean().item() - mean) < 0.1 * std and abs(new.std().item() / std - 1) < 0.05


def test_extend_rejects_bad_arguments():
    model = small_model("learned", max_len=8)
    with pytest.raises(ValueError, match="init"):
        extend_learned_table(model, 16, "zeros")
    with pytest.raises(ValueError, match="new_len"):
        extend_learned_table(model, 8)
    with pytest.raises(TypeError, match="learned"):
        extend_learned_table(small_model("sinusoidal"), 16)


def test_multiplicative_logits_are_one_position_modulated_bilinear_form():
    """(x_i*m_i) W (x_j*m_j)^T = x_i diag(m_i) W diag(m_j) x_j^T: no position-only term.

    Through the schemes' own embeddings: with the content x = 0, the additive (learned) scheme's logits
    keep the p-p term, the multiplicative ones vanish."""
    torch.manual_seed(0)
    d, n = 16, 5
    x, w = torch.randn(1, n, d), torch.randn(d, d)
    ctx = posenc.PositionContext(torch.arange(n), True, start=0)
    mul, add = (small_model(s, d_model=d, n_heads=2).scheme for s in ("multiplicative", "learned"))
    m, p = mul.rows(ctx).detach(), add.rows(ctx).detach()
    with torch.no_grad():
        e_mul, e_add = mul.embed(x, ctx)[0], add.embed(x, ctx)[0]
        direct = torch.stack([torch.stack([x[0, i] @ torch.diag(m[i]) @ w @ torch.diag(m[j]) @ x[0, j]
                                           for j in range(n)]) for i in range(n)])
        torch.testing.assert_close(e_mul @ w @ e_mul.T, direct, rtol=1e-4, atol=1e-4)
        xx = x[0]
        four = xx @ w @ xx.T + xx @ w @ p.T + p @ w @ xx.T + p @ w @ p.T
        torch.testing.assert_close(e_add @ w @ e_add.T, four, rtol=1e-4, atol=1e-4)
        zero = torch.zeros(1, n, d)
        assert mul.embed(zero, ctx).abs().max() == 0                      # no position-only logit
        torch.testing.assert_close(add.embed(zero, ctx)[0], p)            # the p-p term survives
        assert (p @ w @ p.T).abs().max() > 0


def test_consecutive_positions_read_the_table_as_a_slice_with_the_same_values_and_gradients():
    import posenc
    torch.manual_seed(0)
    scheme = posenc.build_model("learned", 20, causal=True, d_model=16, n_heads=2, n_layers=1, max_len=64).scheme
    pos, w = torch.arange(9) + 5, torch.randn(9, 16)
    ctx = posenc.PositionContext(pos, True, start=5)          # what the model builds for default positions
    sliced = scheme.rows(ctx)
    assert sliced._base is scheme.table or sliced.data_ptr() == scheme.table[5].data_ptr()   # a view, no gather
    (sliced * w).sum().backward()
    g_slice = scheme.table.grad.clone()
    scheme.table.grad = None
    (scheme.table[pos] * w).sum().backward()                          # the gather it replaces
    torch.testing.assert_close(sliced, scheme.table[pos], rtol=0, atol=0)
    torch.testing.assert_close(g_slice, scheme.table.grad, rtol=0, atol=0)
