"""xPos (posenc.xpos), partial rotation, p-RoPE and NoPE layers (posenc.rotary): references,
first principles, the per-layer q/k hook, bad options."""
import pytest
import torch
from rotary_embedding_torch import RotaryEmbedding
from transformers import GPTNeoXConfig, Llama4TextConfig
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding, apply_rotary_pos_emb
from x_transformers.x_transformers import RotaryEmbedding as XTRotaryEmbedding
from x_transformers.x_transformers import apply_rotary_pos_emb as xt_apply_rotary_pos_emb

import posenc
from conftest import small_model
from posenc.functional import apply_rope, apply_xpos
from posenc.rotary import RoPE, nope_layer_indices, rope_table, rotated_dims, rotated_pairs
from posenc.scheme import Scheme
from posenc.xpos import XPos, xpos_centre, xpos_scale, xpos_table, xpos_zeta

LAYOUTS = ["interleaved", "half"]


def scores(q, k):
    return q @ k.transpose(-1, -2)


# -- xPos against the references ----------------------------------------------------------------
@pytest.mark.parametrize("n", [7, 50])
def test_xpos_matches_rotary_embedding_torch(n):
    """rotate_queries_and_keys: the same q and k for positions 0..n-1 (centre n // 2 in both).

    Differences: rotary-embedding-torch forms the scale in q's dtype (ours: float64, then
    rounded), takes no positions (always 0..n-1), and by default caches the scales of its
    first call, so a later, shorter call reuses the first call's centre; we build a fresh,
    uncached one. Neither changes a score.
    """
    q, k = torch.randn(2, 2, 3, n, 16)
    ref_q, ref_k = RotaryEmbedding(16, use_xpos=True, cache_if_possible=False).rotate_queries_and_keys(q, k)
    ours_q, ours_k = apply_xpos(q, k, torch.arange(n))
    torch.testing.assert_close(ours_q, ref_q, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(ours_k, ref_k, rtol=1e-5, atol=2e-5)


def test_xpos_with_partial_rotation_matches_rotary_embedding_torch():
    """RotaryEmbedding(dim=16) on 24-dim heads rotates and scales the first 16 dims only, as ours."""
    q, k = torch.randn(2, 2, 3, 20, 24)
    ref_q, ref_k = RotaryEmbedding(16, use_xpos=True, cache_if_possible=False).rotate_queries_and_keys(q, k)
    ours_q, ours_k = apply_xpos(q, k, torch.arange(20), rotary_fraction=16 / 24)
    torch.testing.assert_close(ours_q, ref_q, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(ours_k, ref_k, rtol=1e-5, atol=2e-5)
    assert torch.equal(ours_q[..., 16:], q[..., 16:]) and torch.equal(ours_k[..., 16:], k[..., 16:])


def test_xpos_matches_x_transformers():
    """x-transformers' RotaryEmbedding(use_xpos=True): the same q, k for positions 0..n-1, the same
    scores for offset positions.

    Difference: x-transformers centres at (max(t) + 1) // 2, which does not move with an offset
    (positions 1000..1029 get the centre 515, not 1015), so its q and k differ from ours there
    by a factor zeta^(+-500/512) that cancels in every score; ours moves with the positions.
    """
    q, k = torch.randn(2, 2, 3, 30, 16)
    xt = XTRotaryEmbedding(16, use_xpos=True)
    for offset in (0, 1000):
        pos = torch.arange(30) + offset
        freqs, scale = xt(pos)
        ref_q, ref_k = xt_apply_rotary_pos_emb(q, freqs, scale), xt_apply_rotary_pos_emb(k, freqs, scale ** -1)
        ours_q, ours_k = apply_xpos(q, k, pos)
        if offset == 0:
            torch.testing.assert_close(ours_q, ref_q, rtol=1e-5, atol=2e-5)
            torch.testing.assert_close(ours_k, ref_k, rtol=1e-5, atol=2e-5)
        else:
            assert not torch.allclose(ours_q, ref_q)
        torch.testing.assert_close(scores(ours_q, ours_k), scores(ref_q, ref_k), rtol=1e-4, atol=1e-4)


def test_xpos_zeta_is_the_papers():
    """zeta_i = (i/(d/2) + 0.4) / 1.4, as rotary-embedding-torch's (arange(0, d, 2) + 0.4 d) / (1.4 d)."""
    ref = RotaryEmbedding(16, use_xpos=True).scale.double()
    torch.testing.assert_close(xpos_zeta(16), ref)
    torch.testing.assert_close(xpos_zeta(16), (torch.arange(8, dtype=torch.float64) / 8 + 0.4) / 1.4)


# -- xPos from first principles --------------------------------------------------------------------
def naive_xpos_scores(q, k, m, n, d, gamma=512.0):
    """Pair by pair: zeta_i^((m - n)/gamma) Re[q_i conj(k_i) e^{i (m - n) theta_i}] (interleaved pairs), float64."""
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    zeta = (torch.arange(d // 2, dtype=torch.float64) / (d / 2) + 0.4) / 1.4
    qc, kc = torch.view_as_complex(q.unflatten(-1, (-1, 2))), torch.view_as_complex(k.unflatten(-1, (-1, 2)))
    rel = (m - n).double()[:, None]
    return (zeta ** (rel / gamma) * (qc * kc.conj() * torch.exp(1j * rel * theta)).real).sum(-1)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_xpos_score_depends_on_m_minus_n_only(layout):
    q, k = torch.randn(2, 64, 16, dtype=torch.float64)
    m, n = torch.randint(0, 300, (2, 64))
    pos = torch.arange(300)
    for shift in (0, 17, 5000):
        Q, K = apply_xpos(q[:, None].expand(-1, 300, -1), k[:, None].expand(-1, 300, -1), pos + shift, layout=layout)
        got = (Q[torch.arange(64), m] * K[torch.arange(64), n]).sum(-1)
        if layout == "interleaved":
            torch.testing.assert_close(got, naive_xpos_scores(q, k, m, n, 16), rtol=1e-9, atol=1e-9)
        if shift == 0:
            first = got
        torch.testing.assert_close(got, first, rtol=1e-9, atol=1e-9)


def test_xpos_score_decays_with_distance():
    """Without rotation (p = 0) a query's score with an equal key is sum_i zeta_i^((m-n)/gamma) x_i^2:
    strictly decreasing in the distance m - n >= 0; with rotation, each pair's factor zeta_i^((m-n)/gamma)."""
    x = torch.randn(16, dtype=torch.float64)
    pos = torch.arange(0, 4000, 50)
    X = x.expand(len(pos), 16)
    q, k = apply_xpos(X, X, pos, p=0.0)
    row = scores(q, k)[-1]                                     # the last query against every earlier key
    assert (row[:-1] < row[1:]).all()                          # farther key (smaller n): smaller score
    assert row[0] < 0.5 * row[-1]
    cos, sin = rope_table(pos, 16, dtype=torch.float64)
    qc, qs, kc, ks = xpos_table(pos, 16, dtype=torch.float64)
    torch.testing.assert_close(qc / cos, xpos_scale(pos, 16, dtype=torch.float64))
    factor = (qc[:, None] * kc[None] + qs[:, None] * ks[None]) / (cos[:, None] * cos[None] + sin[:, None] * sin[None])
    rel = (pos[:, None] - pos[None]).double()                  # factor[m, n, i] = zeta_i^((m - n) / 512)
    torch.testing.assert_close(factor, xpos_zeta(16) ** (rel[..., None] / 512))


def test_xpos_centre_keeps_long_and_offset_sequences_finite():
    """Scales relative to the centre stay in float32 at 60,000 tokens and at offset 10^9; uncentred
    ones would overflow (zeta_0^(-60000/512) = 3.5^117 > 3.4e38)."""
    pos = torch.arange(60000)
    assert xpos_centre(pos) == 30000 and xpos_centre(pos + 10 ** 9) == 30000 + 10 ** 9
    assert xpos_centre(torch.arange(7)) == 3 and xpos_centre(torch.arange(8) + 0.5) == 4.5
    assert all(torch.isfinite(t).all() for t in xpos_table(pos, 16))
    assert all(torch.isfinite(t).all() for t in xpos_table(pos[:100] + 10 ** 9, 16))
    assert torch.isinf(xpos_zeta(16, dtype=torch.float32)[0] ** torch.tensor(-60000 / 512))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_xpos_with_one_centre_decodes_with_cached_keys(layout):
    """Keys made by one call and a query made by a later one score as in one call over the whole sequence
    when both calls take the same centre; each call's own middle (the default) does not cancel across calls."""
    torch.manual_seed(0)
    q, k = torch.randn(2, 1, 2, 300, 16, dtype=torch.float64)
    pos = torch.arange(300)
    def last_row(centre):
        _, k_cached = apply_xpos(q[..., :-1, :], k[..., :-1, :], pos[:-1], layout=layout, centre=centre)
        q_new, k_new = apply_xpos(q[..., -1:, :], k[..., -1:, :], pos[-1:], layout=layout, centre=centre)
        return q_new @ torch.cat([k_cached, k_new], -2).transpose(-1, -2)          # (1, 2, 1, 300)
    for centre in (0, 150, 1000.5):
        qf, kf = apply_xpos(q, k, pos, layout=layout, centre=centre)
        full = qf @ kf.transpose(-1, -2)
        torch.testing.assert_close(last_row(centre), full[..., -1:, :])
        default_q, default_k = apply_xpos(q, k, pos, layout=layout)
        torch.testing.assert_close(full, default_q @ default_k.transpose(-1, -2))   # within a call c cancels
    assert (last_row(None) - full[..., -1:, :]).abs().max() > 1e-2


@pytest.mark.parametrize("centre, match", [(float("nan"), "centre must be a finite number"),
                                           (True, "centre must be a finite number"),
                                           (0, "lie up to 70000 from centre=0")])
def test_xpos_centre_is_checked_by_name(centre, match):
    with pytest.raises(ValueError, match=match):
        apply_xpos(torch.randn(70001, 8), torch.randn(70001, 8), torch.arange(70001), centre=centre)


def test_xpos_gradients_are_the_transpose_of_the_scaled_rotation():
    q, k = torch.randn(2, 2, 9, 12, dtype=torch.float64, requires_grad=True)
    pos = torch.arange(9) + 300
    for layout in LAYOUTS:
        fn = lambda a, b: apply_xpos(a, b, pos, layout=layout, rotary_fraction=2 / 3)   # noqa: E731
        assert torch.autograd.gradcheck(fn, (q, k))


# -- xPos in the model ---------------------------------------------------------------------------------
def test_xpos_is_registered_causal_only_and_shift_invariant():
    assert posenc.SCHEMES["xpos"] is XPos and issubclass(XPos, RoPE)
    assert XPos.causal_only and XPos.shift_invariant and not XPos.supports_memory
    model = small_model("xpos")
    assert not model.scheme.custom_attention and model.context(9, None, "cpu").attn_mask is None   # fused SDPA


@pytest.mark.parametrize("options", [{}, {"scale_base": 32.0, "gamma_hat": 0.1}])
def test_xpos_scheme_transforms_as_apply_xpos(options):
    """At the defaults and at the book's "xpos (scale L/2)" kind of setting: a scheme that dropped its own
    scale_base or gamma_hat for the defaults would pass the first case only."""
    scheme = small_model("xpos", layout="half", **options).scheme
    ctx = posenc.PositionContext(torch.arange(13) + 40, causal=True)
    ctx.tables = scheme.prepare(ctx)
    q, k = torch.randn(2, 2, 4, 13, 8)
    got = scheme.layer_transform_qk(q, k, ctx, 0)
    for a, b in zip(got, apply_xpos(q, k, torch.arange(13) + 40, layout="half", **options)):
        torch.testing.assert_close(a, b)
    if options:                                                   # and the options change what it does
        default = small_model("xpos", layout="half").scheme
        ctx.tables = default.prepare(ctx)
        assert not torch.allclose(default.layer_transform_qk(q, k, ctx, 0)[0], got[0])


def test_xpos_model_ignores_an_offset_and_never_looks_ahead():
    model = small_model("xpos", max_len=2048)
    tokens = torch.randint(0, 23, (2, 16))
    ref = model(tokens)
    for c in (1, 1000, 10 ** 6):
        torch.testing.assert_close(model(tokens, torch.arange(16) + c), ref, rtol=1e-4, atol=1e-4)
    changed = tokens.clone()
    changed[:, 9:] = (tokens[:, 9:] + 1) % 23
    out = model(changed)
    torch.testing.assert_close(out[:, :9], ref[:, :9])          # earlier outputs: bit for bit the same
    assert not torch.allclose(out[:, 9:], ref[:, 9:])


def test_xpos_differs_from_rope_with_the_same_weights():
    rope, xpos = small_model("rope"), small_model("xpos")
    xpos.load_state_dict(rope.state_dict())
    tokens = torch.randint(0, 23, (2, 30))
    assert not torch.allclose(rope(tokens), xpos(tokens), atol=1e-5)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"causal": False}, ValueError, "causal"),
    ({"scale_base": 0}, ValueError, "scale_base"),
    ({"scale_base": float("inf")}, ValueError, "scale_base"),
    ({"gamma_hat": 0.0}, ValueError, "gamma_hat"),
    ({"gamma_hat": True}, ValueError, "gamma_hat"),
    ({"rotary_fraction": 0.1}, ValueError, "rotary_fraction"),
    ({"p": 2}, ValueError, "p must"),
    ({"scaling": "yarn"}, ValueError, "scaling"),
    ({"not_an_option": 1}, TypeError, "not_an_option"),
])
def test_xpos_rejects_bad_options_by_name(kwargs, error, match):
    kwargs = {"causal": True, **kwargs}
    with pytest.raises(error, match=match):
        posenc.build_model("xpos", 10, d_model=32, n_heads=4, **kwargs)


