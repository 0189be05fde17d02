"""Shaw et al. and Transformer-XL: clipping, the direct-gather identities, rel_shift, memory, and both
against implementations written by others: transformers' Wav2Vec2-BERT self-attention (Shaw's keys,
XL bidirectional) and XLNet's relative attention (XL causal, with a memory)."""
import math

import pytest
import torch

import posenc
from posenc.absolute import sinusoidal_at
from posenc.attention import causal_mask
from posenc.relative import clipped_relative_positions, gather_relative, rel_shift, spread_relative
from posenc.scheme import PositionContext, Scheme
from transformers import Wav2Vec2BertConfig, XLNetConfig, XLNetModel
from transformers.models.wav2vec2_bert import modeling_wav2vec2_bert as w2v
from conftest import small_model

RELATIVE = ["shaw", "xl", "t5"]


# -- clipped ids ---------------------------------------------------------------------
@pytest.mark.parametrize("q_len,k_len,k", [(5, 5, 2), (3, 7, 1), (6, 4, 0), (4, 9, 16)])
def test_clipped_relative_positions_is_clip_of_j_minus_i(q_len, k_len, k):
    ids = clipped_relative_positions(q_len, k_len, k)
    want = [[min(max(j - i, -k), k) + k for j in range(k_len)] for i in range(q_len)]
    assert ids.dtype == torch.long and ids.tolist() == want


def test_clipped_relative_positions_rejects_bad_input():
    for args in [(3, 3, -1), (3, 3, 1.5), (-1, 3, 2), (3, 2.0, 2)]:
        with pytest.raises(ValueError):
            clipped_relative_positions(*args)


# -- rel_shift ------------------------------------------------------------------------
def direct_scores(x, q_len, k_len):
    """out[i, j] = x[i, c(i, j)] where column c holds distance i_abs - j = k_len - 1 - c (a Python loop)."""
    M = k_len - q_len
    out = torch.full((*x.shape[:-2], q_len, k_len), float("nan"))
    for i in range(q_len):
        for j in range(k_len):
            c = k_len - 1 - (i + M - j)
            if 0 <= c < x.shape[-1]:
                out[..., i, j] = x[..., i, c]
    return out


@pytest.mark.parametrize("q_len,k_len", [(6, 6), (4, 10), (1, 5), (7, 7), (3, 3)])
def test_rel_shift_equals_direct_gather_where_causally_visible(q_len, k_len):
    """XL's layout: distances k_len-1 .. 0; every key the right-aligned causal mask keeps is exact."""
    x = torch.randn(2, 3, q_len, k_len)
    visible = causal_mask(q_len, k_len) == 0
    shifted, direct = rel_shift(x), direct_scores(x, q_len, k_len)
    assert shifted.shape == (2, 3, q_len, k_len)
    torch.testing.assert_close(shifted[..., visible], direct[..., visible], rtol=0, atol=0)
    # after the mask, the softmax of the shifted and the directly gathered scores agree everywhere
    mask = causal_mask(q_len, k_len)
    torch.testing.assert_close((shifted + mask).softmax(-1), (direct.nan_to_num(0.0) + mask).softmax(-1))


@pytest.mark.parametrize("q_len,k_len", [(5, 5), (3, 8), (6, 6)])
def test_rel_shift_bidirectional_layout_is_exact_everywhere(q_len, k_len):
    """With distances k_len-1 .. -(q_len-1) (k_len + q_len - 1 columns) no entry is garbage."""
    x = torch.randn(2, q_len, k_len + q_len - 1)
    shifted = rel_shift(x, k_len)
    torch.testing.assert_close(shifted, direct_scores(x, q_len, k_len), rtol=0, atol=0)


def test_rel_shift_agrees_with_gather_relative_on_index_form():
    """rel_shift(x) == gather_relative(x, ids) with ids[i, j] = j + q_len - 1 - i, on the visible part."""
    q_len, k_len = 4, 9
    x = torch.randn(3, q_len, k_len)
    ids = (torch.arange(k_len)[None] + q_len - 1 - torch.arange(q_len)[:, None]).clamp(max=k_len - 1)
    visible = causal_mask(q_len, k_len) == 0
    torch.testing.assert_close(rel_shift(x)[:, visible], gather_relative(x, ids)[:, visible], rtol=0, atol=0)


