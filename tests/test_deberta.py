"""DeBERTa: relative distances and log buckets against transformers, the gather
algorithm against the naive [N, N, d] einsum, the 1/sqrt(3d) logits, shift
invariance of the relative part, and the Enhanced Mask Decoder's placement."""
import math

import pytest
import torch

import posenc
from posenc.deberta import (DeBERTa, c2p_p2c, c2p_p2c_naive, log_bucket_position, relative_distance,
                            relative_index)

from conftest import small_model

md = pytest.importorskip("transformers.models.deberta.modeling_deberta")
md2 = pytest.importorskip("transformers.models.deberta_v2.modeling_deberta_v2")


def _dummy(n):
    return torch.zeros(1, 1, n, 4)


@pytest.mark.parametrize("q_len,k_len,k", [(7, 7, 3), (12, 12, 4), (5, 9, 2), (9, 5, 16)])
def test_relative_distance_matches_transformers_deberta(q_len, k_len, k):
    rel = md.build_relative_position(_dummy(q_len), _dummy(k_len))[0]           # i - j
    assert torch.equal(relative_distance(q_len, k_len, k), torch.clamp(rel + k, 0, 2 * k - 1))


def test_relative_distance_is_papers_delta():
    k, d = 3, relative_distance(10, 10, 3)
    for i in range(10):
        for j in range(10):
            want = 0 if i - j <= -k else (2 * k - 1 if i - j >= k else i - j + k)
            assert d[i, j] == want


@pytest.mark.parametrize("bucket_size,max_position", [(8, 64), (16, 128), (256, 512)])
def test_log_buckets_match_transformers_deberta_v2(bucket_size, max_position):
    rel = torch.arange(-3 * max_position, 3 * max_position + 1)
    want = md2.make_log_bucket_position(rel, bucket_size, max_position).long()
    assert torch.equal(log_bucket_position(rel, bucket_size, max_position), want)
    n = 40
    ref = md2.build_relative_position(_dummy(n), _dummy(n), bucket_size=bucket_size, max_position=max_position)[0]
    got = relative_index(torch.arange(n), torch.arange(n), 1, bucket_size, max_position)
    assert torch.equal(got, torch.clamp(ref + bucket_size, 0, 2 * bucket_size - 1))


@pytest.mark.parametrize("bucket_size,max_position", [(8, None), (None, 64)])
def test_relative_index_refuses_half_of_the_log_bucket_settings(bucket_size, max_position):
    with pytest.raises(ValueError, match="bucket_size and max_position must be given together"):
        relative_index(torch.arange(5), torch.arange(5), 2, bucket_size, max_position)


def test_gather_equals_naive_einsum():
    B, H, N, dh, k = 2, 3, 11, 5, 4
    q, kc = torch.randn(B, H, N, dh), torch.randn(B, H, N, dh)
    q_r, k_r = torch.randn(H, 2 * k, dh), torch.randn(H, 2 * k, dh)
    idx = relative_distance(N, N, k)
    for qr, kr in ((q_r, k_r), (None, k_r), (q_r, None)):
        torch.testing.assert_close(c2p_p2c(q, kc, qr, kr, idx), c2p_p2c_naive(q, kc, qr, kr, idx))
    # and both equal the paper's sums written entry by entry
    want = torch.zeros(B, H, N, N)
    for i in range(N):
        for j in range(N):
            want[..., i, j] = (q[..., i, :] * k_r[:, idx[i, j]]).sum(-1) + (kc[..., j, :] * q_r[:, idx[j, i]]).sum(-1)
    torch.testing.assert_close(c2p_p2c(q, kc, q_r, k_r, idx), want)


def test_code_convention_matches_transformers_disentangled_bias():
    """p2c_delta="code" reproduces transformers' (and DeBERTa's code's) c2p + p2c exactly."""
    from transformers import DebertaConfig
    H, dh, k, N = 2, 4, 3, 9
    cfg = DebertaConfig(hidden_size=H * dh, num_attention_heads=H, relative_attention=True,
                        max_relative_positions=k, pos_att_type=["c2p", "p2c"])
    att = md.DisentangledSelfAttention(cfg).eval()
    q, kc, rel = torch.randn(1, H, N, dh), torch.randn(1, H, N, dh), torch.randn(2 * k, H * dh)
    with torch.no_grad():
        ref = att.disentangled_att_bias(q, kc, md.build_relative_position(q, kc), rel, 3)
        heads = lambda t: t.view(2 * k, H, dh).transpose(0, 1)  # noqa: E731
        k_r, q_r = heads(att.pos_proj(rel)), heads(att.pos_q_proj(rel)) / math.sqrt(3 * dh)
        idx = relative_distance(N, N, k)
        torch.testing.assert_close(c2p_p2c(q, kc, q_r, k_r, idx, idx.T), ref)
        assert not torch.allclose(c2p_p2c(q, kc, q_r, k_r, idx), ref)   # the paper's delta(j, i) differs


