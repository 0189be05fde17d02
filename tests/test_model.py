"""The shared Transformer, the Scheme hooks and build_model's contract."""
import pytest
import torch
import torch.nn.functional as F

import posenc
from posenc.attention import causal_mask, explicit_attention, merge_mask
from posenc.scheme import PositionContext, Scheme
from conftest import assert_no_causal_leak, skip_bidirectional_if_causal_only, small_model

ALL = sorted(posenc.SCHEMES)


@pytest.mark.parametrize("scheme", ALL)
@pytest.mark.parametrize("causal", [True, False])
def test_every_scheme_runs_forward_and_backward(scheme, causal):
    skip_bidirectional_if_causal_only(scheme, causal)
    model = small_model(scheme, causal).train()
    tokens = torch.randint(0, 23, (3, 17))
    logits = model(tokens)
    assert logits.shape == (3, 17, 23)
    logits.logsumexp(-1).mean().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("scheme", ALL)
def test_every_scheme_runs_with_its_weights_cast_to_bf16(scheme):
    """model.to(torch.bfloat16) runs forward and backward and stays close to the float32 model (FIRE's MLP
    once received a float32 input here and failed)."""
    torch.manual_seed(0)
    model = small_model(scheme, causal=True)
    tokens = torch.randint(0, 23, (2, 17))
    expected = model(tokens)
    low = small_model(scheme, causal=True)
    low.load_state_dict(model.state_dict())
    logits = low.to(torch.bfloat16)(tokens)
    assert logits.dtype == torch.bfloat16
    logits.float().logsumexp(-1).mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in low.parameters() if p.requires_grad)
    torch.testing.assert_close(logits.float(), expected, atol=0.15, rtol=0.05)


@pytest.mark.parametrize("scheme", ALL)
def test_causal_models_never_look_ahead(scheme):
    assert_no_causal_leak(small_model(scheme, causal=True))


@pytest.mark.parametrize("scheme", ALL)
@pytest.mark.parametrize("causal", [True, False])
def test_attention_on_a_context_built_by_hand_equals_the_models(scheme, causal):
    """`Attention` used on its own, with `PositionContext(positions, causal)` and nothing else filled, computes
    what it computes inside the model: the scheme's shared bias is not dropped and the causal mask is not
    lost when per-layer terms (KERPLE, FIRE, CoPE) or a bias (ALiBi, T5) make the mask explicit."""
    skip_bidirectional_if_causal_only(scheme, causal)
    torch.manual_seed(0)
    model = small_model(scheme, causal)
    attn, x = model.blocks[0].attn, torch.randn(2, 12, 32)
    if scheme in INPUT_ONLY:       # nothing inside attention: alone, the layer would silently be NoPE's
        with pytest.raises(ValueError, match="adds position to the layer's input.*same as NoPE"):
            attn(x, model.scheme, PositionContext(torch.arange(12), causal))
        return
    expected = attn(x, model.scheme, model.context(12, None, "cpu"))[0]
    by_hand = attn(x, model.scheme, PositionContext(torch.arange(12), causal))[0]
    torch.testing.assert_close(by_hand, expected)
    if causal:                                           # and the last token reaches no earlier output
        later = x.clone()
        later[:, -1] += 1.0
        changed = attn(later, model.scheme, PositionContext(torch.arange(12), causal))[0]
        torch.testing.assert_close(changed[:, :-1], by_hand[:, :-1])


#: The schemes whose every hook acts on the residual stream: one `Attention` layer cannot apply them.
INPUT_ONLY = {"learned", "sinusoidal", "floater", "multiplicative", "complex", "rnn"}


def test_the_input_only_schemes_are_those_with_no_hook_inside_attention():
    found = {name for name, cls in posenc.SCHEMES.items() if cls.input_only()}
    assert found == INPUT_ONLY