def test_rel_shift_rejects_bad_k_len():
    with pytest.raises(ValueError, match="k_len"):
        rel_shift(torch.randn(2, 3, 4), k_len=5)
    with pytest.raises(ValueError, match="k_len.*q_len=3"):       # fewer keys than queries
        rel_shift(torch.randn(2, 3, 4), k_len=2)
    with pytest.raises(ValueError, match="k_len.*q_len=5"):       # default k_len = r_len < q_len
        rel_shift(torch.randn(5, 4))


def test_rel_shift_rejects_a_tensor_without_query_and_distance_dims():
    with pytest.raises(ValueError, match="x must be"):
        rel_shift(torch.randn(3))


# -- Shaw: gather/scatter equal the naive [N, N, d] einsum -------------------------------
@pytest.mark.parametrize("q_len,k_len,k", [(7, 7, 2), (3, 8, 3), (5, 5, 0)])
def test_shaw_terms_equal_naive_einsum(q_len, k_len, k):
    """Each layer reads its own tables w^K, w^V (the paper's are per layer): checked at layers 0 and 1."""
    scheme = posenc.SCHEMES["shaw"](d_model=16, n_heads=2, n_layers=2, max_len=16, causal=False, max_distance=k)
    ids = clipped_relative_positions(q_len, k_len, k)
    ctx = PositionContext(torch.arange(q_len), causal=False, tables={"shaw_ids": ids})
    q, kk = torch.randn(2, 2, q_len, 8), torch.randn(2, 2, k_len, 8)
    probs = torch.randn(2, 2, q_len, k_len).softmax(-1)
    for layer in (0, 1):
        a_k, a_v = scheme.table_k[layer][ids], scheme.table_v[layer][ids]    # (Q, K, d): the naive tensors
        want_logits = torch.einsum("bhqd,qkd->bhqk", q, a_k) / math.sqrt(8)   # eq. (5), second term
        want_values = torch.einsum("bhqk,qkd->bhqd", probs, a_v)              # eq. (3), second term
        torch.testing.assert_close(scheme.extra_logits(q, kk, ctx, layer), want_logits)
        torch.testing.assert_close(scheme.extra_values(probs, ctx, layer), want_values)


def test_spread_relative_sums_weights_per_distance():
    ids = clipped_relative_positions(4, 6, 1)
    probs = torch.rand(2, 4, 6)
    w = spread_relative(probs, ids, 3)
    for i in range(4):
        for r in range(3):
            torch.testing.assert_close(w[:, i, r], probs[:, i][:, ids[i] == r].sum(-1))


@pytest.mark.parametrize("keys,values", [(True, False), (False, True), (True, True)])
def test_shaw_ablations_build_and_differ(keys, values):
    model = small_model("shaw", causal=False, keys=keys, values=values)
    tokens, perm = torch.randint(0, 23, (2, 9)), torch.randperm(9)
    assert (model.scheme.table_k is not None) == keys and (model.scheme.table_v is not None) == values
    assert model.scheme.uses_extra_values == values
    assert not torch.allclose(model(tokens[:, perm]), model(tokens)[:, perm], atol=1e-5)  # order now matters


def test_shaw_with_k_zero_is_permutation_equivariant():
    """k = 0: every pair shares one embedding, so a bidirectional model sees a set (chapter's k=0 row)."""
    model = small_model("shaw", causal=False, max_distance=0)
    tokens, perm = torch.randint(0, 23, (2, 11)), torch.randperm(11)
    torch.testing.assert_close(model(tokens[:, perm]), model(tokens)[:, perm], rtol=1e-5, atol=1e-5)


def test_shaw_serves_any_length():
    model = small_model("shaw", causal=True, max_len=16, max_distance=4)
    assert model(torch.randint(0, 23, (1, 200))).shape == (1, 200, 23)


# -- Transformer-XL: the four terms ----------------------------------------------------
def xl_naive_logits(scheme, q, k, q_pos, k_pos, layer=0):
    """A_ij of Dai et al. (terms a-d) with R_{i-j} looked up per pair: a [Q, K, d] tensor."""
    H, Dh = scheme.n_heads, scheme.head_dim
    dist = q_pos[:, None] - k_pos[None, :]                                       # (Q, K) i - j
    R = sinusoidal_at(dist.flatten(), scheme.d_model).view(*dist.shape, -1)      # (Q, K, D)
    r = scheme.w_r[layer](R).view(*dist.shape, H, Dh)                            # (Q, K, H, Dh)
    u, v = scheme.u[0], scheme.v[0]
    a = torch.einsum("bhqd,bhkd->bhqk", q, k)
    b = torch.einsum("bhqd,qkhd->bhqk", q, r)
    c = torch.einsum("hd,bhkd->bhk", u, k)[:, :, None]
    d = torch.einsum("hd,qkhd->hqk", v, r)[None]
    return (a + b + c + d) / math.sqrt(Dh)


