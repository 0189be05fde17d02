"""T5's relative buckets and bias: equality with transformers, the bucket map's claims, fused SDPA."""
import math

import pytest
import torch
from transformers import T5Config
from transformers.models.t5.modeling_t5 import T5Attention

import posenc
from posenc.bias import t5_bucket
from conftest import small_model

SETTINGS = [(True, 32, 128), (False, 32, 128), (True, 64, 256), (False, 16, 64), (True, 8, 20), (False, 128, 1000)]


@pytest.mark.parametrize("bidirectional,num_buckets,max_distance", SETTINGS)
def test_t5_bucket_equals_transformers(bidirectional, num_buckets, max_distance):
    rel = torch.arange(-2000, 2001)                                              # key_pos - query_pos
    want = T5Attention._relative_position_bucket(rel, bidirectional, num_buckets, max_distance)
    got = t5_bucket(rel, bidirectional, num_buckets, max_distance)
    assert got.dtype == torch.long and torch.equal(got, want)


@pytest.mark.parametrize("bidirectional,num_buckets,max_distance", SETTINGS)
def test_bucket_map_is_exact_then_logarithmic_then_saturated(bidirectional, num_buckets, max_distance):
    half = num_buckets // 2 if bidirectional else num_buckets
    exact = half // 2
    n = torch.arange(0, 3 * max_distance)
    past = t5_bucket(-n, bidirectional, num_buckets, max_distance)               # keys before the query
    assert past[:exact].tolist() == list(range(exact))                           # one bucket per distance < m
    assert (past.diff() >= 0).all() and past.max() == half - 1                   # monotone, all buckets used
    assert (past[max_distance:] == half - 1).all()                               # saturated from max_distance on
    widths = torch.bincount(past, minlength=half)[exact:-1]
    assert (widths.diff() >= -1).all()                                           # log buckets widen with distance
    future = t5_bucket(n[1:], bidirectional, num_buckets, max_distance)
    if bidirectional:
        assert torch.equal(future, past[1:] + half)                              # the sign takes the upper half
    else:
        assert (future == 0).all()                                               # causal: future keys share bucket 0


def test_t5_bucket_rejects_bad_input():
    with pytest.raises(TypeError):
        t5_bucket(torch.arange(3.0))
    with pytest.raises(ValueError):
        t5_bucket(torch.arange(3), num_buckets=2)
    with pytest.raises(ValueError):
        t5_bucket(torch.arange(3), num_buckets=32, max_distance=4)
    for bad in (None, 32.0, True):                       # None gave "unsupported operand type(s) for //"
        with pytest.raises(ValueError, match="num_buckets must be an int"):
            t5_bucket(torch.arange(3), num_buckets=bad)
    with pytest.raises(TypeError, match="register's name must be a non-empty str"):
        posenc.scheme.register(("t5", 2))                # would break every sorted() of the scheme names


@pytest.mark.parametrize("causal", [True, False])
def test_t5_bias_equals_transformers_compute_bias(causal):
    model = small_model("t5", causal)
    config = T5Config(d_model=32, d_kv=8, num_heads=4, relative_attention_num_buckets=32,
                      relative_attention_max_distance=128, is_decoder=causal)
    ref = T5Attention(config, has_relative_attention_bias=True)
    ref.relative_attention_bias.weight.data.copy_(model.scheme.bias.weight.data)
    ctx = model.context(40, None, "cpu")
    want = ref.compute_bias(40, 40)[0]                                           # (H, Q, K)
    torch.testing.assert_close(model.scheme.logit_bias(ctx), want)


def test_t5_table_is_computed_once_and_attention_stays_fused(monkeypatch):
    model = small_model("t5", causal=True, n_layers=3)
    assert not model.scheme.custom_attention and not model.scheme.uses_extra_values
    calls = {"prepare": 0, "bias": 0}
    prepare, bias = model.scheme.prepare, model.scheme.logit_bias

    def count(name, fn):
        def wrapped(*a, **k):
            calls[name] += 1
            return fn(*a, **k)
        return wrapped

    monkeypatch.setattr(model.scheme, "prepare", count("prepare", prepare))
    monkeypatch.setattr(model.scheme, "logit_bias", count("bias", bias))
    monkeypatch.setattr(posenc.attention, "explicit_attention", lambda *a, **k: pytest.fail("left fused SDPA"))
    model(torch.randint(0, 23, (2, 10)))
    assert calls == {"prepare": 1, "bias": 1}