def _peak_op_bytes(fn, *args):
    with torch.profiler.profile(profile_memory=True) as prof:
        fn(*args)
    return max(e.cpu_memory_usage for e in prof.key_averages())


def test_no_nnd_tensor_is_built():
    """The gather path allocates far less than one [N, N, dh] float tensor; the naive one more."""
    B, H, N, dh, k = 1, 2, 64, 64, 8
    args = (torch.randn(B, H, N, dh), torch.randn(B, H, N, dh), torch.randn(H, 2 * k, dh), torch.randn(H, 2 * k, dh),
            relative_distance(N, N, k))
    nnd = H * N * N * dh * 4                                                     # bytes of K_r[delta] for all heads
    assert _peak_op_bytes(c2p_p2c, *args) < nnd / 4
    assert _peak_op_bytes(c2p_p2c_naive, *args) >= nnd


def _attention_logits_reference(model, tokens):
    """Layer-0 attention weights computed from paper Eq. 4 with explicit [N, N, d] gathers."""
    s = model.scheme
    x = model.tok(tokens)
    B, N, D = x.shape
    h = model.blocks[0].ln1(s.embed(x, model.context(N, None, "cpu")))
    q, k, _ = model.blocks[0].attn.qkv(h).view(B, N, 3, s.n_heads, s.head_dim).permute(2, 0, 3, 1, 4)
    q_r, k_r = s.projected(0)
    logits = (q @ k.transpose(-2, -1) + c2p_p2c_naive(q, k, q_r, k_r, relative_distance(N, N, s.k)))
    return (logits / math.sqrt(3 * s.head_dim)).softmax(-1)


def test_model_attention_is_disentangled_with_sqrt_3d():
    model = small_model("deberta", causal=False, k=4, absolute="emd")
    tokens = torch.randint(0, 23, (2, 10))
    assert model.scheme.logit_scale() == pytest.approx(1 / math.sqrt(3 * model.scheme.head_dim))
    torch.testing.assert_close(model.attention_maps(tokens)[0], _attention_logits_reference(model, tokens))


def test_scale_follows_the_number_of_terms():
    for terms, factor in (((), 1), (("c2p",), 2), (("p2c",), 2), (("c2p", "p2c"), 3)):
        s = small_model("deberta", causal=False, terms=terms).scheme
        assert s.logit_scale() == pytest.approx(1 / math.sqrt(factor * s.head_dim))


def test_relative_table_shared_projections_per_layer():
    s = small_model("deberta", causal=False, k=5, n_layers=3).scheme
    assert s.rel.weight.shape == (10, 32) and len(s.w_kr) == len(s.w_qr) == 3


@pytest.mark.parametrize("kw", [dict(absolute="none"), dict(absolute="none", bucket_size=8, max_position=64)])
@pytest.mark.parametrize("causal", [False, True])
def test_relative_part_is_shift_invariant(kw, causal):
    model = small_model("deberta", causal=causal, k=4, **kw)
    tokens, pos = torch.randint(0, 23, (2, 12)), torch.arange(12)
    torch.testing.assert_close(model(tokens, pos + 17), model(tokens), atol=1e-5, rtol=1e-5)


def test_absolute_positions_break_shift_invariance():
    for absolute in ("emd", "input"):
        model = small_model("deberta", causal=False, k=4, absolute=absolute)
        tokens, pos = torch.randint(0, 23, (2, 12)), torch.arange(12)
        assert (model(tokens, pos + 17) - model(tokens)).abs().max() > 1e-4


def test_emd_adds_absolute_positions_only_before_the_last_layers():
    model = small_model("deberta", causal=False, n_layers=4, absolute="emd", emd_layers=2)
    s, ctx = model.scheme, model.context(6, None, "cpu")
    x = torch.randn(1, 6, 32)
    assert torch.equal(s.embed(x, ctx), x)
    changed = [not torch.equal(s.layer_input(x, ctx, layer), x) for layer in range(4)]
    assert changed == [False, False, True, False]
    torch.testing.assert_close(s.layer_input(x, ctx, 2), x + s.abs_pos.weight[:6])


def test_bad_arguments():
    with pytest.raises(ValueError, match="terms"):
        small_model("deberta", causal=False, terms=("p2p",))
    with pytest.raises(ValueError, match="absolute"):
        small_model("deberta", causal=False, absolute="output")
    with pytest.raises(ValueError, match="emd_layers"):
        small_model("deberta", causal=False, emd_layers=5)
    with pytest.raises(ValueError, match="bucket_size and max_position"):
        small_model("deberta", causal=False, bucket_size=8)
    with pytest.raises(ValueError, match="k must"):
        relative_distance(4, 4, 0)
    with pytest.raises(ValueError, match="q_len"):
        relative_distance(-1, 4, 2)
    assert relative_distance(0, 4, 2).shape == (0, 4)        # no queries: an empty table, as Shaw's ids give
    with pytest.raises(ValueError, match="max_len"):
        small_model("deberta", causal=False, max_len=8)(torch.zeros(1, 4, dtype=torch.long), torch.arange(4) + 10)
    assert "deberta" in posenc.SCHEMES and isinstance(small_model("deberta", causal=False).scheme, DeBERTa)