@pytest.mark.parametrize("causal,q_len,k_len", [(True, 6, 6), (True, 4, 10), (False, 6, 6), (False, 3, 8)])
def test_xl_logits_equal_four_term_formula(causal, q_len, k_len):
    scheme = posenc.SCHEMES["xl"](d_model=16, n_heads=2, n_layers=1, max_len=16, causal=causal)
    torch.nn.init.normal_(scheme.u), torch.nn.init.normal_(scheme.v)
    k_pos = torch.arange(k_len) + 3
    q_pos = k_pos[k_len - q_len:]
    ctx = posenc.model.SegmentContext(q_pos, causal, key_positions=k_pos)
    ctx.tables = scheme.prepare(ctx)
    assert ctx.tables["xl_ids"] is None                                          # contiguous: rel_shift path
    q, k = torch.randn(2, 2, q_len, 8), torch.randn(2, 2, k_len, 8)
    got = q @ k.transpose(-1, -2) / math.sqrt(8) + scheme.extra_logits(q, k, ctx, 0)
    want = xl_naive_logits(scheme, q, k, q_pos, k_pos)
    keep = causal_mask(q_len, k_len) == 0 if causal else torch.ones(q_len, k_len, dtype=torch.bool)
    torch.testing.assert_close(got[..., keep], want[..., keep], rtol=1e-5, atol=1e-5)


def test_xl_gather_path_for_irregular_positions_equals_formula():
    scheme = posenc.SCHEMES["xl"](d_model=16, n_heads=2, n_layers=1, max_len=16, causal=False)
    torch.nn.init.normal_(scheme.u), torch.nn.init.normal_(scheme.v)
    pos = torch.tensor([0, 2, 3, 7, 8, 20])
    ctx = PositionContext(pos, causal=False)
    ctx.tables = scheme.prepare(ctx)
    assert ctx.tables["xl_ids"] is not None
    q, k = torch.randn(1, 2, 6, 8), torch.randn(1, 2, 6, 8)
    got = q @ k.transpose(-1, -2) / math.sqrt(8) + scheme.extra_logits(q, k, ctx, 0)
    torch.testing.assert_close(got, xl_naive_logits(scheme, q, k, pos, pos), rtol=1e-5, atol=1e-5)


# -- exact invariance to a shift of all positions ------------------------------------------
@pytest.mark.parametrize("scheme", RELATIVE)
@pytest.mark.parametrize("causal", [True, False])
def test_relative_schemes_ignore_a_shift_of_positions(scheme, causal):
    model = small_model(scheme, causal)
    with torch.no_grad():                                                        # make u, v matter for XL
        for p in model.scheme.parameters():
            p.normal_(0, 0.5)
    tokens = torch.randint(0, 23, (2, 13))
    base = model(tokens)
    for c in [1, 5, 100, 12345, 10 ** 9]:
        torch.testing.assert_close(model(tokens, torch.arange(13) + c), base, rtol=0, atol=1e-5)
    assert not torch.allclose(model(tokens, torch.arange(13) * 3), base, atol=1e-4)  # positions do matter


# -- segment-level recurrence -----------------------------------------------------------
@pytest.mark.parametrize("scheme", ["xl", "nope", "shaw", "t5"])
def test_memory_reproduces_the_full_causal_forward(scheme):
    """With the previous segment in memory, segment 2's logits equal a causal pass over both."""
    model = small_model(scheme, causal=True)
    tokens = torch.randint(0, 23, (2, 20))
    full = model(tokens)
    logits1, mem = model.forward_segment(tokens[:, :8])
    logits2, mem2 = model.forward_segment(tokens[:, 8:], mem, mem_len=20)
    torch.testing.assert_close(logits1, full[:, :8], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits2, full[:, 8:], rtol=1e-5, atol=1e-5)
    assert [m.shape for m in mem2] == [(2, 20, 32)] * 2 and [m.shape for m in mem] == [(2, 8, 32)] * 2


