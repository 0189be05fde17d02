"""posenc.functional.rope_inv_freq against transformers' ROPE_INIT_FUNCTIONS, and its first principles."""
import math

import pytest
import torch

from posenc.functional import rope_inv_freq

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

HEAD, HEADS = 64, 4
CASES = [
    ("linear", dict(factor=4.0), {}),
    ("dynamic", dict(factor=4.0), dict(seq_len=None)),
    ("dynamic", dict(factor=2.0), dict(seq_len=5000)),
    ("yarn", dict(factor=8.0, original_max_position_embeddings=512), {}),
    ("yarn", dict(factor=4.0, original_max_position_embeddings=1024, beta_fast=16, beta_slow=2), {}),
    ("yarn", dict(factor=4.0, original_max_position_embeddings=1024, mscale=1.0, mscale_all_dim=0.7), {}),
    ("yarn", dict(factor=4.0, original_max_position_embeddings=1024, attention_factor=1.5), {}),
    ("llama3", dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=512), {}),
    ("longrope", dict(short_factor=[1.0 + i / 32 for i in range(32)], long_factor=[1.0 + i / 8 for i in range(32)],
                      original_max_position_embeddings=1024), dict(seq_len=500)),
    ("longrope", dict(short_factor=[1.0 + i / 32 for i in range(32)], long_factor=[1.0 + i / 8 for i in range(32)],
                      original_max_position_embeddings=1024), dict(seq_len=3000)),
    # at seq_len = L exactly LongRoPE still uses its short factors: the switch is strictly past L
    ("longrope", dict(short_factor=[1.0 + i / 32 for i in range(32)], long_factor=[1.0 + i / 8 for i in range(32)],
                      original_max_position_embeddings=1024), dict(seq_len=1024)),
]


def reference(rope_type, params, max_pos, base, seq_len, partial=1.0):
    config = LlamaConfig(hidden_size=HEAD * HEADS, num_attention_heads=HEADS, max_position_embeddings=max_pos,
                         rope_parameters={"rope_type": rope_type, "rope_theta": base, "partial_rotary_factor": partial,
                                          **params})
    return ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len=seq_len)


@pytest.mark.parametrize("rope_type, params, call", CASES)
@pytest.mark.parametrize("base", [10000.0, 500000.0])
def test_every_scaling_equals_transformers(rope_type, params, call, base):
    max_pos = 4096
    ours, ours_factor = rope_inv_freq(HEAD, base, rope_type=rope_type, max_position_embeddings=max_pos, **call,
                                      **params)
    theirs, their_factor = reference(rope_type, params, max_pos, base, call.get("seq_len"))
    assert ours.dtype == theirs.dtype == torch.float32
    assert torch.equal(ours, theirs), (ours - theirs).abs().max()          # bit for bit: the same float32 roundings
    assert ours_factor == pytest.approx(their_factor, rel=1e-9)


def test_yarn_clamps_its_ramp_at_the_last_pair_as_transformers_does():
    """With a small base the slow edge of YaRN's ramp lies past the last pair: at base 100 and
    L = 4096 its pair index d ln(L / 2 pi) / (2 ln base) is about 45 > d/2 - 1 = 31, so the clamp
    (at d - 1, transformers' `find_correction_range`) sets the ramp's slope."""
    params = dict(factor=4.0, original_max_position_embeddings=4096)
    assert HEAD * math.log(4096 / (2 * math.pi)) / (2 * math.log(100.0)) > HEAD // 2 - 1
    ours, ours_factor = rope_inv_freq(HEAD, 100.0, rope_type="yarn", max_position_embeddings=16384, **params)
    theirs, their_factor = reference("yarn", params, 16384, 100.0, None)
    assert torch.equal(ours, theirs)
    assert ours_factor == pytest.approx(their_factor, rel=1e-9)