def test_attention_refuses_a_hand_built_context_that_disagrees_with_its_input_or_scheme():
    """Each mismatch a hand-built context can carry is an error naming it, not a wrong answer or a traceback
    from inside a kernel: positions per token, the masking the scheme was built for, the layer index."""
    torch.manual_seed(0)
    kerple = small_model("kerple", causal=True)                 # 2 layers, d_model 32
    attn, x = kerple.blocks[0].attn, torch.randn(2, 12, 32)
    with pytest.raises(ValueError, match="ctx.positions has 10 positions but x has 12 tokens"):
        attn(x, kerple.scheme, PositionContext(torch.arange(10), causal=True))
    with pytest.raises(ValueError, match="ctx.causal=False but the scheme was built with causal=True"):
        attn(x, kerple.scheme, PositionContext(torch.arange(12), causal=False))
    with pytest.raises(ValueError, match="layer=5 but the scheme has per-layer parameters for n_layers=2"):
        posenc.Attention(32, 4, layer=5)(x, kerple.scheme, PositionContext(torch.arange(12), causal=True))
    with pytest.raises(ValueError, match="x must be a \\[batch, seq, d_model\\] tensor"):
        attn(x[0], kerple.scheme, PositionContext(torch.arange(12), causal=True))
    for bad in (-1, 0.5, True, "0"):
        with pytest.raises(ValueError, match="layer must be an int >= 0"):
            posenc.Attention(32, 4, layer=bad)
    with pytest.raises(TypeError, match="positions must be a 1-D tensor"):
        PositionContext([0, 1, 2], causal=True)
    with pytest.raises(TypeError, match="positions must be a 1-D tensor"):
        PositionContext(torch.zeros(2, 3), causal=True)
    for bad in (None, "yes", 1):
        with pytest.raises(TypeError, match="causal must be True or False"):
            PositionContext(torch.arange(3), causal=bad)


def test_causal_mask_refuses_sizes_that_leave_a_query_without_keys():
    m = causal_mask(2, 4)
    assert m.tolist() == [[0, 0, 0, float("-inf")], [0, 0, 0, 0]]
    with pytest.raises(ValueError, match="q_len=5 > k_len=3"):
        causal_mask(5, 3)
    for args, name in (((-1, 3), "q_len"), ((3.0, 3), "q_len"), ((2, "3"), "k_len")):
        with pytest.raises(ValueError, match=f"{name} must be an int >= 0"):
            causal_mask(*args)


def test_a_hand_built_context_is_left_as_given_and_serves_again():
    """Filled in a copy: the same context trains T5 for two steps (no graph of step 1 is kept in it) and then
    serves NoPE as a fresh one would (no ALiBi or T5 bias left behind); memory without key positions is refused."""
    torch.manual_seed(0)
    ctx = PositionContext(torch.arange(10), causal=True)
    t5 = small_model("t5", causal=True).train()
    for _ in range(2):
        t5.blocks[0].attn(torch.randn(2, 10, 32), t5.scheme, ctx)[0].sum().backward()
    assert not ctx.ready and ctx.attn_mask is None and not ctx.tables
    nope, x = small_model("nope", causal=True), torch.randn(2, 10, 32)
    torch.testing.assert_close(nope.blocks[0].attn(x, nope.scheme, ctx)[0],
                               nope.blocks[0].attn(x, nope.scheme, PositionContext(torch.arange(10), True))[0])
    with pytest.raises(ValueError, match="memory needs a context whose keys include it"):
        nope.blocks[0].attn(x, nope.scheme, ctx, memory=torch.randn(2, 4, 32))


def test_merge_mask_adds_the_causal_mask_to_a_bias_set_by_the_caller():
    scheme = posenc.SCHEMES["alibi"](d_model=32, n_heads=4, n_layers=1, max_len=64, causal=True)
    ctx = PositionContext(torch.arange(6), causal=True)
    ctx.tables = scheme.prepare(ctx)
    bias = scheme.logit_bias(ctx)
    ctx.attn_mask = bias
    merge_mask(scheme, ctx)
    assert ctx.ready
    torch.testing.assert_close(ctx.attn_mask, bias + causal_mask(6, 6))


