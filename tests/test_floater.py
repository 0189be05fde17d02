"""FLOATER (posenc.floater): positions from an ODE, injected before every block."""
import pytest
import torch

import posenc
from posenc.absolute import sinusoidal_table
from posenc.floater import Floater, sinusoidal_dynamics, solve_positions
from conftest import small_model


@pytest.mark.parametrize("delta", [1.0, 0.1])
def test_sinusoidal_table_is_a_particular_solution(delta):
    """dp/dt = A p, A = blockdiag([[0, w_i], [-w_i, 0]])/delta, p(0) = (0,1,0,1,...) gives PE(i) at t = delta*i."""
    h, p0 = sinusoidal_dynamics(16, delta=delta)
    sol = solve_positions(h, p0, torch.arange(40), delta=delta, method="dopri5", rtol=1e-7, atol=1e-8)
    torch.testing.assert_close(sol, sinusoidal_table(40, 16), rtol=0, atol=1e-4)


def test_solution_handles_unsorted_repeated_and_fractional_positions():
    h, p0 = sinusoidal_dynamics(8)
    pos = torch.tensor([5.0, 2.0, 5.0, 0.0, 3.5])
    sol = solve_positions(h, p0, pos, delta=1.0, method="dopri5", rtol=1e-7, atol=1e-8)
    torch.testing.assert_close(sol, posenc.absolute.sinusoidal_at(pos, 8), rtol=0, atol=1e-4)


def test_rk4_default_is_close_to_adaptive_solver():
    model = small_model("floater")
    pos = torch.arange(30)
    a = model.scheme.solve(pos)
    model.scheme.method = "dopri5"
    torch.testing.assert_close(a, model.scheme.solve(pos), rtol=1e-3, atol=1e-4)


def test_positions_enter_before_every_block():
    model = small_model("floater", n_layers=3)
    ctx = model.context(7, None, "cpu")
    table = ctx.tables["floater"]
    assert table.shape == (3, 7, 32)
    x = torch.randn(2, 7, 32)
    for layer in range(3):
        torch.testing.assert_close(model.scheme.layer_input(x, ctx, layer), x + table[layer])
    assert not torch.allclose(table[0], table[1])                            # own initial value per block


def test_cache_gives_identical_outputs_and_is_dropped_by_training():
    model = small_model("floater")
    tokens = torch.randint(0, 23, (2, 20))
    ref = model(tokens)
    model.scheme.cache(64)
    assert model.scheme.cached.shape == (2, 64, 32)
    torch.testing.assert_close(model(tokens), ref, rtol=1e-5, atol=1e-5)
    model.train()
    assert model.scheme.cached.shape[1] == 0


def test_the_cache_is_never_served_for_other_weights():
    """A cached table is used only while the parameters it was solved from are unchanged: loading another
    model's weights (as evaluating several seeds with one model does) or editing one in place solves again."""
    torch.manual_seed(0)
    model, other = small_model("floater"), small_model("floater")
    tokens = torch.randint(0, 23, (2, 20))
    model.scheme.cache(64)
    hit = model(tokens)
    torch.testing.assert_close(model(tokens), hit)                     # same weights: the cache serves
    model.load_state_dict(other.state_dict())
    torch.testing.assert_close(model(tokens), other(tokens), rtol=1e-5, atol=1e-5)
    model.scheme.cache(64)
    before = model(tokens)
    with torch.no_grad():
        model.scheme.p0.add_(0.5)
    assert not torch.allclose(model(tokens), before)


def test_the_cache_moves_with_the_model_and_works_in_inference_mode(monkeypatch):
    """The table is a buffer: `.double()` (or `.to()`) converts it with the parameters, and the forward after
    still indexes it instead of solving again. Tensors made under inference_mode keep no version counter;
    the cache works there too."""
    model = small_model("floater")
    model.scheme.cache(64)
    solves = []
    real = model.scheme.solve
    monkeypatch.setattr(model.scheme, "solve", lambda *a, **k: solves.append(1) or real(*a, **k))
    model.double()
    model(torch.randint(0, 23, (2, 20)))
    assert solves == [] and model.scheme.cached.dtype == torch.float64
    with torch.inference_mode():
        fresh = small_model("floater")
        fresh.scheme.cache(64)
        assert fresh(torch.randint(0, 23, (2, 20))).shape == (2, 20, 23)


def test_adjoint_gradients_match_direct_backprop():
    torch.manual_seed(0)
    s = Floater(d_model=8, n_heads=2, n_layers=2, max_len=16, causal=True, method="dopri5")
    pos = torch.arange(6)
    s.solve(pos).square().sum().backward()
    direct = [p.grad.clone() for p in s.parameters()]
    s.zero_grad()
    s.adjoint = True
    s.solve(pos).square().sum().backward()
    for g, p in zip(direct, s.parameters()):
        torch.testing.assert_close(p.grad, g, rtol=1e-3, atol=1e-5)


