"""KERPLE and FIRE from first principles (no reference library has either): their formulas,
what they depend on, their invariances, causality, gradients, and FIRE's expressivity."""
import math

import pytest
import torch

import posenc
from posenc.alibi import alibi_bias, alibi_slopes
from posenc.learned_bias import FIRE, KERPLE, FireMLP, fire_bias, fit_fire_to_bias, kerple_bias
from posenc.scheme import PositionContext
from conftest import assert_no_causal_leak, small_model

VARIANTS = [("kerple", {"kernel": "log"}), ("kerple", {"kernel": "power"}),
            ("fire", {}), ("fire", {"shared_layers": True})]
IDS = ["kerple-log", "kerple-power", "fire", "fire-shared"]


def _ctx(scheme, positions, causal=True):
    ctx = PositionContext(positions, causal)
    ctx.tables = scheme.prepare(ctx)
    return ctx


def _kerple(kernel, n_layers=2, n_heads=3):
    return KERPLE(d_model=4 * n_heads, n_heads=n_heads, n_layers=n_layers, max_len=64, causal=True, kernel=kernel)


def _fire(n_heads=3, **kw):
    return FIRE(d_model=4 * n_heads, n_heads=n_heads, n_layers=1, max_len=64, causal=True, **kw)


# -- KERPLE ------------------------------------------------------------------------------
@pytest.mark.parametrize("kernel", ["log", "power"])
def test_kerple_kernels_equal_their_formulas_on_random_parameters(kernel):
    scheme = _kerple(kernel)
    with torch.no_grad():
        scheme.rho1.normal_(0, 2)
        scheme.rho2.normal_(0, 2)
    pos = torch.tensor([3.0, -1.5, 7.25, 0.0, 2.0])                       # gappy, unordered, float
    ctx = _ctx(scheme, pos)
    for layer in range(2):
        r1, r2 = scheme.r1[layer].tolist(), scheme.r2[layer].tolist()
        got = scheme.layer_logit_bias(ctx, layer)
        for h in range(3):
            for i in range(5):
                for j in range(5):
                    d = abs(pos[i].item() - pos[j].item())
                    want = -r1[h] * (math.log(1 + r2[h] * d) if kernel == "log" else d ** r2[h])
                    assert got[h, i, j].item() == pytest.approx(want, rel=1e-5, abs=1e-6)
        torch.testing.assert_close(scheme.layer_logit_bias(ctx, layer), kerple_bias(pos, scheme.r1[layer],
                                                                                  scheme.r2[layer], kernel))


@pytest.mark.parametrize("kernel", ["log", "power"])
def test_kerple_parameters_stay_in_their_range_and_start_where_the_papers_code_does(kernel):
    scheme = _kerple(kernel, n_layers=4, n_heads=16)
    hi1, hi2 = (2.0, 1.0) if kernel == "log" else (1.0, 2.0)              # the code's U(0, 2) and U(0, 1)
    assert (scheme.r1 >= 0.01 - 1e-6).all() and (scheme.r1 <= hi1).all()
    assert (scheme.r2 >= 0.01 - 1e-6).all() and (scheme.r2 <= hi2).all()
    for r, hi in ((scheme.r1, hi1), (scheme.r2, hi2)):          # 64 draws spread over U(0, hi), not a corner of it
        assert 0.7 * hi / 2 < r.mean() < 1.3 * hi / 2 and r.max() > 0.75 * hi   # fail by chance: < 1e-4
    with torch.no_grad():
        scheme.rho1.fill_(-80.0)
        scheme.rho2.copy_(torch.linspace(-80, 80, 64).view(4, 16))
    assert (scheme.r1 > 0).all() and (scheme.r2 > 0).all()
    if kernel == "power":
        assert (scheme.r2 <= 2).all()


@pytest.mark.parametrize("kernel", ["log", "power"])
def test_kerple_bias_depends_on_the_distance_only(kernel):
    scheme = _kerple(kernel)
    pos = torch.randint(-1000, 1000, (9,))
    bias = scheme.layer_logit_bias(_ctx(scheme, pos), 1)
    torch.testing.assert_close(bias, scheme.layer_logit_bias(_ctx(scheme, pos + 12345), 1))
    torch.testing.assert_close(bias, bias.transpose(1, 2))
    d = (pos[None] - pos[:, None]).abs()
    for a in range(9):                                                    # same |i - j| -> same bias
        for b in range(9):
            same = d == d[a, b]
            assert torch.allclose(bias[:, same], bias[:, a, b, None])