def test_bidirectional_nope_is_permutation_equivariant():
    """f(P X) = P f(X): without positions, attention only sees a set."""
    model = small_model("nope", causal=False)
    tokens = torch.randint(0, 23, (4, 15))
    perm = torch.randperm(15)
    torch.testing.assert_close(model(tokens[:, perm]), model(tokens)[:, perm], rtol=1e-5, atol=1e-5)


def test_causal_nope_is_not_permutation_equivariant():
    model = small_model("nope", causal=True)
    tokens = torch.randint(0, 23, (4, 15))
    perm = torch.randperm(15)
    assert not torch.allclose(model(tokens[:, perm]), model(tokens)[:, perm], atol=1e-4)


@pytest.mark.parametrize("causal", [True, False])
def test_nope_ignores_a_shift_of_positions(causal):
    model = small_model("nope", causal)
    tokens = torch.randint(0, 23, (2, 9))
    torch.testing.assert_close(model(tokens, torch.arange(9) + 1000), model(tokens))
    torch.testing.assert_close(model(tokens, torch.arange(9.0) * 0.5), model(tokens))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("mask", [False, True])
def test_explicit_attention_equals_fused_sdpa(causal, mask):
    q, k, v = torch.randn(3, 2, 4, 11, 8).unbind(0)
    bias = torch.randn(4, 11, 11) if mask else None
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=causal and not mask, scale=0.3)
    if causal and mask:
        bias = bias + causal_mask(11, 11)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.3)
    out, probs = explicit_attention(q, k, v, bias, 0.3, is_causal=causal and not mask)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 4, 11))


def test_causal_mask_is_right_aligned_for_unequal_lengths():
    m = causal_mask(2, 5)
    assert torch.isinf(m).tolist() == [[False] * 4 + [True], [False] * 5]