def test_memory_carries_no_gradient_and_is_clipped_to_mem_len():
    model = small_model("xl", causal=True).train()
    tokens = torch.randint(0, 23, (2, 12))
    _, mem = model.forward_segment(tokens[:, :6], mem_len=4)
    assert all(not m.requires_grad and m.shape[1] == 4 for m in mem)
    logits, _ = model.forward_segment(tokens[:, 6:], mem)
    logits.sum().backward()
    assert model.scheme.u.grad is not None


def test_memory_changes_the_output_and_mem_len_zero_matches_none():
    model = small_model("xl", causal=True)
    tokens = torch.randint(0, 23, (1, 16))
    _, mem = model.forward_segment(tokens[:, :8])
    alone, _ = model.forward_segment(tokens[:, 8:])
    assert not torch.allclose(model.forward_segment(tokens[:, 8:], mem)[0], alone, atol=1e-4)
    _, empty = model.forward_segment(tokens[:, :8], mem_len=0)
    torch.testing.assert_close(model.forward_segment(tokens[:, 8:], empty)[0], alone)


def test_memory_rejects_schemes_that_need_absolute_positions_and_bad_shapes():
    class Absolute(Scheme):
        def embed(self, x, ctx):
            return x + ctx.positions[:, None].float()

    tokens = torch.randint(0, 23, (2, 6))
    model = posenc.Transformer(Absolute(d_model=32, n_heads=4, n_layers=2, max_len=64, causal=True), 23,
                               d_model=32, n_heads=4, n_layers=2, causal=True)
    with pytest.raises(ValueError, match="supports_memory"):
        model.forward_segment(tokens, [torch.zeros(2, 3, 32)] * 2)
    xl = small_model("xl")
    with pytest.raises(ValueError, match="memory must be"):
        xl.forward_segment(tokens, [torch.zeros(2, 3, 32)])
    with pytest.raises(ValueError, match="mem_len"):
        xl.forward_segment(tokens, mem_len=-1)


# -- against transformers' Wav2Vec2-BERT and XLNet ---------------------------------------
# Wav2Vec2-BERT's self-attention has Shaw's clipped key embeddings (`relative_key`: eq. 5, keys only) and
# the Conformer's relative attention (`relative`: Transformer-XL's four terms with rel_shift,
# bidirectional); XLNet's rel_attn_core is Transformer-XL's causal attention over [memory; segment]. One
# of our attention layers and the reference get the same W_q, W_k, W_v, W_o, the same position
# parameters (Shaw's w^K table; XL's W_{k,R}, u and v) and the same input; the outputs must agree. The
# reference builds its own distances, clipping, sinusoid, shift and mask.
D, H = 32, 4


def one_layer(scheme: str, causal: bool, **options):
    """Our one-layer model with every parameter redrawn so that outputs are O(1) and a wrong term shows far
    above the tolerance: matrices at std d^-1/2, everything else (Shaw's table, XL's u and v, zero at
    initialisation) at std 1."""
    model = posenc.build_model(scheme, 11, causal=causal, d_model=D, n_heads=H, n_layers=1, max_len=32,
                               **options).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=D ** -0.5 if p.dim() == 2 else 1.0)
    return model


def reference_pair(scheme: str, kind: str, config: dict, **options):
    """(our one-layer bidirectional model, redrawn, and transformers' Wav2Vec2BertSelfAttention of `kind`,
    eager) with the same W_q, W_k, W_v, W_o (the reference's biases zero)."""
    model = one_layer(scheme, causal=False, **options)
    cfg = Wav2Vec2BertConfig(hidden_size=D, num_attention_heads=H, position_embeddings_type=kind,
                             attention_dropout=0.0, **config)
    cfg._attn_implementation = "eager"
    ref = w2v.Wav2Vec2BertSelfAttention(cfg).eval()
    attn = model.blocks[0].attn
    with torch.no_grad():
        w_q, w_k, w_v = attn.qkv.weight.split(D)
        for linear, weight in ((ref.linear_q, w_q), (ref.linear_k, w_k), (ref.linear_v, w_v),
                               (ref.linear_out, attn.out.weight)):
            linear.weight.copy_(weight)
            linear.bias.zero_()
    return model, ref