@pytest.mark.parametrize("causal", [False, True])
def test_t5_bias_is_added_after_scaling_and_unscaled(causal):
    """Layer 0's attention equals softmax(q k^T / sqrt(d_h) + b_h[bucket(j - i)]) built here from the model's
    weights, with T5's own bucket function (transformers') and the mask: a bias scaled by 1/sqrt(d_h), or any
    other factor, or put in the wrong bucket, fails it. The fused path gives the explicit path's output."""
    model = small_model("t5", causal=causal)
    s = model.scheme
    torch.nn.init.normal_(s.bias.weight)                                     # a bias that matters (init is 0)
    tokens = torch.randint(0, 23, (2, 12))
    B, N = tokens.shape
    assert "embed" not in s.overridden_hooks()                               # no position at the input
    h = model.blocks[0].ln1(model.tok(tokens))
    q, k, _ = model.blocks[0].attn.qkv(h).view(B, N, 3, s.n_heads, s.head_dim).permute(2, 0, 3, 1, 4)
    rel = torch.arange(N)[None, :] - torch.arange(N)[:, None]                # key - query
    bucket = T5Attention._relative_position_bucket(rel, bidirectional=not causal, num_buckets=s.num_buckets,
                                                   max_distance=s.max_distance)
    logits = q @ k.transpose(-2, -1) / math.sqrt(s.head_dim) + s.bias(bucket).permute(2, 0, 1)
    if causal:
        logits = logits.masked_fill(rel > 0, float("-inf"))
    torch.testing.assert_close(model.attention_maps(tokens)[0], logits.softmax(-1), rtol=1e-5, atol=1e-6)
    h, _ = model.hidden_states(tokens, need_weights=True)                    # explicit softmax path
    torch.testing.assert_close(model.head(h), model(tokens), rtol=1e-5, atol=1e-5)


def test_t5_serves_lengths_beyond_max_distance_and_bidirectional_default():
    causal, bidir = small_model("t5", causal=True), small_model("t5", causal=False)
    assert causal.scheme.bidirectional is False and bidir.scheme.bidirectional is True
    assert causal(torch.randint(0, 23, (1, 300))).shape == (1, 300, 23)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n, offset", [(1, 0), (7, 3), (40, 1000)])
def test_toeplitz_bias_of_consecutive_positions_equals_the_general_gather(causal, n, offset):
    """Consecutive positions take the (2n-1)-distance path; float positions the (n, n) bucket gather."""
    from posenc.scheme import PositionContext
    scheme = posenc.SCHEMES["t5"](d_model=32, n_heads=4, n_layers=1, max_len=64, causal=causal)
    torch.nn.init.normal_(scheme.bias.weight)
    out, grads = [], []
    for pos in (torch.arange(n) + offset, (torch.arange(n) + offset).float()):
        ctx = PositionContext(pos, causal)
        ctx.tables = scheme.prepare(ctx)
        b = scheme.logit_bias(ctx)
        w = torch.randn(b.shape, generator=torch.Generator().manual_seed(0))
        out.append(b)
        grads.append(torch.autograd.grad((b * w).sum(), scheme.bias.weight)[0])
    assert torch.equal(out[0], out[1])
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-4)   # float32 sums in another order


def test_register_refuses_to_rebind_a_schemes_name_unless_asked():
    """A run's key names its scheme, not the class: a second class under "rope" would read the book's RoPE
    records. The same class defined again (a module reload) rebinds itself; replace=True rebinds on purpose."""
    from posenc.scheme import SCHEMES, Scheme, register
    original = SCHEMES["rope"]
    with pytest.raises(ValueError, match="scheme name 'rope' is taken by posenc.schemes.rotary.RoPE"):
        @register("rope")
        class Mine(Scheme):
            pass
    assert SCHEMES["rope"] is original
    try:
        @register("test-reload")
        class Again(Scheme):
            pass
        first = Again
        @register("test-reload")
        class Again(Scheme):                                   # noqa: F811 (the same class, defined again)
            pass
        assert SCHEMES["test-reload"] is Again is not first
        @register("test-reload", replace=True)
        class Other(Scheme):
            pass
        assert SCHEMES["test-reload"] is Other
    finally:
        SCHEMES.pop("test-reload", None)
    with pytest.raises(TypeError, match="replace must be True or False"):
        register("x", replace="yes")