def _unrolled_emd(model, tokens, passes):
    """The paper's EMD written out with the model's own modules: the stack up to the last layer's
    input h, then I_{t+1} = Block_L(queries I_t; keys, values h) from I_0 = h + P_abs."""
    ctx = model.context(tokens.shape[1], None, "cpu")
    h = torch.cat([model.cls.expand(len(tokens), -1, -1), model.tok(tokens)], 1) if model.cls is not None \
        else model.tok(tokens)
    for block in model.blocks[:-1]:
        h, _ = block(h, model.scheme, ctx)
    last, i = model.blocks[-1], h + model.scheme.abs_pos(ctx.positions)
    for _ in range(passes):
        ln_i, ln_h = last.ln1(i), last.ln1(h)
        D, H = ln_h.shape[-1], model.scheme.n_heads
        wq, wk, wv = last.attn.qkv.weight.chunk(3)
        split = lambda t: t.view(t.shape[0], t.shape[1], H, D // H).transpose(1, 2)  # noqa: E731
        q, k, v = split(ln_i @ wq.T), split(ln_h @ wk.T), split(ln_h @ wv.T)
        q_r, k_r = model.scheme.projected(len(model.blocks) - 1)
        delta = ctx.tables["delta"]
        logits = (q @ k.transpose(-2, -1) + c2p_p2c(q, k, q_r, k_r, delta)) * model.scheme.logit_scale()
        y = (logits.softmax(-1) @ v).transpose(1, 2).reshape(i.shape)
        i = i + last.attn.out(y)
        i = i + last.mlp(last.ln2(i))
    return model.ln_f(i)


@pytest.mark.parametrize("passes", [1, 2, 3])
def test_paper_emd_is_the_last_layer_rerun_with_queries_h_plus_p(passes):
    torch.manual_seed(0)
    model = posenc.build_model("deberta", 23, causal=False, d_model=32, n_heads=4, n_layers=3, max_len=16, k=4,
                               emd_passes=passes, cls_token=True, num_classes=2).eval()
    tokens = torch.randint(0, 23, (2, 10))
    h, _ = model.hidden_states(tokens)
    torch.testing.assert_close(h, _unrolled_emd(model, tokens, passes))


def test_paper_emd_shares_the_last_layers_weights():
    kw = dict(causal=False, d_model=32, n_heads=4, n_layers=3, max_len=16, k=4)
    residual = posenc.build_model("deberta", 23, **kw)
    paper = posenc.build_model("deberta", 23, emd_passes=2, **kw)
    assert {n: p.shape for n, p in paper.named_parameters()} == {n: p.shape for n, p in residual.named_parameters()}
    tokens = torch.randint(0, 23, (2, 10))
    paper(tokens).square().sum().backward()                   # every pass feeds gradient to the one last block
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in paper.blocks[-1].parameters())


def test_paper_emd_puts_absolute_positions_in_the_queries_only():
    torch.manual_seed(1)
    model = posenc.build_model("deberta", 23, causal=False, d_model=32, n_heads=4, n_layers=2, max_len=32, k=4,
                               emd_passes=2).eval()
    tokens, pos = torch.randint(0, 23, (2, 10)), torch.arange(10)
    s, ctx = model.scheme, model.context(10, None, "cpu")
    x = torch.randn(2, 10, 32)
    assert all(torch.equal(s.layer_input(x, ctx, layer), x) for layer in range(2))   # no residual injection
    torch.testing.assert_close(s.decoder_queries(x, ctx), x + s.abs_pos.weight[:10])
    assert (model(tokens, pos + 9) - model(tokens)).abs().max() > 1e-4                  # absolute: shift matters
    with torch.no_grad():
        s.abs_pos.weight.zero_()                              # without P the decoder is relative-only
    torch.testing.assert_close(model(tokens, pos + 9), model(tokens), atol=1e-5, rtol=1e-5)


def test_paper_emd_is_causally_safe():
    from conftest import assert_no_causal_leak
    assert_no_causal_leak(posenc.build_model("deberta", 23, causal=True, d_model=32, n_heads=4, n_layers=2,
                                             max_len=24, k=4, emd_passes=2).eval(), vocab=23)


def test_paper_emd_bad_arguments():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="emd_passes"):
            small_model("deberta", causal=False, emd_passes=bad)
    for kw in (dict(absolute="input"), dict(absolute="none"), dict(emd_layers=2)):
        with pytest.raises(ValueError, match="emd_passes needs"):
            small_model("deberta", causal=False, n_layers=2, emd_passes=2, **kw)
