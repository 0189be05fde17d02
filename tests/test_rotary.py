"""RoPE (posenc.rotary): references, the derivation's claims, autograd, dtypes, the scheme."""
import math
import pytest
import torch
from rotary_embedding_torch import RotaryEmbedding, apply_rotary_emb
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

import posenc
from conftest import small_model
from posenc.rotary import RoPE, apply_rope, ntk_base, rope_frequencies, rope_table, rotate

LAYOUTS = ["interleaved", "half"]


def naive_rope(x, positions, base=10000.0):
    """The equation itself: a d x d block-diagonal rotation per position (RoFormer Eq. 13), float64."""
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    out = torch.empty_like(x, dtype=torch.float64)
    for t, m in enumerate(positions.tolist()):
        R = torch.zeros(d, d, dtype=torch.float64)
        for i, th in enumerate(theta.tolist()):
            c, s = torch.cos(torch.tensor(m * th, dtype=torch.float64)), torch.sin(torch.tensor(m * th, dtype=torch.float64))
            R[2 * i: 2 * i + 2, 2 * i: 2 * i + 2] = torch.stack([torch.stack([c, -s]), torch.stack([s, c])])
        out[..., t, :] = x[..., t, :].double() @ R.T
    return out


def half_to_interleaved(d):
    """perm with x_half = x_interleaved[..., perm]: pair (2i, 2i+1) moves to (i, i + d/2)."""
    return torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])


def llama(rope_type="default", **params):
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16,
                      rope_parameters={"rope_type": rope_type, "rope_theta": 10000.0, **params})
    return LlamaRotaryEmbedding(cfg)


# -- independent references -------------------------------------------------------------
def test_interleaved_equals_the_block_diagonal_matrix():
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    pos = torch.tensor([0, 1, 5, 17, 300, 2048, 9999])
    torch.testing.assert_close(apply_rope(x, pos), naive_rope(x, pos), rtol=1e-10, atol=1e-10)


def test_half_layout_matches_transformers_llama():
    x = torch.randn(2, 4, 50, 16)
    pos = torch.arange(50) + 30
    cos, sin = llama()(x, pos[None])                       # (1, T, d) as LLaMA builds them
    ref, _ = apply_rotary_pos_emb(x, x, cos, sin)
    torch.testing.assert_close(apply_rope(x, pos, layout="half"), ref, rtol=1e-5, atol=2e-5)


def test_position_interpolation_matches_transformers_linear_scaling():
    model = small_model("rope", d_model=64, n_heads=4, layout="half", scaling="pi", factor=4.0)
    pos = torch.arange(40)
    cos, sin = model.scheme.table(pos)
    ref_cos, ref_sin = llama("linear", factor=4.0)(torch.zeros(1), pos[None])
    torch.testing.assert_close(cos, ref_cos[0, :, :8], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sin, ref_sin[0, :, :8], rtol=1e-5, atol=1e-6)


def test_interleaved_layout_matches_rotary_embedding_torch():
    x = torch.randn(2, 4, 50, 16)
    pos = torch.arange(50.0) + 30
    ref = apply_rotary_emb(RotaryEmbedding(16)(pos), x)
    torch.testing.assert_close(apply_rope(x, pos), ref, rtol=1e-5, atol=2e-5)


def test_ntk_base_matches_rotary_embedding_torch_theta_rescale():
    ref = RotaryEmbedding(16, theta_rescale_factor=8.0).freqs.double()
    torch.testing.assert_close(rope_frequencies(16, ntk_base(10000.0, 8.0, 16)), ref, rtol=1e-5, atol=0)
    freqs = rope_frequencies(16, ntk_base(10000.0, 8.0, 16))
    plain = rope_frequencies(16)
    assert freqs[0] == plain[0] and torch.isclose(freqs[-1], plain[-1] / 8)   # highest kept, lowest / s