def our_attention(model, x):
    """The first block's attention of a bidirectional model on x [B, T, D], as the model runs it."""
    ctx = model.context(x.shape[1], None, x.device)
    return model.blocks[0].attn(x, model.scheme, ctx)[0]


@pytest.mark.parametrize("max_distance,seq", [(2, 9), (4, 7), (16, 12), (0, 5)])
def test_shaw_keys_equal_transformers_relative_key(max_distance, seq):
    """e_ij = q_i . (k_j + w^K_clip(j - i, -k, k)) / sqrt(d_h), the reference clipping at k on both sides."""
    torch.manual_seed(max_distance)
    model, ref = reference_pair("shaw", "relative_key", dict(left_max_position_embeddings=max_distance,
                                right_max_position_embeddings=max_distance), max_distance=max_distance, values=False)
    x = torch.randn(3, seq, D)
    with torch.no_grad():
        ref.distance_embedding.weight.copy_(model.scheme.table_k[0])
        torch.testing.assert_close(our_attention(model, x), ref(x)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seq", [1, 6, 13])
def test_transformer_xl_equals_transformers_conformer_relative_attention(seq):
    """A_ij = (q_i + u) . k_j + (q_i + v) . W_{k,R} R_{i-j}, R the sinusoid of i - j, scaled by 1/sqrt(d_h):
    the reference builds R for i - j = T-1 .. -(T-1) with its own sinusoid and shifts it with its own skew.
    With R's order reversed (the sign of i - j flipped) it must differ: the comparison can fail."""
    torch.manual_seed(seq)
    model, ref = reference_pair("xl", "relative", dict(max_source_positions=64))
    x = torch.randn(2, seq, D)
    with torch.no_grad():
        ref.linear_pos.weight.copy_(model.scheme.w_r[0].weight)
        ref.pos_bias_u.copy_(model.scheme.u[0])
        ref.pos_bias_v.copy_(model.scheme.v[0])
        pe = w2v.Wav2Vec2BertRelPositionalEmbedding(ref.config)(x)     # (1, 2T - 1, D), i - j decreasing
        ours = our_attention(model, x)
        torch.testing.assert_close(ours, ref(x, relative_position_embeddings=pe)[0], rtol=1e-5, atol=1e-5)
        if seq > 1:
            wrong = ref(x, relative_position_embeddings=pe.flip(1))[0]
            assert (ours - wrong).abs().max() > 0.1 * ours.abs().max()


@pytest.mark.parametrize("seq,mem", [(6, 0), (5, 4), (1, 7)])
def test_causal_transformer_xl_with_memory_equals_transformers_xlnet(seq, mem):
    """The causal layout with a memory of `mem` earlier inputs, against XLNet's rel_attn_core ("uni"): its own
    sinusoid ([sin, cos] halves, ours interleaved: W_{k,R}'s input columns are permuted to match), its own
    distances k_len .. 0 and shift, its own mask. W_o is the identity on our side, so the outputs compared
    are the heads' outputs before the projection; XLNet's q, k, v, r are ours reshaped to [d, heads, d_h]."""
    torch.manual_seed(seq + mem)
    model = one_layer("xl", causal=True)
    xlnet = XLNetModel(XLNetConfig(vocab_size=11, d_model=D, n_layer=1, n_head=H, d_inner=2 * D, attn_type="uni",
                                   dropout=0.0)).eval()
    ref, attn = xlnet.layer[0].rel_attn, model.blocks[0].attn
    halves = torch.cat([torch.arange(0, D, 2), torch.arange(1, D, 2)])       # XLNet's column c is our idx[c]
    with torch.no_grad():
        attn.out.weight.copy_(torch.eye(D))
        w_q, w_k, w_v = attn.qkv.weight.split(D)
        for theirs, ours in ((ref.q, w_q.T), (ref.k, w_k.T), (ref.v, w_v.T), (ref.r, model.scheme.w_r[0].weight.T[halves])):
            theirs.copy_(ours.reshape(D, H, D // H))
        ref.r_w_bias.copy_(model.scheme.u[0])
        ref.r_r_bias.copy_(model.scheme.v[0])
    x, memory = torch.randn(2, seq, D), torch.randn(2, mem, D)
    with torch.no_grad():
        ctx = model.context(seq, None, x.device, mem_len=mem)
        ours = attn(x, model.scheme, ctx, memory=memory if mem else None)[0]
        h, keys = x.transpose(0, 1), torch.cat([memory, x], 1).transpose(0, 1)     # XLNet's [len, batch, d]
        heads = lambda source, w: torch.einsum("ibh,hnd->ibnd", source, w)        # noqa: E731
        r = xlnet.relative_positional_encoding(seq, seq + mem, bsz=2)             # (k_len + 1, B, D): k_len .. 0
        future = (torch.arange(seq + mem)[None] > torch.arange(seq)[:, None] + mem).float()[:, :, None, None]
        vec = ref.rel_attn_core(heads(h, ref.q), heads(keys, ref.k), heads(keys, ref.v), heads(r, ref.r),
                                attn_mask=future)                                 # (T, B, H, Dh)
    torch.testing.assert_close(ours, vec.transpose(0, 1).reshape(2, seq, D), rtol=1e-5, atol=1e-5)


def test_shaw_values_see_the_same_dropped_weights_as_the_content():
    """Shaw et al. Eq. 3, z_i = sum_j alpha_ij (x_j W^V + a^V_ij): one set of weights for both terms, so under
    attention dropout both read the dropped alpha (as tensor2tensor does)."""
    torch.manual_seed(0)
    model = posenc.build_model("shaw", 23, causal=False, d_model=D, n_heads=4, n_layers=1, dropout=0.5).train()
    attn, x = model.blocks[0].attn, torch.randn(2, 9, D)
    ctx = model.context(x.shape[1], None, x.device)
    torch.manual_seed(1)
    got, _ = attn(x, model.scheme, ctx)
    B, T, H = 2, 9, 4
    q, k, v = attn.qkv(x).view(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4)
    q, k = model.scheme.layer_transform_qk(q, k, ctx, 0)
    logits = (q @ k.transpose(-2, -1)) * model.scheme.logit_scale() + model.scheme.extra_logits(q, k, ctx, 0)
    torch.manual_seed(1)
    alpha = torch.nn.functional.dropout(logits.softmax(-1), 0.5)
    want = alpha @ v + model.scheme.extra_values(alpha, ctx, 0)
    torch.testing.assert_close(got, attn.out(want.transpose(1, 2).reshape(B, T, D)))


@pytest.mark.parametrize("scheme, kw", [("t5", {}), ("shaw", {}), ("deberta", {"absolute": "none"}),
                                        ("tupe", {"relative": True})])
def test_table_and_bucket_schemes_reject_fractional_positions(scheme, kw):
    """A distance looked up by index must be whole: fractional positions are an error naming them, never rounded
    into another bucket; whole numbers given as floats are the integers."""
    model = posenc.build_model(scheme, 11, causal=False, d_model=32, n_heads=4, n_layers=1, **kw).eval()
    x = torch.randint(0, 11, (2, 8))
    with pytest.raises(ValueError, match="positions"):
        model(x, positions=torch.arange(8) * 0.5)
    torch.testing.assert_close(model(x, positions=torch.arange(8).double() + 3), model(x, positions=torch.arange(8) + 3))


@pytest.mark.parametrize("scheme, kwargs, error, match", [
    ("t5", {"bidirectional": "no"}, TypeError, "bidirectional must be True or False; got 'no'"),
    ("shaw", {"keys": "no"}, TypeError, "keys must be True or False"),
    ("shaw", {"values": 0}, TypeError, "values must be True or False"),
    ("shaw", {"max_distance": True}, ValueError, "max_distance must be a non-negative int"),
    ("xl", {"untie_uv": "no"}, TypeError, "untie_uv must be True or False"),
    ("xl", {"base": 0.5}, ValueError, "base must be a finite number > 1"),
])
def test_flags_that_any_truthy_value_used_to_switch_on_are_refused(scheme, kwargs, error, match):
    """'no' is truthy: t5 with bidirectional='no' built two-sided buckets, shaw with keys='no' a key table."""
    with pytest.raises(error, match=match):
        posenc.build_model(scheme, 23, causal=True, d_model=32, n_heads=4, n_layers=2, max_len=64, **kwargs)


def test_t5_bucket_refuses_a_string_flag_and_boolean_distances():
    from posenc.functional import t5_bucket
    with pytest.raises(TypeError, match="bidirectional must be True or False"):
        t5_bucket(torch.tensor([3]), bidirectional="no")
    with pytest.raises(TypeError, match="relative_position must be an integer tensor"):
        t5_bucket(torch.tensor([True, False]))