class _Bias(Scheme):
    """A fixed random bias through hook 3 (logit_bias)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.table = torch.nn.Parameter(torch.randn(self.n_heads, 64, 64))

    def logit_bias(self, ctx):
        T = ctx.seq_len
        return self.table[:, :T, :T]


class _BiasAsExtraLogits(_Bias):
    """The same bias through hook 4 (extra_logits), per layer."""

    def logit_bias(self, ctx):
        return None

    def extra_logits(self, q, k, ctx, layer):
        return _Bias.logit_bias(self, ctx).expand(q.shape[0], -1, -1, -1)


class _ZeroValues(_Bias):
    """Hook 4 through extra_values (adds zero): forces the explicit softmax path."""
    uses_extra_values = True

    def extra_values(self, probs, ctx, layer):
        return torch.zeros(*probs.shape[:-1], self.head_dim)


class _Counting(Scheme):
    calls = 0

    def prepare(self, ctx):
        type(self).calls += 1
        return {}


@pytest.fixture
def test_schemes(monkeypatch):
    for name, cls in {"_bias": _Bias, "_extra": _BiasAsExtraLogits, "_values": _ZeroValues,
                      "_count": _Counting}.items():
        monkeypatch.setitem(posenc.SCHEMES, name, cls)


@pytest.mark.parametrize("causal", [True, False])
def test_all_attention_paths_agree(test_schemes, causal):
    """Fused SDPA with a bias mask == per-layer extra logits == explicit softmax path."""
    models = [small_model(name, causal) for name in ("_bias", "_extra", "_values")]
    for m in models[1:]:
        m.load_state_dict(models[0].state_dict())
    tokens = torch.randint(0, 23, (2, 13))
    outs = [m(tokens) for m in models]
    assert models[0].scheme.custom_attention is False and models[1].scheme.custom_attention is True
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs[2], outs[0], rtol=1e-5, atol=1e-5)


def test_tables_are_prepared_once_per_forward(test_schemes):
    model = small_model("_count", n_layers=3)
    _Counting.calls = 0
    model(torch.randint(0, 23, (2, 5)))
    assert _Counting.calls == 1


@pytest.mark.parametrize("causal", [True, False])
def test_attention_maps_are_distributions(causal):
    model = small_model("nope", causal)
    maps = model.attention_maps(torch.randint(0, 23, (2, 9)))
    assert len(maps) == 2 and maps[0].shape == (2, 4, 9, 9)
    torch.testing.assert_close(maps[0].sum(-1), torch.ones(2, 4, 9))
    if causal:
        assert (maps[1].triu(1) == 0).all()


def test_cls_token_takes_first_position_and_classifies():
    model = small_model("nope", causal=False, cls_token=True, num_classes=3)
    tokens = torch.randint(0, 23, (2, 6))
    assert model(tokens).shape == (2, 6, 23)
    assert model.classify(tokens).shape == (2, 3)
    ctx = model.context(6, None, "cpu")
    assert ctx.has_cls and ctx.positions.tolist() == [0, 1, 2, 3, 4, 5, 6]
    with pytest.raises(ValueError, match="num_classes"):
        small_model("nope", causal=False).classify(tokens)


def test_head_is_tied_unless_asked_otherwise():
    tied, untied = small_model(), small_model(tie_weights=False)
    assert tied.head.weight.data_ptr() == tied.tok.weight.data_ptr()
    assert untied.head.weight.data_ptr() != untied.tok.weight.data_ptr()


def test_unknown_scheme_lists_the_known_names():
    with pytest.raises(ValueError, match="unknown scheme 'nothing'.*nope"):
        posenc.build_model("nothing", 10, causal=True)


@pytest.mark.parametrize("bad, error, match", [
    (torch.zeros(2, 5), TypeError, "tokens must be a long tensor"),
    (torch.zeros(5, dtype=torch.long), TypeError, "tokens must be a long tensor"),
    (torch.full((2, 5), 23), ValueError, "vocab_size=23"),
    (torch.full((2, 5), -1), ValueError, "vocab_size=23"),
])
def test_bad_tokens_raise_clear_errors(bad, error, match):
    with pytest.raises(error, match=match):
        small_model()(bad)


def test_bad_positions_raise_clear_errors():
    model, tokens = small_model(), torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"positions must be a 1-D tensor \[seq=5\]"):
        model(tokens, torch.arange(4))
    with pytest.raises(ValueError, match="positions must be a 1-D"):
        model(tokens, torch.arange(10).view(2, 5))
    with pytest.raises(TypeError, match="positions must be an integer, float32 or float64 tensor; got torch.bool"):
        model(tokens, torch.ones(5, dtype=torch.bool))


@pytest.mark.parametrize("kwargs, match", [
    ({"d_model": 30, "n_heads": 4}, "divisible by n_heads"),
    ({"n_layers": 0}, "n_layers must be a positive int"),
    ({"max_len": -3}, "max_len must be a positive int"),
])
def test_bad_sizes_raise_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        posenc.build_model("nope", 10, causal=True, **kwargs)


def test_causal_is_required_and_boolean():
    with pytest.raises(TypeError):
        posenc.build_model("nope", 10)
    with pytest.raises(TypeError, match="causal must be True or False"):
        posenc.build_model("nope", 10, causal="yes")
    with pytest.raises(ValueError, match="vocab_size"):
        posenc.build_model("nope", 0, causal=True)


@pytest.mark.parametrize("built, model, match", [
    (dict(d_model=16, n_heads=4), dict(d_model=32, n_heads=4), "scheme d_model=16 but model d_model=32"),
    (dict(n_heads=1), dict(n_heads=4), "scheme n_heads=1 but model n_heads=4"),
    (dict(n_layers=1), dict(n_layers=2), "scheme n_layers=1 but model n_layers=2"),
    (dict(causal=True), dict(causal=False), "scheme causal=True but model causal=False"),
])
@pytest.mark.parametrize("name", ["rope", "alibi", "learned", "cope"])
def test_a_scheme_built_for_another_model_is_refused(name, built, model, match):
    """A RoPE for 4-dim heads in a model of 8-dim heads would rotate half of each head; an ALiBi with one
    head would hand every head the same slope. Both used to run."""
    sizes = dict(d_model=32, n_heads=4, n_layers=2, causal=True)
    scheme = posenc.SCHEMES[name](**{**sizes, **built}, max_len=64)
    with pytest.raises(ValueError, match=match):
        posenc.Transformer(scheme, 23, **{**sizes, **model})
    posenc.Transformer(posenc.SCHEMES[name](**sizes, max_len=64), 23, **sizes)      # matched: builds


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(d_model=30, n_heads=4), ValueError, "d_model=30 must be divisible by n_heads=4"),
    (dict(n_heads=0), ValueError, "n_heads must be a positive int"),
    (dict(n_layers=1.0), ValueError, "n_layers must be a positive int"),
    (dict(causal="yes"), TypeError, "causal must be True or False"),
])
def test_schemes_built_directly_check_their_sizes(kwargs, error, match):
    sizes = dict(d_model=32, n_heads=4, n_layers=2, max_len=64, causal=True)
    for name in ("nope", "alibi", "t5"):
        with pytest.raises(error, match=match):
            posenc.SCHEMES[name](**{**sizes, **kwargs})


def test_unknown_scheme_kwarg_is_a_type_error():
    with pytest.raises(TypeError, match="not_an_option"):
        posenc.build_model("nope", 10, causal=True, not_an_option=1)


class _LayerCounter(Scheme):
    """Adds the layer index + 1 to the residual stream before each block."""

    def layer_input(self, x, ctx, layer):
        return x + (layer + 1)


def test_layer_input_runs_before_every_block(monkeypatch):
    monkeypatch.setitem(posenc.SCHEMES, "_layers", _LayerCounter)
    seen = []
    model = small_model("_layers", n_layers=3)
    for block in model.blocks:
        block.register_forward_pre_hook(lambda mod, args: seen.append(args[0].mean().item()))
    model(torch.zeros(1, 4, dtype=torch.long))
    base = model.tok.weight[0].mean().item()
    assert seen[0] == pytest.approx(base + 1, abs=1e-5)
    assert len(seen) == 3


# -- capabilities declared by each scheme drive these shared tests ----------------------------
SHIFT_INVARIANT = [n for n in ALL if posenc.SCHEMES[n].shift_invariant]
WITH_MEMORY = [n for n in ALL if posenc.SCHEMES[n].supports_memory]


def test_capability_flags_are_declared_where_they_hold():
    assert {"nope", "alibi", "t5", "shaw", "xl", "rope"} <= set(SHIFT_INVARIANT)
    assert not {"learned", "sinusoidal", "floater"} & set(SHIFT_INVARIANT)
    assert posenc.SCHEMES["nope"].overridden_hooks() == ()
    assert posenc.SCHEMES["rope"].overridden_hooks() == ("prepare", "transform_qk", "layer_transform_qk")
    assert "extra_values" in posenc.SCHEMES["shaw"].overridden_hooks() and small_model("shaw").scheme.uses_extra_values


@pytest.mark.parametrize("scheme", SHIFT_INVARIANT)
@pytest.mark.parametrize("causal", [True, False])
def test_shift_invariant_schemes_ignore_an_offset_of_every_position(scheme, causal):
    skip_bidirectional_if_causal_only(scheme, causal)
    model = small_model(scheme, causal, max_len=2048)
    tokens = torch.randint(0, 23, (2, 11))
    for c in (1, 37, 1000):
        torch.testing.assert_close(model(tokens, torch.arange(11) + c), model(tokens), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("scheme", [n for n in ALL if not posenc.SCHEMES[n].shift_invariant and n != "complex"])
def test_absolute_schemes_see_an_offset(scheme):
    model = small_model(scheme, True, max_len=2048)
    tokens = torch.randint(0, 23, (2, 11))
    # An offset past FIRE's threshold (512 at init: below it FIRE's normaliser is a constant); TUPE at init: ~4e-7.
    assert not torch.equal(model(tokens, torch.arange(11) + 1000), model(tokens))


@pytest.mark.parametrize("scheme", [n for n in ALL if posenc.SCHEMES[n].causal_only])
def test_causal_only_schemes_refuse_a_bidirectional_model(scheme):
    with pytest.raises(ValueError, match="causal"):
        small_model(scheme, causal=False)


@pytest.mark.parametrize("scheme", WITH_MEMORY)
def test_schemes_with_memory_accept_one(scheme):
    model = small_model(scheme, True)
    tokens = torch.randint(0, 23, (2, 6))
    logits, memory = model.forward_segment(tokens)
    logits2, _ = model.forward_segment(tokens, memory)
    assert logits2.shape == logits.shape and torch.isfinite(logits2).all()
    assert not torch.allclose(logits2, logits, atol=1e-4)          # the memory's keys are attended to


class _PerLayerBias(Scheme):
    """A different distance penalty in each layer, through the per-layer logit-bias hook."""

    def layer_logit_bias(self, ctx, layer):
        d = (ctx.positions[None, :] - ctx.positions[:, None]).abs().float()
        return -(layer + 1) * 0.5 * d[None]


def test_layer_logit_bias_hook_adds_its_own_bias_in_each_layer(monkeypatch):
    monkeypatch.setitem(posenc.SCHEMES, "_perlayer", _PerLayerBias)
    torch.manual_seed(0)
    model = small_model("_perlayer", causal=True)
    assert model.scheme.custom_attention and model.scheme.overridden_hooks() == ("layer_logit_bias",)
    tokens = torch.randint(0, 23, (2, 9))
    maps = model.attention_maps(tokens)
    x = model.tok(tokens)
    for layer, block in enumerate(model.blocks):
        h = block.ln1(x)
        q, k, v = block.attn.qkv(h).view(2, 9, 3, 4, 8).permute(2, 0, 3, 1, 4)
        d = (torch.arange(9)[None] - torch.arange(9)[:, None]).abs().float()
        logits = q @ k.transpose(-1, -2) / 8 ** 0.5 - (layer + 1) * 0.5 * d + causal_mask(9, 9)
        torch.testing.assert_close(maps[layer], logits.softmax(-1), rtol=1e-5, atol=1e-5)
        x, _ = block(x, model.scheme, model.context(9, None, "cpu"))


@pytest.mark.parametrize("heads", [4, 1])
@pytest.mark.parametrize("scale", [0.25, 0.1234])
def test_the_learned_bias_path_is_sdpas_math_path_bit_for_bit(heads, scale):
    """On the CPU a bias that learns goes through `learned_bias_attention`: SDPA's own numbers and
    gradients (q, k, v and the bias), without its pass that zeroes fully masked rows."""
    from posenc.attention import learned_bias_attention
    q, k, v = (torch.randn(3, 4, 40, 8, requires_grad=True) for _ in range(3))
    mask = (torch.randn(1, heads, 40, 40) + causal_mask(40, 40)).requires_grad_()
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    got = learned_bias_attention(q, k, v, mask, scale)
    assert torch.equal(got, want)
    g = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad(got, [q, k, v, mask], g), torch.autograd.grad(want, [q, k, v, mask], g)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("scheme", ["t5", "kerple", "fire"])
def test_learned_bias_models_train_through_the_lean_path_with_sdpas_gradients(monkeypatch, scheme):
    import posenc.attention as attention
    x = torch.randint(0, 23, (2, 20))
    grads = []
    for lean in (True, False):
        torch.manual_seed(0)
        model = small_model(scheme).train()
        calls = []
        real = attention.learned_bias_attention
        monkeypatch.setattr(attention, "learned_bias_attention", lambda *a: calls.append(1) or (
            real(*a) if lean else F.scaled_dot_product_attention(*a[:4], scale=a[4])))
        posenc.model.lm_loss(model(x), torch.roll(x, -1, 1)).backward()
        assert len(calls) == 2                                                    # one per layer
        grads.append([p.grad for p in model.parameters() if p.grad is not None])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


@pytest.mark.parametrize("scheme, kwargs, match", [
    ("learned", {"init_std": float("nan")}, "init_std must be a finite number > 0"),
    ("multiplicative", {"init_std": "0.02"}, "init_std must be"),
    ("sinusoidal", {"scale": float("nan")}, "scale must be 'learned', 'vaswani' or a finite number"),
    ("sinusoidal", {"scale": float("inf")}, "scale must be"),
    ("sinusoidal", {"base": 0.5}, "base must be a finite number > 1"),
    ("complex", {"base": 0}, "base must be a finite number > 1"),
    ("floater", {"delta": float("inf")}, "delta must be a finite number > 0"),
    ("floater", {"delta": "0.1"}, "delta must be"),
    ("floater", {"hidden": 0}, "hidden must be a positive int or None"),
    ("floater", {"hidden": True}, r"hidden must be a positive int or None \(d_model\); got True"),
    ("floater", {"max_position": 0}, r"max_position must be a positive int or None \(no limit\); got 0"),
    ("floater", {"max_position": 2.5}, "max_position must be a positive int or None"),
])
def test_options_that_made_every_output_nan_are_refused_by_name(scheme, kwargs, match):
    """Each of these used to build a model whose logits were all NaN (or to fail deep inside torch)."""
    with pytest.raises(ValueError, match=match):
        posenc.build_model(scheme, 23, causal=True, d_model=32, n_heads=4, n_layers=2, max_len=64, **kwargs)


# -- bad options are refused when the model is built, by name (not at the first forward, nor silently) ---------
@pytest.mark.parametrize("scheme, kwargs, error, match", [
    ("xl", dict(d_model=15, n_heads=3), ValueError, "d_model must be even"),
    ("deberta", dict(bucket_size=3, max_position=64), ValueError, "bucket_size must be an int >= 4"),
    ("deberta", dict(bucket_size=8, max_position=4), ValueError, "max_position must be an int"),
    ("deberta", dict(terms=None), TypeError, "terms must be a tuple"),
    ("tupe", dict(relative=True, num_buckets=0), ValueError, "num_buckets"),
    ("tupe", dict(relative=True, max_distance=0), ValueError, "max_distance"),
    ("floater", dict(method="euler2"), ValueError, "method must be one of torchdiffeq's solvers"),
])
def test_bad_scheme_options_are_refused_at_build_time(scheme, kwargs, error, match):
    with pytest.raises(error, match=match):
        posenc.build_model(scheme, 10, causal=False, **{"d_model": 32, "n_heads": 4, **kwargs})


def test_floaters_solver_names_are_torchdiffeqs():
    from torchdiffeq._impl.odeint import SOLVERS
    from posenc.schemes.floater import SOLVERS as ours
    assert set(ours) == set(SOLVERS)


def test_a_causal_model_cannot_classify_from_cls_which_would_see_only_itself():
    """[CLS] sits at position 0: under the causal mask its state ignores the input, so classify() would give every
    input the same logits. Refused at build time; without [CLS] (mean pooling) or bidirectional it is fine."""
    with pytest.raises(ValueError, match="cls_token=True with causal=True cannot classify"):
        posenc.build_model("rope", 10, d_model=32, n_heads=4, causal=True, cls_token=True, num_classes=3)
    tokens = torch.randint(0, 10, (4, 12))
    for causal, cls in ((True, False), (False, True)):
        torch.manual_seed(0)
        model = posenc.build_model("rope", 10, d_model=32, n_heads=4, causal=causal, cls_token=cls, num_classes=3)
        logits = model.classify(tokens)
        assert not torch.allclose(logits[0], logits[1])             # the class depends on the input


def test_functional_inputs_are_checked_by_name():
    from posenc.functional import apply_rope, apply_xpos, rel_shift
    from posenc.vision import interpolate_pos_embed
    q = torch.randn(1, 3, 4)
    with pytest.raises(ValueError, match="scale_base"):
        apply_xpos(q, q, torch.arange(3), scale_base=0)
    with pytest.raises(TypeError, match="k_len must be an int"):
        rel_shift(torch.randn(2, 5), 5.0)
    with pytest.raises(ValueError, match="x must be a tensor"):
        rel_shift([[1.0]])
    with pytest.raises(ValueError, match="positions must be finite"):
        apply_rope(q, torch.tensor([0.0, float("nan"), 2.0]))
    with pytest.raises(TypeError, match="floating-point table"):
        interpolate_pos_embed(torch.arange(32).reshape(16, 2), (4, 4), (3, 3))
    table = torch.randn(16, 2, dtype=torch.float64)
    out = interpolate_pos_embed(table, (4, 4), (3, 3))
    direct = torch.nn.functional.interpolate(table.T.reshape(1, 2, 4, 4), size=(3, 3), mode="bicubic",
                                             align_corners=False)
    assert out.dtype == torch.float64 and torch.equal(out, direct.reshape(2, 9).T)   # resampled in float64


def test_relative_index_functions_refuse_bools_and_agree_on_empty_queries():
    """A bool is an int in Python: True would have served as a distance of 1. Zero queries give an empty table in
    both relative-index functions (DeBERTa's used to refuse what Shaw's accepted)."""
    from posenc.functional import clipped_relative_positions, relative_distance
    for f in (clipped_relative_positions, relative_distance):
        assert f(0, 3, 2).shape == (0, 3)
        for bad in ((True, 3, 2), (3, 3, True)):
            with pytest.raises(ValueError, match="must be a (non-negative|positive) int; got True"):
                f(*bad)
    with pytest.raises(ValueError, match="k must be a positive int"):
        posenc.build_model("deberta", 10, d_model=32, n_heads=4, causal=False, k=True)


def test_build_model_names_a_keyword_the_scheme_does_not_take():
    with pytest.raises(TypeError, match=r"scheme 'alibi' takes no keyword base; its own keywords: none"):
        posenc.build_model("alibi", 16, causal=True, base=500.0)
    with pytest.raises(TypeError, match=r"scheme 'rope' takes no keyword scale_base; its own keywords: .*base"):
        posenc.build_model("rope", 16, causal=True, scale_base=512)
    posenc.build_model("xpos", 16, causal=True, scale_base=64.0, base=500.0)        # its own and RoPE's


@pytest.mark.parametrize("bad, error, match", [
    (torch.arange(20).bfloat16(), TypeError, "rounds positions"),
    (torch.arange(20).half(), TypeError, "rounds positions"),
    (torch.arange(20) > 3, TypeError, "integer, float32 or float64"),
    (torch.arange(19), ValueError, r"1-D tensor \[seq=20\]"),
    (torch.tensor([0.0] * 19 + [float("nan")]), ValueError, "finite"),
])
def test_one_rule_for_positions_in_the_model_and_the_functions(bad, error, match):
    """The model and the public functions apply `check_positions`: half-precision positions are refused
    everywhere (bfloat16 rounds every integer above 256), not rounded in one place and refused in another."""
    from posenc.alibi import alibi_bias, alibi_slopes
    from posenc.functional import apply_rope, fire_bias, kerple_bias
    with pytest.raises(error, match=match):
        small_model("rope")(torch.randint(0, 23, (1, 20)), positions=bad)
    if len(bad) == 20:                                    # the functions take any length
        for call in (lambda: apply_rope(torch.randn(20, 8), bad), lambda: alibi_bias(bad, alibi_slopes(2)),
                     lambda: kerple_bias(bad, torch.ones(2), torch.ones(2)),
                     lambda: fire_bias(bad, torch.nn.Linear(1, 2), 1.0, 4.0)):
            with pytest.raises(error, match=match):
                call()