def test_default_and_partial_rotation_equal_transformers():
    config = LlamaConfig(hidden_size=HEAD * HEADS, num_attention_heads=HEADS,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    if "default" in ROPE_INIT_FUNCTIONS:
        theirs, _ = ROPE_INIT_FUNCTIONS["default"](config, "cpu")
    else:                                  # transformers 5 keeps the default on the model's rotary module
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
        theirs, _ = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    torch.testing.assert_close(rope_inv_freq(HEAD)[0], theirs)
    ours, _ = rope_inv_freq(HEAD, rope_type="linear", factor=2.0, partial_rotary_factor=0.5)
    theirs, _ = reference("linear", {"factor": 2.0}, 4096, 10000.0, None, partial=0.5)
    assert ours.shape == (HEAD // 4,)
    torch.testing.assert_close(ours, theirs)


def test_first_principles():
    inv, att = rope_inv_freq(64)
    assert att == 1.0 and inv[0] == 1.0 and torch.all(inv[1:] < inv[:-1])          # omega_0 = 1, decreasing
    torch.testing.assert_close(rope_inv_freq(64, rope_type="linear", factor=4.0)[0], inv / 4)
    # dynamic NTK is the default at the training length, and only grows the base beyond it
    dyn = lambda n: rope_inv_freq(64, rope_type="dynamic", factor=4.0, max_position_embeddings=512, seq_len=n)[0]
    torch.testing.assert_close(dyn(512), inv)
    assert torch.all(dyn(4096)[1:] < inv[1:]) and dyn(4096)[0] == 1.0
    # yarn: the fastest pairs keep their frequency, the slowest are interpolated by the factor
    yarn, t = rope_inv_freq(64, rope_type="yarn", factor=8.0, original_max_position_embeddings=512)
    assert yarn[0] == inv[0] and yarn[-1] == pytest.approx(inv[-1] / 8) and t == pytest.approx(0.1 * math.log(8) + 1)
    # llama3: short wavelengths kept, long ones divided by the factor
    ll, _ = rope_inv_freq(64, rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=512)
    wavelength = 2 * math.pi / inv
    torch.testing.assert_close(ll[wavelength < 128], inv[wavelength < 128])
    torch.testing.assert_close(ll[wavelength > 512], inv[wavelength > 512] / 8)


@pytest.mark.parametrize("kwargs, match", [
    (dict(rope_type="ntk"), "rope_type"), (dict(rope_type="linear"), "factor"),
    (dict(rope_type="linear", factor=2.0, beta_fast=3), "unknown parameters"),
    (dict(rope_type="dynamic", factor=2.0), "max_position_embeddings"),
    (dict(rope_type="longrope", short_factor=[1.0], long_factor=[1.0], original_max_position_embeddings=8,
          max_position_embeddings=16), "dim/2"),
    # values that used to give inf, NaN, negative or complex frequencies without a word
    (dict(rope_type="linear", factor=0), "factor must be a finite number > 0"),
    (dict(rope_type="linear", factor=math.nan), "factor must be a finite number > 0"),
    (dict(rope_type="dynamic", factor=-1.0, max_position_embeddings=128, seq_len=512), "factor must be"),
    (dict(rope_type="yarn", factor=0.0, original_max_position_embeddings=64), "factor must be"),
    (dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=0), "original_max_position_embeddings must be an int >= 2"),
    (dict(rope_type="yarn", factor=4.0, original_max_position_embeddings="4096"), "original_max_position_embeddings must be"),
    (dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64, beta_fast=-1), "beta_fast must be"),
    (dict(rope_type="llama3", factor=8.0, low_freq_factor=4.0, high_freq_factor=4.0,
          original_max_position_embeddings=512), "high_freq_factor must be > low_freq_factor"),
    (dict(rope_type="llama3", factor=8.0, low_freq_factor=0.0, high_freq_factor=4.0,
          original_max_position_embeddings=512), "low_freq_factor must be"),
    (dict(rope_type="longrope", short_factor=[0.0] * 32, long_factor=[1.0] * 32, original_max_position_embeddings=8,
          max_position_embeddings=16), "short_factor and long_factor must each be dim/2 = 32 positive"),
    (dict(rope_type="longrope", short_factor=[1.0] * 32, long_factor=[1.0] * 31, original_max_position_embeddings=8,
          max_position_embeddings=16, seq_len=4), "long_factor is"),
    (dict(rope_type="default", partial_rotary_factor="0.5"), "partial_rotary_factor must be a number"),
    (dict(rope_type="default", base=math.inf), "base must be a finite number"),
    (dict(rope_type="dynamic", factor=2.0, max_position_embeddings=128, seq_len=0), "seq_len must be"),
])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        rope_inv_freq(64, **kwargs)


def test_a_bf16_cache_is_badly_wrong_and_posenc_keeps_angles_in_float32():
    """Angles m * omega rounded to bf16 (8 bits of mantissa) are off by up to ~m/256 radians: users of
    some libraries reported cos/sin errors near 0.8 around position 1857. posenc computes angles in float32."""
    from posenc.functional import apply_rope
    positions = torch.arange(2048)
    inv, _ = rope_inv_freq(64)
    exact = positions.double()[:, None] * inv.double()[None]
    bf16_angles = (positions.to(torch.bfloat16)[:, None] * inv.to(torch.bfloat16)[None]).double()
    assert (bf16_angles.cos() - exact.cos()).abs().max() > 0.5                      # the reported failure
    x = torch.randn(1, 2048, 64)
    ref = apply_rope(x.double(), positions)
    ours = apply_rope(x.to(torch.bfloat16), positions).double()
    assert (ours - ref).abs().max() < 0.05                                        # bf16 rounding of x only


@pytest.mark.parametrize("rope_type, params, call", CASES)
def test_float64_frequencies_round_to_the_float32_ones(rope_type, params, call):
    """dtype=float64 computes the same frequencies without float32's rounding, and the same attention factor."""
    kw = dict(rope_type=rope_type, max_position_embeddings=4096, **call, **params)
    f32, a32 = rope_inv_freq(HEAD, 500000.0, **kw)
    f64, a64 = rope_inv_freq(HEAD, 500000.0, dtype=torch.float64, **kw)
    assert f64.dtype == torch.float64 and a64 == a32
    torch.testing.assert_close(f64.float(), f32, rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="dtype"):
        rope_inv_freq(HEAD, 500000.0, dtype=torch.float16, **kw)


def test_dynamic_scaling_names_its_smallest_rotated_dim_instead_of_dividing_by_zero():
    """base' = base (s n / L - (s - 1))^(d/(d-2)) has no value at d = 2: a ZeroDivisionError before."""
    with pytest.raises(ValueError, match="rope_type='dynamic' needs rotated dims >= 4"):
        rope_inv_freq(2, rope_type="dynamic", factor=2.0, max_position_embeddings=2048, seq_len=4096)
    with pytest.raises(ValueError, match="rotated dims >= 4"):
        rope_inv_freq(8, rope_type="dynamic", factor=2.0, max_position_embeddings=2048, seq_len=4096,
                      partial_rotary_factor=0.25)
    inv, _ = rope_inv_freq(4, rope_type="dynamic", factor=2.0, max_position_embeddings=2048, seq_len=4096)
    assert inv.shape == (2,) and torch.isfinite(inv).all()
