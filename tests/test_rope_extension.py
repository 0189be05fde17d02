"""RoPE under every scaling of transformers' rope_parameters (posenc.rotary.RoPE.set_scaling): its
frequencies are rope_inv_freq's, its tables transformers' LlamaRotaryEmbedding's, the attention factor
scales every rotated logit by its square, "linear" is position interpolation, bad options are named."""
import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

import posenc
from conftest import small_model
from posenc.functional import rope_inv_freq
from posenc.rotary import POSITION_SCALINGS, SCALINGS, frequency_table, rope_table, rotate

HEAD, L = 16, 32                                                  # d_model 64, 4 heads: the chapter's model
LONGROPE = dict(short_factor=[1.0] * (HEAD // 2), long_factor=[1.0 + 3.0 * i / 7 for i in range(HEAD // 2)])
CASES = [                                                         # (scaling, factor, params)
    ("default", 1.0, {}),
    ("linear", 4.0, {}),
    ("dynamic", 4.0, {"original_max_position_embeddings": L}),
    ("yarn", 4.0, {"original_max_position_embeddings": L}),
    ("yarn", 8.0, {"original_max_position_embeddings": L, "beta_fast": 16, "beta_slow": 2}),
    ("llama3", 4.0, {"original_max_position_embeddings": L, "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
    ("longrope", 4.0, {"original_max_position_embeddings": L, **LONGROPE}),
]


def scheme(scaling=None, factor=1.0, **kw):
    model = small_model("rope", d_model=64, n_heads=4, **kw)
    return model.scheme if scaling is None else _set(model.scheme, scaling, factor)


def _set(s, scaling, factor, **params):
    s.set_scaling(scaling, factor, **params)
    return s


def reference_inv_freq(scaling, factor, params, seq_len, dim=HEAD, dtype=torch.float32, base=10000.0):
    """rope_inv_freq called as transformers names things (dynamic: max_position_embeddings = L)."""
    kw = dict(params, dtype=dtype)
    if scaling != "default":
        kw["factor"] = factor
    if scaling == "dynamic":
        kw["max_position_embeddings"] = kw.pop("original_max_position_embeddings")
    return rope_inv_freq(dim, base, rope_type=scaling, seq_len=seq_len, **kw)


@pytest.mark.parametrize("scaling, factor, params", CASES)
@pytest.mark.parametrize("seq_len", [None, L, 4 * L])
def test_frequencies_and_attention_factor_are_rope_inv_freqs(scaling, factor, params, seq_len):
    s = _set(scheme(), scaling, factor, **params)
    theta, a = s.frequencies(seq_len)
    inv, att = reference_inv_freq(scaling, factor, params, seq_len, dtype=torch.float64)
    assert theta.dtype == torch.float64 and theta.shape == (HEAD // 2,)
    assert torch.equal(theta, inv) and a == att
    inv32, att32 = reference_inv_freq(scaling, factor, params, seq_len)               # transformers' rounding
    torch.testing.assert_close(theta.float(), inv32, rtol=1e-6, atol=0)
    assert att32 == att


@pytest.mark.parametrize("scaling, factor", [("linear", 8.0), ("dynamic", 8.0), ("llama3", 8.0)])
def test_angles_of_a_long_context_are_exact_on_every_rope_type(scaling, factor):
    """At Llama's size (head 128, base 5e5) and positions up to 32767, the tables' angles are m * omega_i with
    omega_i in float64: the float32 table is the exact cos rounded once (within 1e-7). Frequencies rounded to
    float32 first (as transformers does) put cos off by about 1e-4 there."""
    params = {} if scaling == "linear" else {"original_max_position_embeddings": 4096}
    if scaling == "llama3":
        params |= {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
    s = _set(small_model("rope", d_model=256, n_heads=2, n_layers=1, base=500000.0).scheme, scaling, factor,
             **params)
    m = torch.arange(32767, -1, -97).flip(0)                          # up to 32767: dynamic reads n = 32768
    theta, _ = s.frequencies(32768)
    exact, _ = reference_inv_freq(scaling, factor, params, 32768, dim=128, dtype=torch.float64, base=500000.0)
    assert torch.equal(theta, exact)
    cos, _ = s.table(m)
    exact_cos = (m.double()[:, None] * exact[None]).cos()
    assert (cos.double() - exact_cos).abs().max() < 1e-7
    rounded = (m.double()[:, None] * exact.float().double()[None]).cos()
    assert (rounded - exact_cos).abs().max() > 1e-5                   # what float32 frequencies would cost


@pytest.mark.parametrize("scaling, factor, params", CASES)
@pytest.mark.parametrize("n", [L // 2, L, 4 * L])
def test_tables_equal_transformers_llama_rotary_embedding(scaling, factor, params, n):
    """cos and sin of positions 0..n-1 (attention_scaling included) as transformers builds them; dynamic and
    longrope read the length n from the positions, as transformers' dynamic_rope_update does. transformers forms
    the angles in float32, posenc in float64: they differ by the rounding of m * omega in float32 (~1e-7 m)."""
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=HEAD, max_position_embeddings=L,
                      rope_parameters={"rope_type": scaling, "rope_theta": 10000.0,
                                       **({} if scaling == "default" else {"factor": factor}), **params})
    ref_cos, ref_sin = LlamaRotaryEmbedding(cfg)(torch.zeros(1), torch.arange(n)[None])   # (1, n, d) halves repeated
    cos, sin = _set(scheme(layout="half"), scaling, factor, **params).table(torch.arange(n))
    torch.testing.assert_close(cos, ref_cos[0, :, :HEAD // 2], rtol=0, atol=1e-5)
    torch.testing.assert_close(sin, ref_sin[0, :, :HEAD // 2], rtol=0, atol=1e-5)


@pytest.mark.parametrize("scaling, factor, params", [c for c in CASES if c[0] in ("yarn", "longrope")])
def test_attention_factor_scales_every_rotated_logit_by_its_square(scaling, factor, params):
    s = _set(scheme(), scaling, factor, **params)
    _, a = s.frequencies(4 * L)
    assert a > 1
    pos = torch.arange(4 * L)
    q, k = torch.randn(2, 2, 4, 4 * L, HEAD, dtype=torch.float64)
    cos, sin = s.table(pos)
    theta, _ = s.frequencies(4 * L)
    plain = frequency_table(pos, theta, torch.float64)
    scores = rotate(q, cos.double(), sin.double()) @ rotate(k, cos.double(), sin.double()).transpose(-1, -2)
    unscaled = rotate(q, *plain) @ rotate(k, *plain).transpose(-1, -2)
    torch.testing.assert_close(scores, a ** 2 * unscaled, rtol=1e-5, atol=1e-5)    # float32 tables
    if scaling == "yarn" and "attention_factor" not in params:
        assert a == pytest.approx(0.1 * math.log(factor) + 1)                      # YaRN's sqrt(1/t)


def test_attention_factor_leaves_the_unrotated_dims_alone():
    """With partial rotation only the rotated dims are scaled, as transformers' cos/sin multiply only them."""
    model = small_model("rope", d_model=64, n_heads=4, rotary_fraction=0.5)
    model.scheme.set_scaling("yarn", 4.0, original_max_position_embeddings=L)
    ctx = posenc.PositionContext(torch.arange(10), causal=True)
    ctx.tables = model.scheme.prepare(ctx)
    q, k = torch.randn(2, 1, 4, 10, HEAD)
    q2, k2 = model.scheme.transform_qk(q, k, ctx)
    assert torch.equal(q2[..., HEAD // 2:], q[..., HEAD // 2:]) and torch.equal(k2[..., HEAD // 2:], k[..., HEAD // 2:])
    a = 0.1 * math.log(4) + 1
    torch.testing.assert_close(q2[..., :HEAD // 2].norm(dim=-1), a * q[..., :HEAD // 2].norm(dim=-1))


def test_linear_is_position_interpolation():
    pos = torch.arange(200)
    pi, linear = scheme("pi", 4.0), scheme("linear", 4.0)
    for a, b in zip(pi.table(pos), linear.table(pos)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)              # inv_freq rounded to float32 in "linear"
    torch.testing.assert_close(pi.frequencies()[0], linear.frequencies()[0], rtol=1e-7, atol=0)
    model = small_model("rope", d_model=64, n_heads=4)
    tokens = torch.randint(0, 23, (2, 50))
    model.scheme.set_scaling("pi", 4.0)
    out_pi = model(tokens)
    model.scheme.set_scaling("linear", 4.0)
    torch.testing.assert_close(model(tokens), out_pi, rtol=1e-4, atol=1e-4)


def test_default_is_plain_rope_and_position_scalings_are_unchanged():
    pos = torch.arange(100)
    plain = scheme()
    assert plain.scaling is None and plain.frequencies()[1] == 1.0
    torch.testing.assert_close(scheme("default").table(pos)[0], plain.table(pos)[0], rtol=0, atol=1e-5)
    assert POSITION_SCALINGS == (None, "pi", "ntk") and set(SCALINGS) > set(POSITION_SCALINGS)
    # chapter 11's scalings still divide the positions or change the base, in float64 angles
    torch.testing.assert_close(scheme("pi", 4.0).table(pos)[1], rope_table(pos / 4.0, HEAD)[1], rtol=0, atol=0)


def test_dynamic_reads_the_current_length():
    s = _set(scheme(), "dynamic", 4.0, original_max_position_embeddings=L)
    plain = scheme()
    within = torch.arange(L)
    for a, b in zip(s.table(within), plain.table(within)):                # n <= L: RoPE as trained
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    long = torch.arange(4 * L)
    theta_long, _ = s.frequencies(4 * L)
    torch.testing.assert_close(s.table(long)[1], frequency_table(long, theta_long)[1])
    assert theta_long[0] == 1.0 and torch.all(theta_long[1:] < plain.frequencies()[0][1:])
    # the same positions in a longer forward get other frequencies: what a cache of rotated keys gets wrong
    assert not torch.allclose(s.table(long)[1][:L], s.table(within)[1])


def test_p_rope_zeros_apply_after_the_scaling():
    s = _set(scheme(p=0.75), "yarn", 4.0, original_max_position_embeddings=L)
    theta, a = s.frequencies()
    inv, _ = reference_inv_freq("yarn", 4.0, {"original_max_position_embeddings": L}, None, dtype=torch.float64)
    assert torch.equal(theta[:6], inv[:6]) and torch.all(theta[6:] == 0)
    cos, sin = s.table(torch.arange(40))
    torch.testing.assert_close(cos[:, 6:], torch.full((40, 2), a))     # unrotated pairs: cos = a, sin = 0
    assert torch.all(sin[:, 6:] == 0)


def test_scaling_through_the_constructor_and_a_model_runs():
    model = small_model("rope", d_model=64, n_heads=4, scaling="yarn", factor=4.0,
                        scaling_params={"original_max_position_embeddings": L})
    assert model.scheme.scaling == "yarn" and model.scheme.scaling_params == {"original_max_position_embeddings": L}
    out = model(torch.randint(0, 23, (2, 4 * L)))
    assert out.shape == (2, 4 * L, 23) and torch.isfinite(out).all()
    for scaling, factor, params in CASES:
        model.scheme.set_scaling(scaling, factor, **params)
        assert torch.isfinite(model(torch.randint(0, 23, (1, 3 * L)))).all()


def test_bad_options_are_named():
    s = scheme()
    with pytest.raises(ValueError, match="scaling must be one of"):
        s.set_scaling("ntk-by-parts", 4.0)
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        s.set_scaling("yarn", 4.0)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        s.set_scaling("dynamic", 4.0)
    with pytest.raises(ValueError, match="low_freq_factor"):
        s.set_scaling("llama3", 4.0, original_max_position_embeddings=L)
    with pytest.raises(ValueError, match="unknown parameters"):
        s.set_scaling("yarn", 4.0, original_max_position_embeddings=L, beta=3)
    with pytest.raises(ValueError, match="takes only factor"):
        s.set_scaling("pi", 4.0, original_max_position_embeddings=L)
    with pytest.raises(ValueError, match="factor must be 1"):
        s.set_scaling("default", 2.0)
    with pytest.raises(ValueError, match="factor must be a finite number >= 1"):
        s.set_scaling("yarn", 0.5, original_max_position_embeddings=L)
    for scaling in ("pi", "ntk", "yarn"):          # an infinite factor made every angle 0: RoPE without position
        with pytest.raises(ValueError, match="factor must be a finite number >= 1; got inf"):
            s.set_scaling(scaling, math.inf, **({"original_max_position_embeddings": L} if scaling == "yarn" else {}))
    with pytest.raises(ValueError, match="factor must be a finite number >= 1; got -2"):
        posenc.schemes.rotary.ntk_base(10000.0, -2, 16)                  # was a complex number
    with pytest.raises(ValueError, match="seq_len"):
        s.set_scaling("dynamic", 4.0, original_max_position_embeddings=L, seq_len=100)
    with pytest.raises(ValueError, match="short_factor and long_factor"):
        s.set_scaling("longrope", 4.0, original_max_position_embeddings=L, short_factor=[1.0] * 8,
                      long_factor=[1.0] * 5)
    with pytest.raises(TypeError, match="scaling_params"):
        small_model("rope", scaling="yarn", scaling_params=[("original_max_position_embeddings", L)])
    assert s.scaling is None and s.scaling_params == {}                 # a refused scaling leaves the scheme as it was
    s.set_scaling("yarn", 4.0, original_max_position_embeddings=L)
    with pytest.raises(ValueError, match="llama3"):
        s.set_scaling("llama3", 4.0, original_max_position_embeddings=L)
    assert s.scaling == "yarn" and s.factor == 4.0 and s.scaling_params == {"original_max_position_embeddings": L}


def test_xpos_builds_its_own_tables_and_refuses_the_rope_types():
    model = small_model("xpos", d_model=64, n_heads=4)
    with pytest.raises(ValueError, match="XPos builds its own tables"):
        model.scheme.set_scaling("yarn", 4.0, original_max_position_embeddings=L)
    model.scheme.set_scaling("ntk", 4.0)                                  # the position scalings still apply
    assert model.scheme.scaling == "ntk"


@pytest.mark.parametrize("scaling,factor,params", CASES + [("pi", 4.0, {}), ("ntk", 4.0, {})])
def test_an_instance_says_it_is_shift_invariant_exactly_when_an_offset_changes_nothing(scaling, factor, params):
    """"dynamic" and "longrope" read n = max(position) + 1, so shifting every position changes their frequencies
    (and their instance says shift_invariant False); every other scaling keeps RoPE's dependence on m - n alone."""
    torch.manual_seed(0)
    model = small_model("rope", d_model=64, n_heads=4, max_len=4096).eval()
    model.scheme.set_scaling(scaling, factor, **params)
    with torch.no_grad():
        for block in model.blocks:                    # large logits, so that a frequency change shows
            block.attn.qkv.weight.mul_(20)
        moved = 0.0
        for n in (L // 2, 3 * L):                     # an offset of 1000 takes the short input past L
            tokens = torch.randint(0, 23, (2, n))
            moved = max([moved] + [(model(tokens, torch.arange(n) + c) - model(tokens)).abs().max().item()
                                   for c in (7, 1000)])
    invariant = scaling not in ("dynamic", "longrope")
    assert model.scheme.shift_invariant is invariant and type(model.scheme).shift_invariant is True
    assert (moved < 1e-3) is invariant, moved


def test_a_factor_without_a_scaling_is_refused_rather_than_ignored():
    with pytest.raises(ValueError, match="scaling=None is RoPE unscaled: factor must be 1"):
        posenc.build_model("rope", 10, causal=True, d_model=32, n_heads=4, factor=8.0)
    with pytest.raises(ValueError, match="factor must be 1"):
        scheme().set_scaling(None, 2.0)