# -- the derivation's claims ------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("offset", [0, 3000, 50000])
def test_scores_depend_only_on_relative_position(layout, offset):
    """<R_m q, R_n k> = <R_{m-n} q, k> (RoFormer Eq. 16), m, n up to offset + 100."""
    q, k = torch.randn(2, 64, 32, dtype=torch.float64)    # 64 random pairs, one per row
    m = torch.randint(0, 100, (64,)) + offset
    n = torch.randint(0, 100, (64,)) + offset
    lhs = (apply_rope(q, m, layout=layout) * apply_rope(k, n, layout=layout)).sum(-1)
    rhs = (apply_rope(q, m - n, layout=layout) * k).sum(-1)
    torch.testing.assert_close(lhs, rhs, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_scores_unchanged_when_both_positions_shift(layout):
    q, k = torch.randn(2, 3, 40, 16, dtype=torch.float64)
    pos = torch.arange(40)
    base_scores = apply_rope(q, pos, layout=layout) @ apply_rope(k, pos, layout=layout).transpose(-1, -2)
    for c in (1, 1234, 7777):
        shifted = apply_rope(q, pos + c, layout=layout) @ apply_rope(k, pos + c, layout=layout).transpose(-1, -2)
        torch.testing.assert_close(shifted, base_scores, rtol=1e-9, atol=1e-9)


def test_layouts_agree_up_to_a_fixed_permutation():
    x, y = torch.randn(2, 2, 3, 30, 16, dtype=torch.float64)
    pos = torch.arange(30) * 7
    perm = half_to_interleaved(16)
    torch.testing.assert_close(apply_rope(x, pos)[..., perm], apply_rope(x[..., perm], pos, layout="half"))
    scores_i = apply_rope(x, pos) @ apply_rope(y, pos).transpose(-1, -2)
    scores_h = apply_rope(x[..., perm], pos, layout="half") @ apply_rope(y[..., perm], pos, layout="half").transpose(-1, -2)
    torch.testing.assert_close(scores_i, scores_h)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rotation_preserves_norms(layout):
    x = torch.randn(4, 20, 32, dtype=torch.float64)
    torch.testing.assert_close(apply_rope(x, torch.arange(20) * 100, layout=layout).norm(dim=-1), x.norm(dim=-1))


def test_fractional_positions_interpolate():
    x = torch.randn(3, 16, dtype=torch.float64)
    pos = torch.tensor([0.5, 2.25, 1000.125])
    torch.testing.assert_close(apply_rope(x, pos), naive_rope(x, pos), rtol=1e-10, atol=1e-10)


# -- autograd: the custom backward --------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradcheck_float64(layout):
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64, requires_grad=True)
    pos = torch.arange(5) + 1000
    assert torch.autograd.gradcheck(lambda t: apply_rope(t, pos, layout=layout), (x,))
    xt = torch.randn(2, 5, 3, 8, dtype=torch.float64).transpose(1, 2).requires_grad_()   # non-contiguous input
    assert torch.autograd.gradcheck(lambda t: apply_rope(t, pos, layout=layout), (xt,))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_custom_backward_equals_autograd_of_the_equation(layout):
    x = torch.randn(2, 3, 20, 16, dtype=torch.float64, requires_grad=True)
    g = torch.randn(2, 3, 20, 16, dtype=torch.float64)
    pos = torch.arange(20) + 500
    perm = half_to_interleaved(16) if layout == "half" else torch.arange(16)
    (apply_rope(x, pos, layout=layout) * g).sum().backward()
    x_ref = x.detach().clone().requires_grad_()
    inv = torch.argsort(perm)
    (naive_rope(x_ref[..., inv], pos)[..., perm] * g).sum().backward()   # half = permuted interleaved
    torch.testing.assert_close(x.grad, x_ref.grad)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_positions_and_frequencies_get_their_gradients(layout):
    """Learned or interpolated positions, and learned frequencies, train: d(R_m x)/dm and d/dtheta_i reach
    them (float64 gradcheck against finite differences), and equal autograd of the written-out equation."""
    from posenc.rotary import frequency_table
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    pos = torch.tensor([0.0, 1.5, 2.0, 7.25, 30.0], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda p: apply_rope(x, p, layout=layout), (pos,))
    theta = rope_frequencies(8).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda t: rotate(x, *frequency_table(pos.detach(), t, torch.float64), layout), (theta,))
    perm = half_to_interleaved(8) if layout == "half" else torch.arange(8)
    g = torch.randn(2, 5, 8, dtype=torch.float64)
    (apply_rope(x, pos, layout=layout) * g).sum().backward()
    ref = pos.detach().clone().requires_grad_()
    angles = ref[:, None] * rope_frequencies(8)                       # m theta_i, differentiable in m
    pairs = x[..., torch.argsort(perm)].unflatten(-1, (4, 2))          # (x_2i, x_2i+1)
    y = torch.stack([pairs[..., 0] * angles.cos() - pairs[..., 1] * angles.sin(),
                     pairs[..., 0] * angles.sin() + pairs[..., 1] * angles.cos()], -1).flatten(-2)
    (y[..., perm] * g).sum().backward()
    torch.testing.assert_close(pos.grad, ref.grad)