def test_kerple_has_its_own_parameters_in_each_layer():
    scheme = _kerple("log", n_layers=3)
    assert scheme.r1.shape == scheme.r2.shape == (3, 3)
    ctx = _ctx(scheme, torch.arange(6))
    assert not torch.allclose(scheme.layer_logit_bias(ctx, 0), scheme.layer_logit_bias(ctx, 1))


@pytest.mark.parametrize("kernel", ["log", "power"])
@pytest.mark.parametrize("causal", [True, False])
def test_kerple_model_is_shift_invariant(kernel, causal):
    model = small_model("kerple", causal, kernel=kernel)
    tokens = torch.randint(0, 23, (2, 12))
    for c in (1, 37, 5000):
        torch.testing.assert_close(model(tokens, torch.arange(12) + c), model(tokens), rtol=1e-5, atol=1e-5)


# -- FIRE --------------------------------------------------------------------------------
def test_fire_bias_equals_its_formula():
    """Causal entries (j <= i) are the paper's f(psi(i - j) / psi(max(L, i))); the rest its symmetric extension."""
    torch.manual_seed(1)
    mlp, c, L = torch.nn.Sequential(torch.nn.Linear(1, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)), 0.3, 5.0
    pos = torch.tensor([0, 1, 2, 4, 7, 8, 15])
    bias = fire_bias(pos, mlp, c, L)
    psi = lambda x: math.log(c * x + 1)                                   # noqa: E731
    for i, p_i in enumerate(pos.tolist()):
        for j, p_j in enumerate(pos.tolist()):
            x = psi(p_i - p_j) / psi(max(L, p_i)) if j <= i else psi(p_j - p_i) / psi(max(L, p_j))
            torch.testing.assert_close(bias[:, i, j], mlp(torch.tensor([[x]]))[0])


