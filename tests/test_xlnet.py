"""XLNet's variant of Transformer-XL's relative attention: one (u, v) per layer (`untie_uv=True`)
instead of one pair shared by every layer (the default)."""
import math

import pytest
import torch

import posenc
from posenc.absolute import sinusoidal_at
from posenc.attention import causal_mask
from posenc.model import SegmentContext
from posenc.runs.recurrence import segment_loss

VOCAB, D, H, LAYERS = 23, 32, 4, 3


def xl_model(untie_uv: bool, seed: int = 0, causal: bool = True):
    torch.manual_seed(seed)
    return posenc.build_model("xl", VOCAB, causal=causal, d_model=D, n_heads=H, n_layers=LAYERS, max_len=64,
                              untie_uv=untie_uv)


def test_shapes_and_parameter_count():
    shared, untied = xl_model(False), xl_model(True)
    assert shared.scheme.u.shape == shared.scheme.v.shape == (1, H, D // H)
    assert untied.scheme.u.shape == untied.scheme.v.shape == (LAYERS, H, D // H)
    count = lambda m: sum(p.numel() for p in m.parameters())
    assert count(untied) - count(shared) == 2 * (LAYERS - 1) * D
    assert untied(torch.randint(0, VOCAB, (2, 10))).shape == (2, 10, VOCAB)


def test_default_is_shared():
    assert xl_model(False).scheme.u.shape[0] == posenc.build_model("xl", VOCAB, causal=True, d_model=D, n_heads=H,
                                                                 n_layers=LAYERS).scheme.u.shape[0] == 1


def test_same_seed_same_initial_weights():
    """u, v start at 0 in both, so the same seed gives the same model: the chapter's runs are paired."""
    shared, untied = xl_model(False, seed=4), xl_model(True, seed=4)
    a, b = shared.state_dict(), untied.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k].expand_as(b[k]), b[k]), k
    tokens = torch.randint(0, VOCAB, (2, 12))
    torch.testing.assert_close(shared(tokens), untied(tokens), rtol=0, atol=0)


@pytest.mark.parametrize("layer", range(LAYERS))
@pytest.mark.parametrize("causal", [True, False])
def test_layer_reads_its_own_u_and_v(layer, causal):
    """extra_logits of layer l = the four-term formula with u_l, v_l and W_{k,R} of layer l."""
    scheme = posenc.SCHEMES["xl"](d_model=D, n_heads=H, n_layers=LAYERS, max_len=64, causal=causal, untie_uv=True)
    torch.nn.init.normal_(scheme.u), torch.nn.init.normal_(scheme.v)
    q_len, k_len, Dh = 5, 9, D // H
    k_pos = torch.arange(k_len) + 7
    q_pos = k_pos[k_len - q_len:]
    ctx = SegmentContext(q_pos, causal, key_positions=k_pos)
    ctx.tables = scheme.prepare(ctx)
    q, k = torch.randn(2, H, q_len, Dh), torch.randn(2, H, k_len, Dh)
    dist = q_pos[:, None] - k_pos[None, :]
    r = scheme.w_r[layer](sinusoidal_at(dist.flatten(), D)).view(q_len, k_len, H, Dh)
    u, v = scheme.u[layer], scheme.v[layer]
    want = (torch.einsum("bhqd,bhkd->bhqk", q + u[:, None], k)
            + torch.einsum("bhqd,qkhd->bhqk", q + v[:, None], r)) / math.sqrt(Dh)
    got = q @ k.transpose(-1, -2) / math.sqrt(Dh) + scheme.extra_logits(q, k, ctx, layer)
    keep = causal_mask(q_len, k_len) == 0 if causal else torch.ones(q_len, k_len, dtype=torch.bool)
    torch.testing.assert_close(got[..., keep], want[..., keep], rtol=1e-5, atol=1e-5)


def one_step(model, tokens, lr=1e-2):
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    loss = segment_loss(model, tokens[:, :-1], tokens[:, 1:], tokens.shape[1] // 2)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


def test_per_layer_u_v_differ_per_layer_after_one_step():
    model = xl_model(True)
    assert not model.scheme.u.any() and not model.scheme.v.any()                    # all layers start equal (0)
    one_step(model, torch.randint(0, VOCAB, (4, 17)))
    u, v = model.scheme.u.detach(), model.scheme.v.detach()
    for a in range(LAYERS):
        for b in range(a + 1, LAYERS):
            assert not torch.allclose(u[a], u[b]) and not torch.allclose(v[a], v[b])


@pytest.mark.parametrize("causal", [True, False])
def test_untied_with_equal_layers_equals_shared(causal):
    """Per-layer u, v all set to the shared pair: the same logits, memory and loss, and the shared pair's
    gradient is the sum of the per-layer ones."""
    shared, untied = xl_model(False, seed=1, causal=causal), xl_model(True, seed=1, causal=causal)
    with torch.no_grad():
        shared.scheme.u.normal_(), shared.scheme.v.normal_()
        untied.scheme.u.copy_(shared.scheme.u.expand_as(untied.scheme.u))
        untied.scheme.v.copy_(shared.scheme.v.expand_as(untied.scheme.v))
    tokens = torch.randint(0, VOCAB, (3, 16))
    torch.testing.assert_close(untied(tokens), shared(tokens), rtol=1e-6, atol=1e-6)
    if causal:
        (_, m1), (_, m2) = shared.forward_segment(tokens[:, :8]), untied.forward_segment(tokens[:, :8])
        torch.testing.assert_close(untied.forward_segment(tokens[:, 8:], m2, mem_len=16)[0],
                                   shared.forward_segment(tokens[:, 8:], m1, mem_len=16)[0], rtol=1e-6, atol=1e-6)
    for m in (shared, untied):
        m(tokens).square().mean().backward()
    for name in ("u", "v"):
        g_shared, g_untied = getattr(shared.scheme, name).grad, getattr(untied.scheme, name).grad
        torch.testing.assert_close(g_untied.sum(0, keepdim=True), g_shared, rtol=1e-5, atol=1e-6)
        assert not torch.allclose(g_untied[0], g_untied[1])                            # but each layer its own


def test_untied_shift_invariance_and_memory():
    model = xl_model(True).eval()
    with torch.no_grad():
        model.scheme.u.normal_(), model.scheme.v.normal_()
    tokens = torch.randint(0, VOCAB, (2, 20))
    torch.testing.assert_close(model(tokens, torch.arange(20) + 1000), model(tokens), rtol=0, atol=1e-5)
    full = model(tokens)
    _, mem = model.forward_segment(tokens[:, :8])
    torch.testing.assert_close(model.forward_segment(tokens[:, 8:], mem, mem_len=20)[0], full[:, 8:],
                               rtol=1e-5, atol=1e-5)