def test_half_precision_positions_are_refused_by_name():
    with pytest.raises(TypeError, match="positions must be an integer, float32 or float64.*bfloat16"):
        apply_rope(torch.randn(300, 8), torch.arange(300, dtype=torch.bfloat16))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_backward_saves_tables_not_activations(layout):
    saved = []
    x = torch.randn(4, 8, 64, 32, requires_grad=True)
    cos, sin = rope_table(torch.arange(64), 32)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        rotate(x, cos, sin, layout).sum().backward()
    assert saved == [(64, 16), (64, 16)]


def test_compiled_half_kernel_equals_the_eager_one_forward_and_backward():
    """The fused kernel computes the same rotation, its backward the same inverse rotation, and it
    still saves only the tables; bf16 in, bf16 out with float32 angles."""
    x = torch.randn(2, 3, 24, 16, requires_grad=True)
    g = torch.randn(2, 3, 24, 16)
    pos = torch.arange(24) + 300
    ref = x.detach().clone().requires_grad_()
    (apply_rope(ref, pos, layout="half") * g).sum().backward()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        out = apply_rope(x, pos, layout="half", kernel="compiled")
    (out * g).sum().backward()
    torch.testing.assert_close(out, apply_rope(ref.detach(), pos, layout="half"), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x.grad, ref.grad, rtol=1e-6, atol=1e-6)
    assert saved == [(24, 8), (24, 8)]
    low = apply_rope(x.detach().bfloat16(), pos, layout="half", kernel="compiled")
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low, apply_rope(x.detach().bfloat16(), pos, layout="half"))


def test_compiled_kernel_falls_back_with_a_warning_and_checks_its_name(monkeypatch):
    import posenc.schemes.rotary as rotary

    def compiled_but_fails(*args, **kwargs):               # what torch.compile gives without a C++ compiler
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(rotary._FUSED_HALF, "kernel", compiled_but_fails)
    x, pos = torch.randn(2, 6, 8), torch.arange(6)
    with pytest.warns(RuntimeWarning, match="could not be compiled"):
        got = apply_rope(x, pos, layout="half", kernel="compiled")
    torch.testing.assert_close(got, apply_rope(x, pos, layout="half"))
    with pytest.raises(ValueError, match="kernel must be one of"):
        apply_rope(x, pos, kernel="triton")


# -- dtypes and bad input -------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_bf16_input_keeps_float32_angles(layout):
    x = torch.randn(2, 16, 64)
    pos = torch.arange(16) + 60000                     # bf16 cannot even represent these positions
    out = apply_rope(x.bfloat16(), pos, layout=layout)
    assert out.dtype == torch.bfloat16
    exact = apply_rope(x.bfloat16().float(), pos, layout=layout)
    torch.testing.assert_close(out.float(), exact, rtol=1e-2, atol=2e-2)   # only the output rounding is bf16
    cos, _ = rope_table(pos, 64)
    assert cos.dtype == torch.float32
    # what computing positions in bf16 would do instead: 16 distinct positions collapse to at most 2
    assert len(set(pos.bfloat16().tolist())) <= 2


def test_float16_and_float64_keep_their_dtype():
    x = torch.randn(3, 8)
    assert apply_rope(x.half(), torch.arange(3)).dtype == torch.float16
    assert apply_rope(x.double(), torch.arange(3)).dtype == torch.float64