def test_fire_bias_names_a_bad_c_or_threshold():
    """A string c failed inside torch ("new(): invalid data type 'str'"); it is named now, as a zero one was."""
    mlp = torch.nn.Sequential(torch.nn.Linear(1, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    pos = torch.arange(6)
    for bad, kind in (("0.1", TypeError), (None, TypeError), (True, TypeError), (0.0, ValueError),
                      (-1.0, ValueError), (float("inf"), ValueError)):
        with pytest.raises(kind, match="c must be a positive"):
            fire_bias(pos, mlp, bad, 8.0)
        with pytest.raises(kind, match="threshold must be a positive"):
            fire_bias(pos, mlp, 0.3, bad)
    assert fire_bias(pos, mlp, torch.tensor(0.3), 8).shape == (2, 6, 6)


def test_fire_normaliser_depends_on_the_query_position_only_past_the_threshold():
    scheme = _fire(init_threshold=4.0)
    with torch.no_grad():
        scheme.layers[0].mlp.w1.normal_()
        scheme.layers[0].mlp.b1.normal_()
    b = scheme.layer_logit_bias(_ctx(scheme, torch.arange(20)), 0)
    torch.testing.assert_close(b[:, 2, 0], b[:, 3, 1])                    # i = 2, 3 < L: both normalised by psi(L)
    assert not torch.allclose(b[:, 10, 5], b[:, 15, 10])                  # i = 10, 15 > L: psi(10) vs psi(15)
    wide = _fire(init_threshold=64.0)
    wide.load_state_dict({**scheme.state_dict(), "layers.0.init_threshold": torch.tensor(64.0)})
    b = wide.layer_logit_bias(_ctx(wide, torch.arange(20)), 0)
    torch.testing.assert_close(b[:, 10, 5], b[:, 15, 10])                 # both below L = 64: the same


@pytest.mark.parametrize("causal", [True, False])
def test_fire_is_shift_invariant_once_the_threshold_covers_every_position(causal):
    model = small_model("fire", causal, init_threshold=4096.0)
    tokens = torch.randint(0, 23, (2, 11))
    for c in (1, 37, 1000):
        torch.testing.assert_close(model(tokens, torch.arange(11) + c), model(tokens), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_fire_is_not_shift_invariant_past_the_threshold(causal):
    assert not FIRE.shift_invariant and KERPLE.shift_invariant
    model = small_model("fire", causal, init_threshold=4.0)
    tokens = torch.randint(0, 23, (2, 11))
    assert not torch.allclose(model(tokens, torch.arange(11) + 50), model(tokens), atol=1e-4)


def test_fire_has_one_function_per_layer_unless_shared():
    per_layer, shared = small_model("fire", n_layers=3), small_model("fire", n_layers=3, shared_layers=True)
    assert len(per_layer.scheme.layers) == 3 and len(shared.scheme.layers) == 1
    ctx = per_layer.context(8, None, "cpu")
    assert not torch.allclose(per_layer.scheme.layer_logit_bias(ctx, 0), per_layer.scheme.layer_logit_bias(ctx, 2))
    ctx = shared.context(8, None, "cpu")
    assert shared.scheme.layer_logit_bias(ctx, 0) is shared.scheme.layer_logit_bias(ctx, 2)


def test_fire_mlp_keeps_its_own_initialisation_inside_a_model():
    """The model re-initialises every nn.Linear with zero biases; FIRE's MLP keeps nn.Linear's default
    U(-1, 1) hidden biases, so its ReLUs do not all bend at x = 0."""
    mlp = small_model("fire").scheme.layers[0].mlp
    assert isinstance(mlp, FireMLP) and mlp.b1.abs().max() > 0.1


# -- both --------------------------------------------------------------------------------
def test_both_schemes_are_registered_with_their_capabilities():
    for name, cls in (("kerple", KERPLE), ("fire", FIRE)):
        assert posenc.SCHEMES[name] is cls and not cls.causal_only
        assert cls.overridden_hooks() == ("prepare", "layer_logit_bias")
        assert small_model(name).scheme.custom_attention
    from posenc import functional
    assert {"kerple_bias", "fire_bias", "fit_fire_to_bias"} <= set(functional.__all__)


@pytest.mark.parametrize("name, kw", VARIANTS, ids=IDS)
def test_no_causal_leak(name, kw):
    assert_no_causal_leak(small_model(name, True, **kw))


@pytest.mark.parametrize("name, kw", VARIANTS, ids=IDS)
@pytest.mark.parametrize("causal", [True, False])
def test_gradients_reach_every_scheme_parameter(name, kw, causal):
    model = small_model(name, causal, **kw).train()
    model(torch.randint(0, 23, (2, 17))).logsumexp(-1).mean().backward()
    for pname, p in model.scheme.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("name, kw, error, match", [
    ("kerple", {"kernel": "cosine"}, ValueError, "kernel"),
    ("kerple", {"kernel": None}, ValueError, "kernel"),
    ("fire", {"hidden": 0}, ValueError, "hidden"),
    ("fire", {"hidden": 2.5}, ValueError, "hidden"),
    ("fire", {"init_c": -0.1}, ValueError, "init_c"),
    ("fire", {"init_threshold": 0}, ValueError, "init_threshold"),
    ("fire", {"init_threshold": float("inf")}, ValueError, "init_threshold"),
    ("fire", {"shared_layers": "yes"}, TypeError, "shared_layers"),
])
def test_bad_options_are_rejected_by_name(name, kw, error, match):
    with pytest.raises(error, match=match):
        small_model(name, **kw)


@pytest.mark.parametrize("call, error, match", [
    (lambda: kerple_bias(torch.arange(4), torch.ones(2), torch.ones(2), "rbf"), ValueError, "kernel"),
    (lambda: kerple_bias(torch.arange(4), -torch.ones(2), torch.ones(2)), ValueError, "r1"),
    (lambda: kerple_bias(torch.arange(4), torch.ones(2), torch.full((2,), 2.5), "power"), ValueError, "r2"),
    (lambda: kerple_bias(torch.arange(4), torch.ones(2), torch.ones(3)), ValueError, "r1 and r2"),
    (lambda: kerple_bias(torch.zeros(2, 2), torch.ones(2), torch.ones(2)), ValueError, "positions"),
    (lambda: kerple_bias(torch.tensor([True, False]), torch.ones(2), torch.ones(2)), TypeError,
     "positions must be an integer, float32 or float64 tensor"),
    (lambda: kerple_bias(torch.tensor([0.0, math.nan]), torch.ones(2), torch.ones(2)), ValueError, "positions must be finite"),
    (lambda: kerple_bias(torch.arange(4), torch.full((2,), math.inf), torch.ones(2)), ValueError, "r1"),
    (lambda: fire_bias(torch.tensor([0.0, math.inf]), FireMLP(2), 0.1, 8.0), ValueError, "positions must be finite"),
    (lambda: fire_bias(torch.arange(4), FireMLP(2), math.inf, 8.0), ValueError, "c must"),
    (lambda: fire_bias(torch.arange(4), FireMLP(2), 0.0, 8.0), ValueError, "c must"),
    (lambda: fire_bias(torch.arange(4), FireMLP(2), 0.1, -1.0), ValueError, "threshold"),
    (lambda: fire_bias(torch.arange(4), "mlp", 0.1, 8.0), TypeError, "mlp"),
    (lambda: fit_fire_to_bias([[0.0]]), TypeError, "target"),
    (lambda: fit_fire_to_bias(torch.zeros(2, 4, 5)), ValueError, "target"),
    (lambda: fit_fire_to_bias(torch.zeros(2, 4, 4), steps=-1), ValueError, "steps"),
    (lambda: fit_fire_to_bias(torch.zeros(2, 4, 4), seed=1.5), ValueError, "seed"),
])
def test_bad_arguments_of_the_functions_are_rejected_by_name(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("dtype, pos", [(torch.uint8, [0, 200, 37]), (torch.int8, [-100, 100, 3]), (torch.int16, [0, 30000, 5])])
def test_narrow_integer_positions_give_the_distances_of_int64_ones(dtype, pos):
    """|i - j| differenced in the positions' own dtype would wrap (uint8: 0 - 200 = 56)."""
    torch.manual_seed(0)
    wide, narrow = torch.tensor(pos, dtype=torch.int64), torch.tensor(pos, dtype=dtype)
    r1, r2, mlp = torch.rand(2) + 0.1, torch.rand(2) + 0.1, FireMLP(2)
    for kernel in ("log", "power"):
        torch.testing.assert_close(kerple_bias(narrow, r1, r2, kernel), kerple_bias(wide, r1, r2, kernel))
    torch.testing.assert_close(fire_bias(narrow, mlp, 0.1, 8.0), fire_bias(wide, mlp, 0.1, 8.0))


# -- FIRE's expressivity (Theorem 3.1): T5, ALiBi and KERPLE as one FIRE layer -------------------
N, HEADS = 64, 4


@pytest.fixture
def one_thread():
    """The fit is many small tensor operations: threads only add overhead (and stall on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _t5_bias() -> torch.Tensor:
    """A causal T5 bias at n = 64: 27 buckets, each an independent N(0, 1) value per head."""
    t5 = posenc.SCHEMES["t5"](d_model=4 * HEADS, n_heads=HEADS, n_layers=1, max_len=N, causal=True)
    ctx = _ctx(t5, torch.arange(N))
    return t5.logit_bias(ctx).detach()


def _targets():
    g = torch.Generator().manual_seed(0)
    r1, r2 = 0.5 + 1.5 * torch.rand(HEADS, generator=g), 0.05 + 0.95 * torch.rand(HEADS, generator=g)
    return {"alibi": lambda: alibi_bias(torch.arange(N), alibi_slopes(HEADS)),
            "kerple-log": lambda: kerple_bias(torch.arange(N), r1, r2, "log"),
            "t5": _t5_bias}


@pytest.mark.parametrize("name, hidden, bound", [("alibi", 32, 0.01), ("kerple-log", 32, 0.01), ("t5", 64, 0.01)])
def test_one_fire_layer_fits_alibi_kerple_and_t5(one_thread, name, hidden, bound):
    """ALiBi and KERPLE are smooth in x = psi(i - j) / psi(L): the paper's width 32 fits them to < 1%
    (measured, seeds 0-2: at most 0.04%). T5's bias has one free value per bucket (16 single-distance
    buckets, then 11 log-spaced ones at n = 64); a width-h MLP is piecewise linear in x with h kinks,
    which at h = 32 leaves 34-45% (a greedy choice of the kinks: 21%); at h = 64 >= n - 1 any function
    of the distance is within reach, and the fit finds it (measured: at most 0.04%)."""
    target = _targets()[name]()
    scheme, err = fit_fire_to_bias(target, seed=0, hidden=hidden)
    assert err < bound
    fitted = scheme.layer_logit_bias(_ctx(scheme, torch.arange(N)), 0).detach()
    rows, cols = torch.tril_indices(N, N)
    recomputed = (fitted - target)[:, rows, cols].norm() / target[:, rows, cols].norm()
    assert recomputed.item() == pytest.approx(err, rel=1e-3, abs=1e-5)  # the scheme holds what was reported


def test_fire_thresholds_script_reads_each_layers_learned_tau():
    """scripts/fire_thresholds.py reads tau = init_threshold * exp(log_scale) from a state dict, layer by layer:
    the names it relies on are the scheme's, and a moved threshold is read where the model reads it."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parent.parent / "scripts" / "fire_thresholds.py"
    spec = importlib.util.spec_from_file_location("fire_thresholds", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    model = posenc.build_model("fire", 20, d_model=16, n_heads=2, n_layers=2, causal=True, init_threshold=512.0)
    with torch.no_grad():
        model.scheme.layers[0].log_scale.fill_(math.log(73.4 / 512))
        model.scheme.layers[1].log_scale.fill_(math.log(0.125))
    got = script.thresholds(model.state_dict())
    assert got == pytest.approx([73.4, 64.0], rel=1e-5)
    assert got == pytest.approx([float(layer.threshold) for layer in model.scheme.layers], rel=1e-6)
