"""Whole layers, and options in combination, against transformers, x-transformers and rotary-embedding-torch.

The unit files compare each scheme's functions with a reference (`t5_bucket`, `alibi_slopes`, the RoPE
tables, ...). Here the comparison is one level up: posenc's attention layer against a library's attention
layer (Llama, DeBERTa-v2), the schemes at offset positions and with keys longer than queries, every
RoPE scaling with partial rotation, xPos at other scale bases and with scalings, CoPE without clamping,
ViT's 2-D sines. Where posenc departs from a reference on purpose, a test pins the difference.
"""
import pytest
import torch
from rotary_embedding_torch import RotaryEmbedding
from transformers import DebertaV2Config, GPTNeoXConfig, LlamaConfig, T5Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.deberta_v2 import modeling_deberta_v2 as md2
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding
from transformers.models.t5.modeling_t5 import T5Attention
from transformers.models.vit_mae.modeling_vit_mae import build_2d_sinusoidal_position_embedding
from x_transformers.x_transformers import CoPE as XCoPE
from x_transformers.x_transformers import RelativePositionBias
from x_transformers.x_transformers import RotaryEmbedding as XTRotary
from x_transformers.x_transformers import apply_rotary_pos_emb as xt_apply

import posenc
from posenc import vision as V
from posenc.functional import t5_bucket
from posenc.schemes.cope import CoPE

HEAD, L = 16, 32


# -- DeBERTa: the whole disentangled attention layer against DeBERTa-v2 ----------------------------
DEB_D, DEB_H = 32, 4


def deberta_pair(bucket_size, max_position, k):
    opts = dict(absolute="none", p2c_delta="code")
    if bucket_size is not None:
        opts.update(bucket_size=bucket_size, max_position=max_position)
    else:
        opts.update(k=k)
    model = posenc.build_model("deberta", 11, causal=False, d_model=DEB_D, n_heads=DEB_H, n_layers=1, max_len=128,
                               **opts).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=DEB_D ** -0.5 if p.dim() == 2 else 1.0)
        model.scheme.rel.weight.normal_()
    cfg = DebertaV2Config(hidden_size=DEB_D, num_attention_heads=DEB_H, relative_attention=True,
                          position_buckets=bucket_size if bucket_size is not None else -1,
                          max_relative_positions=max_position if bucket_size is not None else k,
                          pos_att_type=["c2p", "p2c"], share_att_key=False, hidden_dropout_prob=0.0,
                          attention_probs_dropout_prob=0.0)
    ref = md2.DisentangledSelfAttention(cfg).eval()
    attn = model.blocks[0].attn
    with torch.no_grad():
        w_q, w_k, w_v = attn.qkv.weight.split(DEB_D)
        for lin, w in ((ref.query_proj, w_q), (ref.key_proj, w_k), (ref.value_proj, w_v),
                       (ref.pos_key_proj, model.scheme.w_kr[0].weight),
                       (ref.pos_query_proj, model.scheme.w_qr[0].weight)):
            lin.weight.copy_(w)
            lin.bias.zero_()
        attn.out.weight.copy_(torch.eye(DEB_D))
    return model, ref


@pytest.mark.parametrize("bucket_size,max_position,k,seq", [
    (8, 32, None, 40),      # log buckets exercised and saturated
    (16, 64, None, 50),
    (None, None, 3, 12),    # plain clipping at k (v1 delta, via v2's pos_ebd_size = max_relative_positions)
    (None, None, 16, 9),    # k > seq: no clipping
])
def test_deberta_attention_equals_transformers_deberta_v2(bucket_size, max_position, k, seq):
    torch.manual_seed(0)
    model, ref = deberta_pair(bucket_size, max_position, k)
    x = torch.randn(2, seq, DEB_D)
    with torch.no_grad():
        ctx = model.context(seq, None, x.device)
        ours = model.blocks[0].attn(x, model.scheme, ctx)[0]
        mask = torch.ones(2, 1, seq, seq)
        theirs = ref(x, mask, rel_embeddings=model.scheme.rel.weight)[0]
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_paper_delta_differs_from_transformers():
    """Sanity: the default p2c_delta='paper' must differ (so the comparison above can fail)."""
    torch.manual_seed(0)
    model, ref = deberta_pair(8, 32, None)
    model.scheme.p2c_delta = "paper"
    x = torch.randn(2, 20, DEB_D)
    with torch.no_grad():
        ours = model.blocks[0].attn(x, model.scheme, model.context(20, None, x.device))[0]
        theirs = ref(x, torch.ones(2, 1, 20, 20), rel_embeddings=model.scheme.rel.weight)[0]
    assert (ours - theirs).abs().max() > 1e-3