# -- partial rotation -----------------------------------------------------------------------------------
@pytest.mark.parametrize("fraction, rot", [(0.25, 4), (0.5, 8), (1.0, 16)])
def test_partial_rotation_matches_rotary_embedding_torch(fraction, rot):
    """RotaryEmbedding(dim=r) applied to 16-dim heads rotates the first r dims (interleaved) with
    theta_i = base^(-2i/r) and leaves the rest: our rotary_fraction = r / 16."""
    x = torch.randn(2, 3, 40, 16)
    pos = torch.arange(40) + 11
    ref = RotaryEmbedding(rot).rotate_queries_or_keys(x, offset=11)
    ours = apply_rope(x, pos, rotary_fraction=fraction)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=2e-5)
    assert torch.equal(ours[..., rot:], x[..., rot:])


def test_partial_rotation_matches_gpt_neox():
    """transformers' GPT-NeoX (rotary_pct = partial_rotary_factor = 0.25, half layout within the rotated dims)."""
    cfg = GPTNeoXConfig(hidden_size=64, num_attention_heads=4, rotary_pct=0.25)
    q, k = torch.randn(2, 2, 4, 30, 16)
    pos = torch.arange(30) + 7
    cos, sin = GPTNeoXRotaryEmbedding(cfg)(q, pos[None])
    ref_q, ref_k = apply_rotary_pos_emb(q, k, cos, sin)
    scheme = small_model("rope", d_model=64, n_heads=4, layout="half", rotary_fraction=0.25).scheme
    assert scheme.rot_dim == 4
    ctx = posenc.PositionContext(pos, causal=True)
    ctx.tables = scheme.prepare(ctx)
    ours_q, ours_k = scheme.transform_qk(q, k, ctx)
    torch.testing.assert_close(ours_q, ref_q, rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(ours_k, ref_k, rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_partial_rotation_keeps_relative_scores_and_model_shift_invariance(layout):
    q, k = torch.randn(2, 3, 40, 16, dtype=torch.float64)
    pos = torch.arange(40)
    def half_rotated(x, positions):
        return apply_rope(x, positions, layout=layout, rotary_fraction=0.5)
    ref = scores(half_rotated(q, pos), half_rotated(k, pos))
    shifted = scores(half_rotated(q, pos + 999), half_rotated(k, pos + 999))
    torch.testing.assert_close(shifted, ref)
    model = small_model("rope", layout=layout, rotary_fraction=0.5)
    tokens = torch.randint(0, 23, (2, 12))
    torch.testing.assert_close(model(tokens, torch.arange(12) + 500), model(tokens), rtol=1e-4, atol=1e-4)


def test_rotated_dims_rounds_and_needs_an_even_count():
    assert rotated_dims(80, 0.4) == 32 and rotated_dims(64, 0.25) == 16 and rotated_dims(8, 1) == 8
    assert rotated_dims(100, 0.58) == 58                        # 0.58 * 100 = 57.99999999999999: rounded, not floored
    with pytest.raises(ValueError, match="rotary_fraction"):
        rotated_dims(10, 0.5)                                                   # 5 dims: not pairs
    for bad in (0, -0.5, 1.5, float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match="rotary_fraction"):
            rotated_dims(16, bad)


# -- p-RoPE -------------------------------------------------------------------------------------------
def gemma_p_rope(x, positions, p, base=10000.0):
    """google-deepmind/gemma `apply_rope(..., rope_proportion=p)` transcribed to torch: timescales of the
    first int(p d // 2) pairs, inf for the rest (angle 0), half layout."""
    d = x.shape[-1]
    rope_angles = int(p * d // 2)
    timescale = base ** ((2.0 / d) * torch.arange(rope_angles, dtype=torch.float64))
    timescale = torch.cat([timescale, torch.full((d // 2 - rope_angles,), float("inf"), dtype=torch.float64)])
    angle = positions.double()[:, None] / timescale
    first, second = x.double().chunk(2, -1)
    return torch.cat([first * angle.cos() - second * angle.sin(), second * angle.cos() + first * angle.sin()], -1)


@pytest.mark.parametrize("p", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_p_rope_matches_gemmas_rope_proportion(p):
    x = torch.randn(2, 3, 30, 16, dtype=torch.float64)
    pos = torch.arange(30) * 13
    torch.testing.assert_close(apply_rope(x, pos, layout="half", p=p), gemma_p_rope(x, pos, p))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_p_rope_ends_are_rope_and_nope(layout):
    x = torch.randn(2, 3, 25, 16)
    pos = torch.arange(25) + 100
    assert torch.equal(apply_rope(x, pos, layout=layout, p=1.0), apply_rope(x, pos, layout=layout))
    assert torch.equal(apply_rope(x, pos, layout=layout, p=0.0), x)
    rope, p0, nope = small_model("rope"), small_model("rope", p=0.0), small_model("nope")
    for m in (p0, nope):
        m.load_state_dict(rope.state_dict())
    tokens = torch.randint(0, 23, (2, 14))
    torch.testing.assert_close(p0(tokens), nope(tokens))
    assert not torch.allclose(p0(tokens), rope(tokens), atol=1e-5)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("p, kept", [(0.25, 2), (0.5, 4), (0.6, 4), (0.9, 7)])
def test_p_rope_leaves_the_lowest_frequency_pairs_untouched(layout, p, kept):
    """Of d/2 = 8 pairs, floor(8 p) keep rotating (the highest frequencies, i small); the rest pass unchanged."""
    x = torch.randn(3, 20, 16)
    out = apply_rope(x, torch.arange(20) + 1, layout=layout, p=p)
    pair_dims = [(2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + 8) for i in range(8)]
    untouched = [i for i, dims in enumerate(pair_dims) if torch.equal(out[..., list(dims)], x[..., list(dims)])]
    assert untouched == list(range(kept, 8)) and rotated_pairs(8, p) == kept
    cos, sin = rope_table(torch.arange(20) + 1, 16, p=p)
    assert (cos[:, kept:] == 1).all() and (sin[:, kept:] == 0).all() and (sin[1:, :kept] != 0).all()


def test_p_rope_counts_pairs_by_floor_with_a_tolerance():
    assert rotated_pairs(50, 0.58) == 29                      # 0.58 * 50 = 28.999999999999996 in float
    assert [rotated_pairs(8, p) for p in (0, 0.1, 0.125, 0.99, 1)] == [0, 0, 1, 7, 8]
    for bad in (-0.1, 1.01, float("nan"), None, True):
        with pytest.raises(ValueError, match="p must"):
            rotated_pairs(8, bad)


# -- the per-layer hook and NoPE layers -------------------------------------------------------------------
class _LayerSeen(Scheme):
    """Records the layer each q/k transform is asked for."""

    def layer_transform_qk(self, q, k, ctx, layer):
        self.seen.append(layer)
        return q, k


def test_layer_transform_qk_is_a_hook_called_once_per_layer(monkeypatch):
    assert Scheme.HOOKS.index("layer_transform_qk") == Scheme.HOOKS.index("transform_qk") + 1
    assert "layer_transform_qk" in Scheme.__doc__ or "layer_transform_qk" in posenc.scheme.__doc__
    monkeypatch.setitem(posenc.SCHEMES, "_seen", _LayerSeen)
    model = small_model("_seen", n_layers=3)
    model.scheme.seen = []
    model(torch.randint(0, 23, (2, 5)))
    assert model.scheme.seen == [0, 1, 2] and _LayerSeen.overridden_hooks() == ("layer_transform_qk",)
    q, k = torch.randn(2, 1, 2, 3, 8)
    ctx = posenc.PositionContext(torch.arange(3), causal=True)
    out = Scheme(d_model=8, n_heads=1, n_layers=1, max_len=3, causal=True).layer_transform_qk(q, k, ctx, 0)
    assert out[0] is q and out[1] is k                                         # default: transform_qk, NoPE's identity


def test_nope_every_follows_llama4_no_rope_layer_interval():
    """transformers' Llama 4: no_rope_layers[l] = int((l + 1) % interval != 0), 0 meaning NoPE."""
    for n_layers, every in ((8, 4), (12, 4), (6, 2), (5, 1)):
        flags = Llama4TextConfig(num_hidden_layers=n_layers, no_rope_layer_interval=every).no_rope_layers
        assert nope_layer_indices(n_layers, nope_every=every) == tuple(i for i, f in enumerate(flags) if f == 0)
    assert small_model("rope", n_layers=4, nope_every=4).scheme.nope_layers == (3,)


def test_nope_layer_is_unrotated_and_the_rest_rotated():
    torch.manual_seed(1)
    hybrid = small_model("rope", n_layers=4, nope_layers=(3,))
    rope = small_model("rope", n_layers=4)
    rope.load_state_dict(hybrid.state_dict())
    tokens = torch.randint(0, 23, (2, 15))
    assert not torch.allclose(hybrid(tokens), rope(tokens), atol=1e-5)
    # by hand: blocks 0-2 with RoPE, block 3 with a position-free scheme
    nope = Scheme(d_model=32, n_heads=4, n_layers=4, max_len=64, causal=True)
    ctx = rope.context(15, None, "cpu")
    x = rope.tok(tokens)
    for i, block in enumerate(rope.blocks):
        x, _ = block(x, nope if i == 3 else rope.scheme, ctx)
    torch.testing.assert_close(hybrid(tokens), rope.head(rope.ln_f(x)))
    # one layer's q, k: untouched in layer 3, rotated in layer 0
    q, k = torch.randn(2, 2, 4, 15, 8)
    hctx = hybrid.context(15, None, "cpu")
    out = hybrid.scheme.layer_transform_qk(q, k, hctx, 3)
    assert out[0] is q and out[1] is k
    for a, b in zip(hybrid.scheme.layer_transform_qk(q, k, hctx, 0), (apply_rope(q, torch.arange(15)),
                                                                       apply_rope(k, torch.arange(15)))):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("scheme", ["rope", "xpos"])
@pytest.mark.parametrize("causal", [True, False])
def test_models_with_nope_layers_stay_shift_invariant(scheme, causal):
    """A NoPE layer sees no position (causal: only the order, through the mask), so offsets change nothing."""
    if scheme == "xpos" and not causal:
        pytest.skip("xpos is causal_only")
    model = small_model(scheme, causal, n_layers=4, nope_every=2, max_len=4096)
    assert model.scheme.nope_layers == (1, 3)
    tokens = torch.randint(0, 23, (2, 13))
    for c in (1, 333, 4000):
        torch.testing.assert_close(model(tokens, torch.arange(13) + c), model(tokens), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"nope_layers": (4,)}, ValueError, r"nope_layers must lie in \[0, n_layers=4\)"),
    ({"nope_layers": (-1,)}, ValueError, "nope_layers"),
    ({"nope_layers": ("3",)}, TypeError, "nope_layers"),
    ({"nope_layers": 3}, TypeError, "nope_layers"),
    ({"nope_layers": (True,)}, TypeError, "nope_layers"),
    ({"nope_every": 0}, ValueError, "nope_every"),
    ({"nope_every": 2.0}, ValueError, "nope_every"),
    ({"nope_every": 5}, ValueError, "nope_every=5 selects no layer"),
    ({"nope_layers": (1,), "nope_every": 2}, ValueError, "nope_layers or nope_every"),
    ({"rotary_fraction": 0.0}, ValueError, "rotary_fraction"),
    ({"rotary_fraction": 0.35}, ValueError, "rotary_fraction"),                # round(0.35 * 8) = 3: odd
    ({"p": -0.5}, ValueError, "p must"),
    ({"p": "all"}, ValueError, "p must"),
])
def test_rope_rejects_bad_options_by_name(kwargs, error, match):
    with pytest.raises(error, match=match):
        small_model("rope", n_layers=4, **kwargs)


def test_nope_layers_are_sorted_and_deduplicated():
    assert nope_layer_indices(6, nope_layers=[4, 1, 4]) == (1, 4)
    assert nope_layer_indices(6) == () and nope_layer_indices(6, nope_layers=range(0, 6, 3)) == (0, 3)


def test_tables_follow_the_positions_device():
    """The `meta` device stands in for a GPU (as in test_devices): no table is built on the CPU."""
    pos = torch.arange(8, device="meta")
    assert all(t.device.type == "meta" for t in xpos_table(pos, 16))
    assert rope_table(pos, 16, p=0.5)[0].device.type == "meta"
    x = torch.empty(2, 8, 16, device="meta")
    assert apply_rope(x, pos, rotary_fraction=0.5, p=0.5).device.type == "meta"
    assert apply_xpos(x, x, pos)[1].device.type == "meta"


def test_xpos_refuses_a_span_its_scale_would_overflow_and_serves_one_just_inside():
    """zeta_0^(-(m - c)/gamma) passes float32's largest value past a span of about 72,500 (gamma = 512), and
    float16's past about 9,000: there the tables held inf and the scores NaN, with no error. Inside the limit
    every number is finite; past it the error names the span, the dtype and scale_base."""
    from posenc.schemes.xpos import check_xpos_span
    torch.manual_seed(0)
    x = torch.randn(1, 2, 6, 16)
    inside = torch.arange(6) * 14000                                          # span 70,001
    q, k = apply_xpos(x, x, inside)
    assert torch.isfinite(q).all() and torch.isfinite(k).all()
    with pytest.raises(ValueError, match=r"span 150001.*float32.*scale_base"):
        apply_xpos(x, x, torch.arange(6) * 30000)
    q, k = apply_xpos(x.half(), x.half(), torch.arange(6) * 1600)            # span 8,001 in float16
    assert torch.isfinite(q).all() and torch.isfinite(k).all()
    with pytest.raises(ValueError, match="float16"):
        apply_xpos(x.half(), x.half(), torch.arange(6) * 5000)
    apply_xpos(x, x, torch.arange(6) * 30000, scale_base=4096.0)             # a larger gamma serves it
    model = posenc.build_model("xpos", 32, causal=True, d_model=32, n_heads=2, max_len=16)
    tokens = torch.randint(0, 32, (1, 8))
    assert torch.isfinite(model(tokens, torch.arange(8) * 9000)).all()      # span 63,001
    with pytest.raises(ValueError, match="xPos's scale"):
        model(tokens, torch.arange(8) * 20000)
    check_xpos_span(0, 72000, 512.0)                                          # the limit the message gives
    with pytest.raises(ValueError, match="about 72519"):
        check_xpos_span(0, 73500, 512.0)


def test_at_the_float32_limit_the_span_check_passes_exactly_the_spans_whose_factors_are_finite():
    """Positions 0..n-1 have centre c = n // 2, so their largest factor is (1/zeta_0)^(c / scale_base), computed in
    float64 and cast as xpos_table does. The check must never pass a span whose factor is inf in float32, and for
    an even n, where its bound (n - 1) // 2 + 1 is c itself, it must pass every span whose factor is finite (for
    an odd n the bound is c + 1: it may refuse one span early). A bound one short let 72,522 through to inf."""
    from posenc.schemes.xpos import check_xpos_span
    zeta_0 = 0.4 / 1.4
    for n in range(72480, 72560):
        finite = bool(torch.isfinite((torch.tensor(1 / zeta_0, dtype=torch.float64) ** ((n // 2) / 512.0)).float()))
        try:
            check_xpos_span(0, n - 1, 512.0)
            passes = True
        except ValueError:
            passes = False
        assert not passes or finite, n
        if n % 2 == 0:
            assert passes == finite, n


def test_a_context_reads_its_positions_once_however_many_checks_ask(monkeypatch):
    """xPos checks its span through ctx.minmax(), then RoPE's tables ask for the start and the largest. On a GPU
    each read of the tensor is a wait, so the context reads it once and answers every question from that."""
    import posenc.scheme as scheme_module
    reads = []
    real = scheme_module.summarise_positions
    monkeypatch.setattr(scheme_module, "summarise_positions", lambda p: reads.append(1) or real(p))
    model = small_model("xpos")
    ctx = posenc.PositionContext(torch.arange(8) * 3 + 5, causal=True)  # no extent: as for positions on a GPU
    ctx.tables = model.scheme.prepare(ctx)                              # the span check, then the tables
    assert ctx.minmax() == (5, 26) and len(reads) == 1
