"""ALiBi: slopes and bias against two independent implementations, and its invariances."""
import pytest
import torch
from transformers.models.bloom.modeling_bloom import build_alibi_tensor
from x_transformers.x_transformers import AlibiPositionalBias

import posenc
from posenc.alibi import alibi_bias, alibi_slopes
from conftest import small_model


@pytest.mark.parametrize("heads", [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 24, 32, 48])
def test_slopes_equal_bloom(heads):
    """BLOOM's alibi tensor is slope_h * key position; at key position 1 it is the slope."""
    ref = build_alibi_tensor(torch.ones(1, 3), heads, torch.float32)[:, 0, 1]
    torch.testing.assert_close(alibi_slopes(heads), ref)


def test_power_of_two_slopes_are_the_papers_geometric_sequence():
    torch.testing.assert_close(alibi_slopes(8), 2.0 ** -torch.arange(1.0, 9.0))
    torch.testing.assert_close(alibi_slopes(16), 2.0 ** (-0.5 * torch.arange(1.0, 17.0)))


@pytest.mark.parametrize("heads", [4, 6, 12])
def test_bias_equals_x_transformers(heads):
    ref = AlibiPositionalBias(heads=heads, total_heads=heads)(11, 11)
    torch.testing.assert_close(alibi_bias(torch.arange(11), alibi_slopes(heads)), ref)


def test_bias_depends_on_distance_only():
    pos = torch.randint(-1000, 1000, (9,)).float()
    slopes = alibi_slopes(4)
    b = alibi_bias(pos, slopes)
    torch.testing.assert_close(b, alibi_bias(pos + 12345.0, slopes))
    torch.testing.assert_close(b, b.transpose(1, 2))
    torch.testing.assert_close(b[2], -slopes[2] * (pos[None] - pos[:, None]).abs())


@pytest.mark.parametrize("causal", [True, False])
def test_alibi_model_is_shift_invariant(causal):
    model = small_model("alibi", causal)
    tokens = torch.randint(0, 23, (2, 12))
    for c in (1, 37, 5000):
        torch.testing.assert_close(model(tokens, torch.arange(12) + c), model(tokens), rtol=1e-5, atol=1e-5)


def test_alibi_keeps_attention_fused_and_needs_no_table():
    model = small_model("alibi", True, max_len=8)
    assert not model.scheme.custom_attention
    assert model(torch.randint(0, 23, (1, 40))).shape == (1, 40, 23)   # 5x longer than max_len
    assert sum(p.numel() for p in model.scheme.parameters()) == 0


def test_alibi_stays_on_the_fused_kernel_no_weights_kept_for_backward():
    """The math fallback of SDPA would keep [B, H, T, T] weights per layer (4 MiB here); fused keeps none."""
    from posenc.bench.costs import saved_bytes
    from posenc.runs.train import lm_loss
    x, y = torch.randint(0, 23, (8, 128)), torch.randint(0, 23, (8, 128))
    kept = {}
    for name in ("nope", "alibi"):
        torch.manual_seed(0)
        model = posenc.build_model(name, 23, causal=True, max_len=128, d_model=32, n_heads=4, n_layers=2)
        kept[name] = saved_bytes(lambda: lm_loss(model(x), y))
    weights = 2 * 8 * 4 * 128 * 128 * 4                                 # layers * B * H * T * T * float32
    assert kept["alibi"] - kept["nope"] < weights / 4


def test_reused_bias_matches_a_fresh_one_at_any_offset_and_length():
    from posenc.scheme import PositionContext
    scheme = small_model("alibi", True).scheme
    for n, offset in ((12, 0), (12, 700), (5, 3), (12, 0)):
        pos = torch.arange(n) + offset
        got = scheme.logit_bias(PositionContext(pos, True))
        torch.testing.assert_close(got, alibi_bias(pos, scheme.slopes), rtol=0, atol=0)
    gappy = torch.arange(12) * 2                                         # not consecutive: never served from the cache
    torch.testing.assert_close(scheme.logit_bias(PositionContext(gappy, True)), alibi_bias(gappy, scheme.slopes))


@pytest.mark.parametrize("bad", [0, -2, 2.5, "4"])
def test_bad_head_count(bad):
    with pytest.raises(ValueError, match="num_heads must be a positive int"):
        alibi_slopes(bad)


@pytest.mark.parametrize("positions, slopes, error, match", [
    (torch.arange(4), [0.5], ValueError, "slopes must be a 1-D float tensor"),
    (torch.arange(4), torch.tensor([1, 2]), TypeError, "slopes must be a float tensor"),
    (torch.arange(8).view(2, 4), torch.tensor([0.5]), ValueError, "positions must be a 1-D tensor"),
    ([0, 1, 2], torch.tensor([0.5]), ValueError, "positions must be a 1-D tensor"),
    (torch.arange(300, dtype=torch.bfloat16), torch.tensor([0.5]), TypeError, "positions must be an integer, float32"),
    (torch.ones(3, dtype=torch.bool), torch.tensor([0.5]), TypeError, "positions must be an integer, float32"),
])
def test_alibi_bias_names_its_bad_argument(positions, slopes, error, match):
    with pytest.raises(error, match=match):
        alibi_bias(positions, slopes)


def test_registered_and_exported_where_the_contract_says():
    import posenc.bias
    assert posenc.SCHEMES["alibi"].__name__ == "ALiBi"
    assert posenc.bias.alibi_slopes is alibi_slopes


def test_the_bias_follows_the_slopes_and_the_flex_path_is_exact_at_any_offset():
    """The reused bias is rebuilt when the slopes are edited in place; FlexAttention's score_mod differences
    positions before rounding them to float32, so an offset past 2^24 changes nothing there either."""
    torch.manual_seed(0)
    tokens = torch.randint(0, 23, (1, 16))
    model = small_model("alibi")
    first = model(tokens)
    model.scheme.slopes.mul_(4)
    changed = model(tokens)
    model.scheme.clear_cache()
    torch.testing.assert_close(changed, model(tokens))
    assert not torch.allclose(changed, first)
    model.attention_backend = "flex"
    far = torch.arange(16) + 2 ** 25 + 1
    with torch.no_grad(), pytest.warns(UserWarning, match="flex_attention called without torch.compile"):
        torch.testing.assert_close(model(tokens, positions=far), model(tokens), rtol=1e-5, atol=1e-5)
    with torch.inference_mode():                      # slopes made there keep no version counter
        assert small_model("alibi")(tokens).shape == (1, 16, 23)