# -- RoPE: the attention layer against Llama's, under every scaling --------------------------------
ATT_D, ATT_H, ATT_L = 64, 4, 32
ATT_HEAD = ATT_D // ATT_H
ATT_LONG = dict(short_factor=[1.0 + 0.1 * i for i in range(ATT_HEAD // 2)],
            long_factor=[1.0 + 3.0 * i / 7 for i in range(ATT_HEAD // 2)])
ATT_CASES = [
    (None, 1.0, {}),
    ("yarn", 4.0, {"original_max_position_embeddings": ATT_L}),
    ("llama3", 4.0, {"original_max_position_embeddings": ATT_L, "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
    ("longrope", 4.0, {"original_max_position_embeddings": ATT_L, **ATT_LONG}),
    ("dynamic", 4.0, {"original_max_position_embeddings": ATT_L}),
]


@pytest.mark.parametrize("scaling, factor, params", ATT_CASES)
@pytest.mark.parametrize("n, offset", [(20, 0), (50, 0), (12, 90)])
def test_rope_attention_layer_equals_transformers_llama_attention(scaling, factor, params, n, offset):
    torch.manual_seed(0)
    model = posenc.build_model("rope", 11, causal=True, d_model=ATT_D, n_heads=ATT_H, n_layers=1, max_len=256,
                               layout="half").eval()
    if scaling is not None:
        model.scheme.set_scaling(scaling, factor, **params)
    rp = {"rope_type": scaling or "default", "rope_theta": 10000.0, **params}
    if scaling is not None:
        rp["factor"] = factor
    cfg = LlamaConfig(hidden_size=ATT_D, num_attention_heads=ATT_H, num_key_value_heads=ATT_H, head_dim=ATT_HEAD,
                      max_position_embeddings=ATT_L, rope_parameters=rp, attention_bias=False)
    cfg._attn_implementation = "eager"
    ref = LlamaAttention(cfg, layer_idx=0).eval()
    attn = model.blocks[0].attn
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(std=ATT_D ** -0.5)
        w_q, w_k, w_v = attn.qkv.weight.split(ATT_D)
        ref.q_proj.weight.copy_(w_q)
        ref.k_proj.weight.copy_(w_k)
        ref.v_proj.weight.copy_(w_v)
        ref.o_proj.weight.copy_(attn.out.weight)
    x = torch.randn(2, n, ATT_D)
    pos = torch.arange(n) + offset
    with torch.no_grad():
        ctx = model.context(n, pos if offset else None, "cpu")
        ours = attn(x, model.scheme, ctx)[0]
        cos, sin = LlamaRotaryEmbedding(cfg)(x, pos[None])
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        theirs = ref(x, (cos, sin), mask)[0]
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


# -- RoPE scalings: offset positions, YaRN without truncation, partial rotation, p-RoPE ------------
def scheme(rotary_fraction=1.0, p=1.0, head=HEAD, **kw):
    return posenc.build_model("rope", 11, causal=True, d_model=4 * head, n_heads=4, n_layers=1, max_len=64,
                              layout="half", rotary_fraction=rotary_fraction, p=p, **kw).scheme


def llama(scaling, factor, params, partial=1.0, head=HEAD):
    rp = {"rope_type": scaling, "rope_theta": 10000.0, **params}
    if scaling != "default":
        rp["factor"] = factor
    if partial != 1.0:
        rp["partial_rotary_factor"] = partial
    cfg = LlamaConfig(hidden_size=4 * head, num_attention_heads=4, head_dim=head, max_position_embeddings=L,
                      rope_parameters=rp)
    return LlamaRotaryEmbedding(cfg)


def longrope(r):
    return dict(short_factor=[1.0 + 0.1 * i for i in range(r // 2)], long_factor=[1.0 + 3.0 * i / 7 for i in range(r // 2)])


CASES = [
    ("linear", 4.0, {}),
    ("dynamic", 4.0, {"original_max_position_embeddings": L}),
    ("yarn", 4.0, {"original_max_position_embeddings": L}),
    ("yarn", 8.0, {"original_max_position_embeddings": L, "truncate": False}),
    ("yarn", 8.0, {"original_max_position_embeddings": L, "beta_fast": 8, "beta_slow": 2, "truncate": False}),
    ("llama3", 4.0, {"original_max_position_embeddings": L, "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
    ("longrope", 4.0, {"original_max_position_embeddings": L}),
]


def ref_tables(scaling, factor, params, positions, partial=1.0):
    ref = llama(scaling, factor, params, partial)
    cos, sin = ref(torch.zeros(1), positions[None])
    half = cos.shape[-1] // 2
    return cos[0, :, :half], sin[0, :, :half]


def our_tables(scaling, factor, params, positions, fraction=1.0):
    s = scheme(rotary_fraction=fraction)
    s.set_scaling(scaling, factor, **params)
    return s.table(positions)


@pytest.mark.parametrize("scaling, factor, params", CASES)
@pytest.mark.parametrize("offset, n", [(100, 20), (10, 15), (3 * L, 3)])
def test_tables_at_offset_positions_equal_transformers(scaling, factor, params, offset, n):
    params = dict(params)
    if scaling == "longrope":
        params.update(longrope(HEAD))
    pos = torch.arange(n) + offset
    rc, rs = ref_tables(scaling, factor, params, pos)
    oc, os_ = our_tables(scaling, factor, params, pos)
    # transformers forms m * omega in float32 (error ~ 1e-7 * m), posenc in float64
    torch.testing.assert_close(oc, rc, rtol=0, atol=2e-5)
    torch.testing.assert_close(os_, rs, rtol=0, atol=2e-5)


@pytest.mark.parametrize("scaling, factor, params", CASES)
@pytest.mark.parametrize("fraction", [0.5, 0.25])
def test_partial_rotation_with_every_rope_type_equals_transformers(scaling, factor, params, fraction):
    params = dict(params)
    r = int(HEAD * fraction)
    if scaling == "longrope":
        params.update(longrope(r))
    pos = torch.arange(4 * L)
    rc, rs = ref_tables(scaling, factor, params, pos, partial=fraction)
    oc, os_ = our_tables(scaling, factor, params, pos, fraction=fraction)
    assert oc.shape == rc.shape == (4 * L, r // 2)
    torch.testing.assert_close(oc, rc, rtol=0, atol=2e-5)
    torch.testing.assert_close(os_, rs, rtol=0, atol=2e-5)


@pytest.mark.parametrize("p", [0.0, 0.25, 0.5, 0.75, 1.0])
@pytest.mark.parametrize("head", [16, 64])
def test_p_rope_equals_transformers_proportional(p, head):
    cfg = LlamaConfig(hidden_size=4 * head, num_attention_heads=4, head_dim=head,
                      rope_parameters={"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": p})
    theirs, _ = ROPE_INIT_FUNCTIONS["proportional"](cfg, "cpu")
    ours, a = scheme(p=p, head=head).frequencies()
    assert a == 1.0 and ours.shape == theirs.shape
    torch.testing.assert_close(ours.float(), theirs, rtol=1e-6, atol=0)


@pytest.mark.parametrize("head, p", [(100, 0.58), (200, 0.29), (180, 0.7)])
def test_p_rope_counts_one_pair_more_than_transformers_where_the_float_product_falls_short(head, p):
    """transformers (and Gemma) rotate int(p * head_dim // 2) pairs, posenc floor(p * head_dim/2 + 1e-9), the
    count in exact arithmetic (`rotated_pairs`): at these (head_dim, p) the float product falls just below an
    integer and posenc rotates one pair more; the pairs both rotate have the same frequencies."""
    cfg = LlamaConfig(hidden_size=head, num_attention_heads=1, head_dim=head,
                      rope_parameters={"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": p})
    theirs, _ = ROPE_INIT_FUNCTIONS["proportional"](cfg, "cpu")
    ours, _ = posenc.build_model("rope", 11, causal=True, d_model=head, n_heads=1, n_layers=1, max_len=8,
                                 p=p).scheme.frequencies()
    n_theirs, n_ours = int((theirs != 0).sum()), int((ours != 0).sum())
    assert n_ours == n_theirs + 1 == round(p * head / 2)
    torch.testing.assert_close(ours[:n_theirs].float(), theirs[:n_theirs], rtol=1e-6, atol=0)


def test_partial_rotation_rounds_where_gpt_neox_floors():
    """GPT-NeoX rotates int(0.58 * 100) = 57 dims (29 frequencies base^(-2i/57)); posenc rounds to 58 (29
    frequencies base^(-2i/58)): the frequencies differ. At a fraction whose product is exact they agree."""
    def pair(fraction):
        ref = GPTNeoXRotaryEmbedding(GPTNeoXConfig(hidden_size=100, num_attention_heads=1, rotary_pct=fraction))
        ours = posenc.build_model("rope", 11, causal=True, d_model=100, n_heads=1, n_layers=1, max_len=8,
                                  layout="half", rotary_fraction=fraction).scheme.frequencies()[0].float()
        return ours, ref.inv_freq
    ours, theirs = pair(0.58)
    assert ours.shape == theirs.shape == (29,) and not torch.allclose(ours, theirs, rtol=1e-3)
    torch.testing.assert_close(*pair(0.5), rtol=1e-6, atol=0)


# -- RoPE, interleaved layout: PI and NTK at the scheme level --------------------------------------
def rope_qk(x, positions, **kw):
    s = posenc.build_model("rope", 11, causal=True, d_model=4 * HEAD, n_heads=4, n_layers=1, max_len=256,
                           layout="interleaved", **kw).scheme
    ctx = posenc.PositionContext(positions, causal=True)
    ctx.tables = s.prepare(ctx)
    return s.transform_qk(x, x, ctx)[0]


@pytest.mark.parametrize("scaling, factor", [(None, 1.0), ("pi", 4.0), ("ntk", 4.0), ("pi", 2.5), ("ntk", 16.0)])
@pytest.mark.parametrize("offset", [0, 37, 1000])
def test_interleaved_scheme_equals_rotary_embedding_torch_and_x_transformers(scaling, factor, offset):
    torch.manual_seed(0)
    n = 40
    x = torch.randn(2, 4, n, HEAD)
    pos = torch.arange(n) + offset
    got = rope_qk(x, pos, **({} if scaling is None else dict(scaling=scaling, factor=factor)))
    rkw = {"pi": dict(interpolate_factor=factor), "ntk": dict(theta_rescale_factor=factor)}.get(scaling, {})
    ref = RotaryEmbedding(HEAD, cache_if_possible=False, **rkw).rotate_queries_or_keys(x, offset=offset)
    tol = 5e-5 if offset < 1000 else 3e-4                           # reference angles in float32 (~6e-8 m rad)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=tol)
    xkw = {"pi": dict(interpolation_factor=factor), "ntk": dict(base_rescale_factor=factor)}.get(scaling, {})
    freqs, _ = XTRotary(HEAD, **xkw)(pos)
    torch.testing.assert_close(got, xt_apply(x, freqs), rtol=1e-5, atol=tol)


# -- xPos: the scheme with other scale bases and with scalings -------------------------------------
def xpos_scheme(**kw):
    return posenc.build_model("xpos", 11, causal=True, d_model=4 * HEAD, n_heads=4, n_layers=1, max_len=256,
                              **kw).scheme


def xpos_qk(q, k, positions, **kw):
    s = xpos_scheme(**kw)
    ctx = posenc.PositionContext(positions, causal=True)
    ctx.tables = s.prepare(ctx)
    return s.transform_qk(q, k, ctx)


def scores(q, k):
    return q @ k.transpose(-1, -2)


@pytest.mark.parametrize("scale_base", [64.0, 512.0, 2048.0])
@pytest.mark.parametrize("n", [9, 60])
def test_scheme_equals_rotary_embedding_torch_scale_base(scale_base, n):
    q, k = torch.randn(2, 2, 4, n, HEAD)
    ref = RotaryEmbedding(HEAD, use_xpos=True, xpos_scale_base=scale_base, cache_if_possible=False)
    rq, rk = ref.rotate_queries_and_keys(q, k)
    oq, ok = xpos_qk(q, k, torch.arange(n), scale_base=scale_base)
    torch.testing.assert_close(oq, rq, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(ok, rk, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("factor", [2.0, 8.0])
def test_ntk_scaled_xpos_equals_both_references(factor):
    n = 40
    q, k = torch.randn(2, 2, 4, n, HEAD)
    oq, ok = xpos_qk(q, k, torch.arange(n), scaling="ntk", factor=factor)
    rq, rk = RotaryEmbedding(HEAD, use_xpos=True, theta_rescale_factor=factor,
                             cache_if_possible=False).rotate_queries_and_keys(q, k)
    torch.testing.assert_close(oq, rq, rtol=1e-5, atol=2e-5)
    xt = XTRotary(HEAD, use_xpos=True, base_rescale_factor=factor)
    freqs, scale = xt(torch.arange(n))
    torch.testing.assert_close(oq, xt_apply(q, freqs, scale), rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(ok, xt_apply(k, freqs, scale ** -1), rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("factor", [2.0, 4.0])
def test_pi_scaled_xpos_scores_equal_rotary_embedding_torch(factor):
    """rotary-embedding-torch divides the positions by interpolate_factor before both the rotation and the
    xPos scale (decay zeta^((m - n)/(s gamma))), as posenc does: the scores agree (q and k differ by
    the centre, which cancels)."""
    n = 50
    q, k = torch.randn(2, 2, 4, n, HEAD)
    oq, ok = xpos_qk(q, k, torch.arange(n), scaling="pi", factor=factor)
    rq, rk = RotaryEmbedding(HEAD, use_xpos=True, interpolate_factor=factor,
                             cache_if_possible=False).rotate_queries_and_keys(q, k)
    torch.testing.assert_close(scores(oq, ok), scores(rq, rk), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("factor", [4.0])
def test_pi_scaled_xpos_disagrees_with_x_transformers_decay(factor):
    """x-transformers divides only the rotation angle by interpolation_factor; its xPos power uses the raw
    positions (decay zeta^((m - n)/gamma)). The references disagree with each other; posenc follows
    rotary-embedding-torch. Documented: this asserts the two are *different*."""
    n = 200
    q, k = torch.randn(2, 2, 4, n, HEAD)
    oq, ok = xpos_qk(q, k, torch.arange(n), scaling="pi", factor=factor)
    xt = XTRotary(HEAD, use_xpos=True, interpolation_factor=factor)
    freqs, scale = xt(torch.arange(n))
    xs = scores(xt_apply(q, freqs, scale), xt_apply(k, freqs, scale ** -1))
    diff = (scores(oq, ok) - xs).abs().max().item()
    assert diff > 1e-2
    # with the decay made the same (x-transformers' scale_base multiplied by the factor) they agree
    xt2 = XTRotary(HEAD, use_xpos=True, interpolation_factor=factor, scale_base=512 * factor)
    freqs2, scale2 = xt2(torch.arange(n))
    xs2 = scores(xt_apply(q, freqs2, scale2), xt_apply(k, freqs2, scale2 ** -1))
    torch.testing.assert_close(scores(oq, ok), xs2, rtol=1e-4, atol=1e-4)


def test_scheme_at_offset_positions_scores_equal_rotary_embedding_torch():
    """The scheme at positions offset..offset+n-1 (its centre moves with them) against the reference at
    0..n-1: the same scores (xPos is shift-invariant in exact arithmetic)."""
    n, off = 30, 70
    q, k = torch.randn(2, 2, 4, n, HEAD)
    oq, ok = xpos_qk(q, k, torch.arange(n) + off)
    ref = RotaryEmbedding(HEAD, use_xpos=True, cache_if_possible=False)
    rq, rk = ref.rotate_queries_and_keys(q, k)          # positions 0..n-1: scores are shift-invariant
    torch.testing.assert_close(scores(oq, ok), scores(rq, rk), rtol=1e-4, atol=1e-4)


# -- T5: keys longer than queries (memory, a cache), and a second bucket map -----------------------
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("seq, mem", [(10, 0), (7, 30), (40, 200), (1, 150)])
def test_t5_bias_with_memory_equals_transformers_and_x_transformers(causal, seq, mem):
    torch.manual_seed(0)
    model = posenc.build_model("t5", 11, causal=causal, d_model=32, n_heads=4, n_layers=1, max_len=64).eval()
    with torch.no_grad():
        model.scheme.bias.weight.normal_()
    ctx = model.context(seq, None, "cpu", mem_len=mem)
    ours = model.scheme.logit_bias(ctx)                                              # (H, Q, M + Q)
    assert ours.shape == (4, seq, seq + mem)

    cfg = T5Config(d_model=32, d_kv=8, num_heads=4, relative_attention_num_buckets=32,
                   relative_attention_max_distance=128, is_decoder=causal)
    ref = T5Attention(cfg, has_relative_attention_bias=True)
    ref.relative_attention_bias.weight.data.copy_(model.scheme.bias.weight.data)
    want = ref.compute_bias(seq, seq + mem, past_seen_tokens=mem)[0]
    torch.testing.assert_close(ours, want, rtol=0, atol=0)

    xt = RelativePositionBias(scale=1.0, causal=causal, num_buckets=32, max_distance=128, heads=4)
    xt.relative_attention_bias.weight.data.copy_(model.scheme.bias.weight.data)
    torch.testing.assert_close(ours, xt(seq, seq + mem), rtol=0, atol=0)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (16, 64), (64, 1000)])
def test_t5_bucket_equals_x_transformers(causal, num_buckets, max_distance):
    rel = torch.arange(-3000, 3001)
    want = RelativePositionBias._relative_position_bucket(rel, causal=causal, num_buckets=num_buckets,
                                                          max_distance=max_distance)
    assert torch.equal(t5_bucket(rel, not causal, num_buckets, max_distance), want)


# -- CoPE: no clamping, a later layer's table ------------------------------------------------------
@pytest.mark.parametrize("T, P", [(10, 16), (33, 64), (33, 8)])
def test_position_logits_equal_x_transformers_without_clamp(T, P):
    g = torch.Generator().manual_seed(T)
    B, H, D = 2, 3, 8
    q, k = (torch.randn(B, H, T, D, generator=g) * 2 for _ in range(2))
    ref = XCoPE(dim=D, heads=H, max_pos=P)
    with torch.no_grad():
        ref.pos_emb.normal_()
    sim = (q @ k.transpose(-1, -2)) * D ** -0.5
    sim = sim.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -torch.finfo(sim.dtype).max)
    expected = ref(q, sim)
    ours = CoPE(d_model=H * D, n_heads=H, n_layers=2, max_len=64, causal=True, npos_max=P)
    with torch.no_grad():
        ours.table[1, 0] = ref.pos_emb * D ** 0.5              # layer 1's table
    got = ours.extra_logits(q, k, posenc.PositionContext(torch.arange(T), causal=True), 1)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


# -- ViT: 2-D sines against ViT-MAE's --------------------------------------------------------------
def half_to_interleaved_cols(D):
    """perm such that ref[:, perm] is in posenc's layout: per axis block of D/2, (s0, c0, s1, c1, ...)."""
    q = D // 4
    perm = []
    for axis in range(2):
        base = axis * (D // 2)
        for i in range(q):
            perm += [base + i, base + q + i]        # sin_i then cos_i
    return torch.tensor(perm)


@pytest.mark.parametrize("grid, D", [((4, 4), 32), ((3, 5), 16), ((7, 2), 64)])
def test_sincos2d_equals_transformers_vit_mae(grid, D):
    h, w = grid
    vit = V.build_vit("sincos2d", image_size=2 * max(h, w), patch_size=2, num_classes=3, d_model=D, n_heads=2,
                      n_layers=1)
    ctx = V.GridContext(torch.arange(1 + h * w), causal=False, has_cls=True, grid=grid)
    x = torch.zeros(1, 1 + h * w, D)
    ours = vit.scheme.embed(x, ctx)[0]                                      # (1 + h*w, D), CLS row first
    ref = build_2d_sinusoidal_position_embedding(h, w, D, cls_token=True)   # (1 + h*w, D)
    ref = ref[:, half_to_interleaved_cols(D)]
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-6)
    # and it is not symmetric in (rows, cols) for a non-square grid: the comparison can fail
    if h != w:
        swapped = torch.cat([ref[:, D // 2:], ref[:, :D // 2]], 1)
        assert (ours - swapped).abs().max() > 0.1