def test_floater_extrapolates_without_error_but_rejects_negative_positions():
    model = small_model("floater", max_len=8)
    assert model(torch.randint(0, 23, (1, 40))).shape == (1, 40, 23)
    with pytest.raises(ValueError, match="positions"):
        model(torch.randint(0, 23, (1, 5)), torch.arange(5) - 3)


def test_positions_past_max_position_are_refused_before_the_solve(monkeypatch):
    """The solve runs from t = 0 whatever the offset, so far positions are refused by name, not solved for
    minutes; up to the limit (and with None) they are solved."""
    model = small_model("floater", max_position=50)
    tokens = torch.randint(0, 23, (1, 5))
    assert model(tokens, torch.arange(46, 51)).shape == (1, 5, 23)           # up to max_position itself
    import posenc.schemes.floater as floater
    monkeypatch.setattr(floater, "solve_positions", lambda *a, **k: pytest.fail("solved past the limit"))
    for positions in (torch.arange(47, 52), torch.tensor([0.0, 50.5, 3.0])):
        with pytest.raises(ValueError, match="max_position=50"):
            model(tokens[:, :len(positions)], positions)
    with pytest.raises(ValueError, match="max_position=50"):
        model.scheme.cache(60)                                              # positions 0..59
    monkeypatch.undo()
    model.scheme.max_position = None
    assert model(tokens, torch.arange(60, 65)).shape == (1, 5, 23)
    for bad in (0, -3, 2.5, True, "65536"):
        with pytest.raises(ValueError, match="max_position"):
            small_model("floater", max_position=bad)


def test_bad_delta_is_rejected():
    with pytest.raises(ValueError, match="delta"):
        small_model("floater", delta=0.0)


@pytest.mark.parametrize("positions", [torch.arange(40), torch.arange(5, 22), torch.tensor([3]),
                                       torch.tensor([7, 2, 2, 9, 0]), torch.tensor([0.5, 3.25, 1.0, 7.9])])
@pytest.mark.parametrize("delta", [0.1, 0.37, 1.0])
def test_the_host_grid_rk4_gives_torchdiffeqs_numbers_and_gradients_exactly(positions, delta):
    """posenc's RK4 keeps the time grid on the host (no wait for a GPU); on the CPU it is torchdiffeq, bit for bit."""
    from torchdiffeq import odeint
    from posenc.floater import MLPDynamics
    h, p0 = MLPDynamics(16, 16), torch.randn(3, 16, requires_grad=True)
    t = positions.to(torch.float32) * delta
    grid, index = torch.unique(torch.cat([t.new_zeros(1), t]), sorted=True, return_inverse=True)
    ref = odeint(h, p0, grid, method="rk4", options={"step_size": delta})[index[1:]].movedim(0, -2)
    ours = solve_positions(h, p0, positions, delta=delta)
    assert torch.equal(ours, ref)
    params = [p0, *h.parameters()]
    for a, b in zip(torch.autograd.grad(ours.square().sum(), params), torch.autograd.grad(ref.square().sum(), params)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("scheme_kwargs", [{}, {"method": "dopri5"}])
def test_the_host_solve_gives_the_device_solves_numbers_and_gradients(scheme_kwargs):
    """solve_on="host" solves with CPU copies of h's parameters and p0 (on a GPU, the copies cross devices):
    the same solution, and gradients that reach the parameters themselves, equal to a direct solve's."""
    pos = torch.tensor([3, 0, 7, 7, 12])
    torch.manual_seed(0)
    direct = small_model("floater", **scheme_kwargs).scheme
    torch.manual_seed(0)
    host = small_model("floater", solve_on="host", **scheme_kwargs).scheme
    a, b = direct.solve(pos, pos), host.solve_on_host(pos)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    (a * torch.randn_like(a, generator=torch.Generator().manual_seed(1))).sum().backward()
    (b * torch.randn_like(b, generator=torch.Generator().manual_seed(1))).sum().backward()
    for (name, p), q in zip(direct.named_parameters(), host.parameters()):
        assert q.grad is not None and torch.equal(p.grad, q.grad), name


def test_solve_on_is_checked():
    with pytest.raises(ValueError, match="solve_on must be 'device' or 'host'; got 'gpu'"):
        small_model("floater", solve_on="gpu")
    with pytest.raises(ValueError, match="solve_on='host' needs adjoint=False"):
        small_model("floater", solve_on="host", adjoint=True)


def test_every_full_floater_run_solves_on_the_host_and_no_ci_run_does():
    from posenc.runs.plans import FULL_MODEL_OPTIONS, names, plan
    assert FULL_MODEL_OPTIONS == {"floater": {"solve_on": "host"}}
    full = [s for n in names() for _, s in plan(n, "full") if s.scheme == "floater"]
    ci = [s for n in names() for _, s in plan(n, "ci") if s.scheme == "floater"]
    assert full and all(s.model["solve_on"] == "host" for s in full)
    assert ci and not any("solve_on" in s.model for s in ci)
