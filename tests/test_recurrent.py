"""The recurrent scheme (posenc.recurrent, `rnn`): positions from a GRU before the Transformer."""
import pytest
import torch
from torch import nn

import posenc
from posenc.recurrent import Recurrent
from conftest import small_model


def gru_step(x, h, w_ih, w_hh, b_ih, b_hh):
    """One GRU update written out (PyTorch's gate order r, z, n): x [B, D], h [B, H] -> [B, H]."""
    xr, xz, xn = (x @ w_ih.T + b_ih).chunk(3, -1)
    hr, hz, hn = (h @ w_hh.T + b_hh).chunk(3, -1)
    r, z = torch.sigmoid(xr + hr), torch.sigmoid(xz + hz)
    n = torch.tanh(xn + r * hn)
    return h + (1 - z) * (n - h)                        # = (1 - z) n + z h: an Euler step of dh/dt = n - h


def unrolled(scheme, x, suffix="", reverse=False):
    """h_1..h_n by a Python loop over time with the GRU's own weights: [B, T, H]."""
    w = [getattr(scheme.gru, f"{name}_l0{suffix}") for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
    h = scheme.h0[1 if reverse else 0].expand(x.shape[0], -1)
    out = [None] * x.shape[1]
    for i in (reversed(range(x.shape[1])) if reverse else range(x.shape[1])):
        h = gru_step(x[:, i], h, *w)
        out[i] = h
    return torch.stack(out, 1)


def scheme(causal=True, **kw):
    torch.manual_seed(0)
    s = Recurrent(d_model=16, n_heads=2, n_layers=2, max_len=8, causal=causal, **kw)
    with torch.no_grad():                               # h0 and the projection away from their zero inits
        s.h0.normal_(0, 0.5)
        s.proj.bias.normal_(0, 0.1)
    return s


def test_added_vectors_equal_the_hand_unrolled_recursion():
    s = scheme(hidden=12)
    x = torch.randn(3, 9, 16)
    h = unrolled(s, x)
    torch.testing.assert_close(s.states(x), h, rtol=1e-5, atol=1e-5)
    ctx = posenc.PositionContext(torch.arange(9), causal=True)
    torch.testing.assert_close(s.embed(x, ctx), x + h @ s.proj.weight.T + s.proj.bias, rtol=1e-5, atol=1e-5)


def test_recursion_equals_a_gru_cell_with_the_copied_weights():
    s = scheme()
    cell = nn.GRUCell(16, 16)
    cell.load_state_dict({k: getattr(s.gru, f"{k}_l0") for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")})
    x = torch.randn(2, 7, 16)
    h, states = s.h0[0].expand(2, -1), []
    for i in range(7):
        h = cell(x[:, i], h)
        states.append(h)
    torch.testing.assert_close(s.states(x), torch.stack(states, 1), rtol=1e-5, atol=1e-5)


def test_bidirectional_states_are_the_forward_and_the_backward_recursion():
    s = scheme(causal=False)
    assert s.bidirectional and s.proj.in_features == 32                    # follows the model by default
    x = torch.randn(2, 6, 16)
    want = torch.cat([unrolled(s, x), unrolled(s, x, "_reverse", reverse=True)], -1)
    torch.testing.assert_close(s.states(x), want, rtol=1e-5, atol=1e-5)


def test_residual_false_replaces_the_inputs_by_the_codes():
    s = scheme(residual=False)
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(s.embed(x, posenc.PositionContext(torch.arange(5), causal=True)), s.codes(x))


@pytest.mark.parametrize("kw", [{}, {"hidden": 8}, {"residual": False}])
def test_a_causal_model_never_sees_a_future_token(kw):
    model = small_model("rnn", causal=True, **kw)
    assert not model.scheme.bidirectional
    tokens = torch.randint(0, 23, (2, 20))
    changed = tokens.clone()
    changed[:, 12] = (tokens[:, 12] + 1) % 23
    a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :12], b[:, :12])
    assert not torch.allclose(a[:, 12:], b[:, 12:])


def test_the_bidirectional_gru_carries_later_tokens_back():
    model = small_model("rnn", causal=False)
    x = model.tok(torch.randint(0, 23, (1, 10)))
    y = x.clone()
    y[:, 7] += 1.0
    a, b = model.scheme.codes(x), model.scheme.codes(y)
    assert not torch.allclose(a[:, :7], b[:, :7])                          # the backward half reads the future
    left = small_model("rnn", causal=False, bidirectional=False).scheme      # left to right: it does not
    torch.testing.assert_close(left.codes(x)[:, :7], left.codes(y)[:, :7])


def test_same_tokens_get_different_codes_at_different_places():
    """The recursion is the position: one repeated token gets a new vector at every step."""
    model = small_model("rnn", causal=True)
    with torch.no_grad():
        model.scheme.h0.normal_()
        codes = model.scheme.codes(model.tok(torch.full((1, 12), 5)))[0]
    assert (codes[1:] - codes[:-1]).norm(dim=-1).min() > 1e-4


def test_position_ids_are_ignored():
    model = small_model("rnn", causal=True, max_len=8)
    tokens = torch.randint(0, 23, (2, 11))
    torch.testing.assert_close(model(tokens, torch.arange(11) + 10**6), model(tokens))
    torch.testing.assert_close(model(tokens, torch.arange(11.0) * 0.37), model(tokens))


@pytest.mark.parametrize("causal", [True, False])
def test_the_model_runs_at_lengths_never_seen(causal):
    model = small_model("rnn", causal=causal, max_len=8)
    for n in (9, 64, 300):
        out = model(torch.randint(0, 23, (2, n)))
        assert out.shape == (2, n, 23) and torch.isfinite(out).all()


def test_a_cls_token_is_the_first_step_of_the_recursion():
    """With [CLS], the GRU reads [CLS; x_1..x_n]: CLS is step 1, so the tokens' codes all follow it."""
    model = small_model("rnn", causal=False, cls_token=True, num_classes=3)   # a causal [CLS] would see only itself
    with torch.no_grad():
        model.cls.normal_()                                       # zero at initialisation: make it visible
    read = []
    model.scheme.gru.register_forward_hook(lambda module, args, out: read.append(args[0]))
    tokens = torch.randint(0, 23, (2, 7))
    assert model.classify(tokens).shape == (2, 3)
    (x,) = read
    torch.testing.assert_close(x[:, 0], model.cls[0].expand(2, -1))
    torch.testing.assert_close(x[:, 1:], model.tok(tokens))


def test_gradients_reach_the_gru_the_initial_state_and_the_projection():
    model = small_model("rnn", causal=True).train()
    model(torch.randint(0, 23, (3, 15))).logsumexp(-1).mean().backward()
    s = model.scheme
    for name, p in [*s.gru.named_parameters(), ("h0", s.h0), ("proj.weight", s.proj.weight)]:
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name


def test_options_and_capabilities():
    s = small_model("rnn", causal=True, hidden=10).scheme
    assert s.gru.hidden_size == 10 and s.gru.num_layers == 1 and s.proj.out_features == 32
    assert Recurrent.shift_invariant and not Recurrent.causal_only and not Recurrent.supports_memory
    assert Recurrent.overridden_hooks() == ("embed",)


@pytest.mark.parametrize("kw, error, match", [
    ({"hidden": 0}, ValueError, "hidden"), ({"hidden": 2.5}, ValueError, "hidden"), ({"hidden": True}, ValueError, "hidden"),
    ({"bidirectional": True}, ValueError, "bidirectional"), ({"bidirectional": "yes"}, TypeError, "bidirectional"),
    ({"residual": 1}, TypeError, "residual"),
])
def test_bad_options_are_named(kw, error, match):
    with pytest.raises(error, match=match):
        small_model("rnn", causal=True, **kw)


def test_the_recursion_stays_in_float32_under_autocast():
    model = small_model("rnn", causal=True)
    tokens = torch.randint(0, 23, (2, 40))
    ref = model(tokens)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model.scheme.states(model.tok(tokens)).dtype == torch.float32
        out = model(tokens)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref, rtol=0.1, atol=0.05)