def test_odd_dim_raises_naming_dim():
    with pytest.raises(ValueError, match="dim"):
        apply_rope(torch.randn(4, 7), torch.arange(4))
    with pytest.raises(ValueError, match="dim"):
        rope_frequencies(9)


def test_bad_arguments_raise():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="layout"):
        apply_rope(x, torch.arange(4), layout="neox")
    with pytest.raises(ValueError, match="positions"):
        apply_rope(x, torch.arange(5))
    with pytest.raises(TypeError, match="positions"):
        apply_rope(x, torch.ones(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="base"):
        apply_rope(x, torch.arange(4), base=0.5)
    with pytest.raises(ValueError, match="head_dim"):
        small_model("rope", d_model=20, n_heads=4)     # head_dim 5
    with pytest.raises(ValueError, match="scaling"):
        small_model("rope", scaling="yarn")
    with pytest.raises(ValueError, match="factor"):
        small_model("rope", scaling="pi", factor=0.5)


# -- the scheme in the model ------------------------------------------------------------------
def test_rope_is_registered_and_stays_fused():
    assert posenc.SCHEMES["rope"] is RoPE
    model = small_model("rope")
    assert not model.scheme.custom_attention
    assert model.context(9, None, "cpu").attn_mask is None      # plain causal SDPA, no explicit mask


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_model_is_shift_invariant(causal, layout):
    model = small_model("rope", causal, layout=layout)
    tokens = torch.randint(0, 23, (2, 12))
    ref = model(tokens)
    for c in (1, 1000, 4096):
        torch.testing.assert_close(model(tokens, torch.arange(12) + c), ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(model(tokens, torch.arange(12.0) + 0.5), ref, rtol=1e-4, atol=1e-4)


def test_rope_model_is_not_permutation_equivariant():
    model = small_model("rope", causal=False)
    tokens = torch.randint(0, 23, (4, 15))
    perm = torch.randperm(15)
    assert not torch.allclose(model(tokens[:, perm]), model(tokens)[:, perm], atol=1e-4)


def test_tables_are_cached_per_length():
    scheme = small_model("rope").scheme
    ctx = posenc.PositionContext(torch.arange(10), causal=True)
    first, second = scheme.prepare(ctx)["rope"], scheme.prepare(ctx)["rope"]
    assert first[0] is second[0]
    ctx20 = posenc.PositionContext(torch.arange(20), causal=True)
    other = scheme.prepare(ctx20)["rope"]
    assert other[0].shape == (20, 4) and scheme.prepare(ctx20)["rope"][0] is other[0]
    shifted = scheme.prepare(posenc.PositionContext(torch.arange(10) + 5, causal=True))["rope"]
    torch.testing.assert_close(shifted[0], rope_table(torch.arange(10) + 5, 8)[0])   # offsets: not from the cache
    with torch.inference_mode():                       # inference tensors must not be cached for training
        scheme.prepare(posenc.PositionContext(torch.arange(30), causal=True))
    assert (30, torch.device("cpu")) not in scheme._cache
    scheme.set_scaling("pi", 2.0)
    halved = scheme.prepare(ctx)["rope"]
    torch.testing.assert_close(halved[0], rope_table(torch.arange(10) / 2.0, 8)[0])


def test_interpolation_and_ntk_change_the_angles_as_derived():
    model = small_model("rope", d_model=64, n_heads=4)
    pos = torch.arange(100)
    scheme = model.scheme
    scheme.set_scaling("pi", 4.0)
    torch.testing.assert_close(scheme.table(pos)[1], rope_table(pos / 4.0, 16)[1])
    scheme.set_scaling("ntk", 4.0)
    assert scheme.effective_base == pytest.approx(10000.0 * 4.0 ** (16 / 14))
    torch.testing.assert_close(scheme.table(pos)[1], rope_table(pos, 16, ntk_base(10000.0, 4.0, 16))[1])


@pytest.mark.parametrize("name", ["rope", "xpos"])
def test_ntk_rescales_the_base_for_the_rotated_width_when_part_of_a_head_rotates(name):
    """NTK-aware scaling (eq. 16.3) divides the lowest frequency by exactly s: with rotary_fraction 1/2 the
    rotated width r = 32 of a 64-wide head is the d of the formula, not 64."""
    scheme = small_model(name, d_model=256, n_heads=4, rotary_fraction=0.5).scheme
    scheme.set_scaling("ntk", 4.0)
    theta = scheme.frequencies()[0]
    assert theta.shape == (16,) and scheme.effective_base == pytest.approx(ntk_base(10000.0, 4.0, 32))
    torch.testing.assert_close(theta[-1], rope_frequencies(32, 10000.0, dtype=torch.float64)[-1] / 4.0)
    torch.testing.assert_close(theta[0], torch.tensor(1.0, dtype=torch.float64))       # the fastest pair stays


@pytest.mark.parametrize("name", ["rope", "xpos"])
def test_interpolated_positions_far_from_zero_keep_their_angles(name):
    """Under "pi" the positions are divided in float64: at m near 1e5, float32 positions / 3 would put cos off by
    about 1e-3; the table must equal the float64 derivation's."""
    scheme = small_model(name, d_model=64, n_heads=4).scheme
    scheme.set_scaling("pi", 3.0)
    pos = torch.arange(100_000, 100_064)
    torch.testing.assert_close(scheme.scaled_positions(pos), pos.double() / 3.0, rtol=0, atol=0)
    if name == "rope":
        want = rope_table(pos.double() / 3.0, 16)
        for got, ref in zip(scheme.table(pos), want):
            torch.testing.assert_close(got.double(), ref.double(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("base", [math.inf, 1.0, True, None])
def test_an_infinite_or_trivial_base_is_refused_not_served_as_no_position(base):
    """base = inf left only pair 0 with an angle (every other theta_i = 0): a silent near-NoPE."""
    from posenc.absolute import sinusoidal_table
    with pytest.raises(ValueError, match="base must be a finite number > 1"):
        apply_rope(torch.randn(1, 4, 8), torch.arange(4), base=base)
    with pytest.raises(ValueError, match="base must be a finite number > 1"):
        sinusoidal_table(10, 8, base=base)
    with pytest.raises(ValueError, match="base must be a finite number > 1"):
        posenc.build_model("rope", 16, causal=True, d_model=16, n_heads=2, base=base)


def test_rotate_refuses_one_row_of_the_tables_where_it_wants_one_row_per_position():
    """cos[3], sin[3] ([dim/2]) passed the shape check when seq == dim/2 and rotated every position by
    position 3's angles."""
    x = torch.randn(1, 4, 8)
    cos, sin = rope_table(torch.arange(4), 8)
    with pytest.raises(ValueError, match=r"cos/sin must be \[seq=4, dim/2=4\]; got \(4,\)"):
        rotate(x, cos[3], sin[3])
    torch.testing.assert_close(rotate(x, cos, sin), apply_rope(x, torch.arange(4)))


def test_a_cached_table_follows_the_settings_it_was_built_with():
    """RoPE's and xPos's tables are cached per length; changing base, p or xPos's scale after a forward
    (a sweep at evaluation time) builds them again rather than serving the old ones."""
    torch.manual_seed(0)
    tokens = torch.randint(0, 23, (1, 16))
    for scheme, attr, value in (("rope", "base", 500000.0), ("rope", "p", 0.5), ("xpos", "scale_base", 16.0),
                                 ("xpos", "gamma_hat", 0.8)):
        model = small_model(scheme)
        first = model(tokens)
        setattr(model.scheme, attr, value)
        changed = model(tokens)
        model.scheme.clear_cache()
        torch.testing.assert_close(changed, model(tokens))           # what a fresh table gives
        assert not torch.allclose(changed, first), (scheme, attr)


def test_a_factor_inside_scaling_params_is_refused_with_where_it_goes():
    """transformers' rope_parameters hold the factor; posenc takes it as its own argument, and says so."""
    with pytest.raises(ValueError, match=r"give the factor as factor=4.0, not inside scaling_params"):
        posenc.build_model("rope", 32, causal=True, scaling="linear", scaling_params={"factor": 4.0})
