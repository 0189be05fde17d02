"""FLOATER: positions as the solution of an ODE (Liu et al. 2020, ICML; their eq. 5-6).

    p(t) = p(0) + int_0^t h(tau, p(tau); theta) dtau,     t_i = delta * i,

with h a small neural network, solved with torchdiffeq at the token positions and
added before every block: x^(n)_i -> x^(n)_i + p^(n)(t_i) (hook `layer_input`).

Our choices: one dynamics h shared by all blocks, each block n with its own learned
initial value p^(n)(0), so one ODE solve of a [n_layers, d] state serves the whole
model; fixed-step RK4 with one step per position (`step_size = delta`) by default, written
here with its time grid on the host (`rk4_on_host_grid`: torchdiffeq's numbers, bit for bit on
the CPU, without torchdiffeq's two waits for the GPU per step); `method="dopri5"` for an
adaptive solver, `adjoint=True` for O(1)-memory gradients (both torchdiffeq).

The sinusoidal table is one solution (`sinusoidal_dynamics`): a linear h(t, p) = A p
with A block-diagonal [[0, w_i], [-w_i, 0]] / delta and p(0) = (0, 1, 0, 1, ...)
gives p(t_i) = PE(i) exactly.

Cost: the solve is sequential in t; at inference a trained FLOATER is cached once
(`cache(num_positions)`) and then is a table lookup like any absolute encoding.
The host-side time grid also means `torch.compile(model, fullgraph=True)` refuses a FLOATER
model; `torch.compile(model)` compiles it with graph breaks around the solve.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor, nn

from .absolute import TOKEN_INIT_STD, sinusoidal_angles
from ..host import to_device
from ..scheme import register
from ..scheme import PositionContext, Scheme, stamp


def odeint(*args, **kwargs):
    """torchdiffeq's `odeint`, imported when first called: torchdiffeq loads scipy, a second at start-up
    that a process training no adaptive FLOATER never needs."""
    from torchdiffeq import odeint as solve
    return solve(*args, **kwargs)


def odeint_adjoint(*args, **kwargs):
    """torchdiffeq's `odeint_adjoint` (O(1)-memory gradients), imported when first called, as `odeint`."""
    from torchdiffeq import odeint_adjoint as solve
    return solve(*args, **kwargs)


#: torchdiffeq's solvers (the keys of `torchdiffeq._impl.odeint.SOLVERS`; written out so that building a model
#: does not import torchdiffeq, and checked against it by the tests).
SOLVERS = ("adaptive_heun", "bosh3", "dopri5", "dopri8", "euler", "explicit_adams", "fehlberg2", "fixed_adams",
           "heun2", "heun3", "implicit_adams", "midpoint", "rk4", "scipy_solver")
FIXED_STEP = ("rk4", "euler", "midpoint", "explicit_adams", "implicit_adams")


class MLPDynamics(nn.Module):
    """h(t, p) = W_2 tanh(W_1 p + t u + b_1) + b_2, init N(0, 0.02) (a small 1-hidden-layer net)."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.inp, self.out = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.time = nn.Parameter(torch.randn(hidden) * TOKEN_INIT_STD)
        for lin in (self.inp, self.out):
            nn.init.normal_(lin.weight, std=TOKEN_INIT_STD)
            nn.init.zeros_(lin.bias)

    def forward(self, t: Tensor, p: Tensor) -> Tensor:
        return self.out(torch.tanh(self.inp(p) + t * self.time))                     # (..., dim)


#: h(t, p), the right-hand side dp/dt: an nn.Module (which `adjoint=True` needs) or any function of (t, p).
Dynamics = Callable[[Tensor, Tensor], Tensor]


class LinearDynamics(nn.Module):
    """h(t, p) = A p for a fixed matrix A [dim, dim]."""

    matrix: Tensor                                      # A, a buffer

    def __init__(self, matrix: Tensor):
        super().__init__()
        self.register_buffer("matrix", matrix, persistent=False)

    def forward(self, t: Tensor, p: Tensor) -> Tensor:
        return p @ self.matrix.T


def sinusoidal_dynamics(dim: int, base: float = 10000.0, delta: float = 1.0) -> tuple[LinearDynamics, Tensor]:
    """(h, p0) whose solution at t = delta * i is the sinusoidal PE(i), interleaved layout.

    d/dt (sin(w t/delta), cos(w t/delta)) = (w/delta) (cos, -sin): A = blockdiag([[0, w_i], [-w_i, 0]]) / delta.
    """
    w = sinusoidal_angles(torch.ones(1), dim, base)[0].float() / delta             # (dim/2,)
    zero = torch.zeros_like(w)
    blocks = torch.stack([torch.stack([zero, w], -1), torch.stack([-w, zero], -1)], -2)  # (dim/2, 2, 2)
    p0 = torch.stack([zero, torch.ones_like(w)], -1).flatten()                       # (dim,) = (0, 1, 0, 1, ...)
    return LinearDynamics(torch.block_diag(*blocks)), p0


def rk4_on_host_grid(func: Dynamics, p0: Tensor, times: Tensor,
                     delta: float) -> Tensor:
    """p(t) at the increasing times [K] (a CPU tensor, times[0] = 0),
    from p(0) = p0: [K, ..., d].

    RK4 (the 3/8 rule) with step delta from 0,
    linear interpolation between steps:

        k1 = h(t, y),
        k2 = h(t + dt/3, y + dt k1/3),
        k3 = h(t + 2dt/3, y + dt (k2 - k1/3)),
        k4 = h(t + dt, y + dt (k1 - k2 + k3)),
        y(t + dt) = y + dt (k1 + 3 (k2 + k3) + k4) / 8

    This is torchdiffeq's
    `odeint(func, p0, times, method="rk4", options={"step_size": delta})`
    operation for operation (the same numbers on the CPU), except that the
    time grid and its comparisons stay on the host: torchdiffeq moves them to
    p0's device and compares them in Python at every step, which on a GPU
    waits for it twice per step.
    """
    niters = int(torch.ceil((times[-1] - times[0]) / delta + 1))
    # torchdiffeq's grid
    grid = torch.arange(0, niters, dtype=times.dtype) * delta + times[0]
    grid[-1] = times[-1]
    solution: list[Tensor] | Tensor
    # under torch.func.vmap: stacked, never written in place
    if torch._C._functorch.is_functorch_wrapped_tensor(p0):
        solution = [p0]
    else:  # torchdiffeq's way (and its gradients, bit for bit)
        solution = torch.empty(len(times), *p0.shape, dtype=p0.dtype,
                               device=p0.device)
        solution[0] = p0
    j, y0 = 1, p0
    for t0, t1 in zip(grid[:-1], grid[1:]):
        dt = t1 - t0
        k1 = func(t0, y0)
        k2 = func(t0 + dt * (1 / 3), y0 + dt * k1 * (1 / 3))
        k3 = func(t0 + dt * (2 / 3), y0 + dt * (k2 - k1 * (1 / 3)))
        k4 = func(t1, y0 + dt * (k1 - k2 + k3))
        y1 = y0 + (k1 + 3 * (k2 + k3) + k4) * dt * 0.125
        while j < len(times) and t1 >= times[j]:  # host tensors: no wait
            row = (y1 if times[j] == t1
                   else y0 + (times[j] - t0) / (t1 - t0) * (y1 - y0))
            if isinstance(solution, list):
                solution.append(row)
            else:
                solution[j] = row
            j += 1
        y0 = y1
    return torch.stack(solution) if isinstance(solution, list) else solution


def host_grid(positions: Tensor, delta: float) -> tuple[Tensor, Tensor]:
    """(the sorted distinct times 0, delta * positions [K], each position's row in them [T]) of CPU
    positions; ValueError for a negative one."""
    if positions.numel() and positions.min() < 0:
        raise ValueError(f"positions must be >= 0 (the ODE starts at t=0); got min {float(positions.min())}")
    t = positions.to(torch.float32) * delta                                               # (T,)
    times, index = torch.unique(torch.cat([t.new_zeros(1), t]), sorted=True, return_inverse=True)
    return times, index[1:]


def solve_positions(func: Dynamics, p0: Tensor, positions: Tensor, *,
                    delta: float, method: str = "rk4",
                    rtol: float = 1e-5, atol: float = 1e-6,
                    adjoint: bool = False,
                    host_positions: Tensor | None = None) -> Tensor:
    """p(delta * positions) for initial states p0 [..., d] at t=0:
    [..., seq, d].

    The ODE is integrated once over the sorted unique times (t = 0
    prepended); positions may repeat, be unsorted, or be fractional, but not
    negative. With RK4, positions on the CPU (or their CPU copy
    `host_positions`) are solved on a host grid (`rk4_on_host_grid`): the
    same numbers, and nothing read from the device.
    """
    if positions.dim() != 1:
        raise ValueError(f"positions must be 1-D; "
                         f"got shape {tuple(positions.shape)}")
    host = positions if positions.device.type == "cpu" else host_positions
    if host is not None and method == "rk4" and not adjoint and host.numel():
        times, index = host_grid(host, delta)
        traj = rk4_on_host_grid(func, p0, times, delta)         # (K, ..., d)
        # (..., T, d)
        return traj[to_device(index, p0.device)].movedim(0, -2)
    if positions.numel() and positions.min() < 0:
        raise ValueError(f"positions must be >= 0 (the ODE starts at t=0); "
                         f"got min {float(positions.min())}")
    t = positions.to(p0.device, torch.float32) * delta                # (T,)
    grid, index = torch.unique(torch.cat([t.new_zeros(1), t]), sorted=True,
                               return_inverse=True)
    options = {"step_size": delta} if method in FIXED_STEP else None
    solver = odeint_adjoint if adjoint else odeint
    # (K, ..., d)
    traj = solver(func, p0, grid, method=method, rtol=rtol, atol=atol,
                  options=options)
    return traj[index[1:]].movedim(0, -2)                       # (..., T, d)


def _check_positive_int_or_none(name: str, value, *, none_means: str) -> None:
    """Raise a ValueError naming `name` unless `value` is None or an int >= 1
    (not a bool); `none_means` says what None stands for."""
    if value is not None and (isinstance(value, bool)
                              or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be a positive int or None "
                         f"({none_means}); got {value!r}")


@register("floater")
class Floater(Scheme):
    """x^(n)_i + p^(n)(delta * i) before every block n; p^(n) solves
    dp/dt = h(t, p) from a learned p^(n)(0).

    Args:
        delta: time between neighbouring positions.
        hidden: width of h's hidden layer (default d_model).
        method: "rk4" (fixed step = delta; `rk4_on_host_grid`, torchdiffeq's
            numbers with the time grid kept on the host) or any other
            torchdiffeq solver ("dopri5", ...).
        adjoint: backpropagate with the adjoint method (memory O(1) in the
            steps).
        dynamics: replace h by any module f(t, p)
            (e.g. `sinusoidal_dynamics`).
        solve_on: "device" (where the parameters are) or "host": with the
            parameters on a GPU, solve on the CPU with differentiable copies
            of them, and send the solution over. The solve is T sequential
            steps of a [n_layers, d] state, hundreds of tiny kernels per
            training step: on an H200 shared by ten workers that cost about
            0.55 s a step at T = 128, on one CPU core about 0.1 s. In float32
            (autocast does not reach the CPU). Not with `adjoint`.
        max_position: the largest position a forward may ask for, or None
            for no limit. The ODE is integrated from t = 0, so positions up
            to P cost about P sequential solver steps (RK4: one per
            position, about 0.3 ms each on a CPU core at d = 128): an offset
            of a million is five minutes a forward. Beyond it a forward
            raises a ValueError instead of starting that solve.
    """

    # solve_on="host" copies the solution over every step;
    # the solve's cache is replaced
    graph_safe = False

    def __init__(self, *, delta: float = 0.1, hidden: int | None = None,
                 method: str = "rk4", adjoint: bool = False,
                 dynamics: nn.Module | None = None, solve_on: str = "device",
                 max_position: int | None = 65536, **kw):
        super().__init__(**kw)
        if solve_on not in ("device", "host"):
            raise ValueError(f"solve_on must be 'device' or 'host'; "
                             f"got {solve_on!r}")
        # "yes" would be truthy, and so would "no"
        if not isinstance(adjoint, bool):
            raise TypeError(f"adjoint must be True or False; got {adjoint!r}")
        if solve_on == "host" and adjoint:
            raise ValueError(
                "solve_on='host' needs adjoint=False "
                "(the adjoint solver integrates the module itself)")
        self.solve_on = solve_on
        if (isinstance(delta, bool) or not isinstance(delta, (int, float))
                or not 0 < delta < math.inf):
            raise ValueError(f"delta must be a finite number > 0; "
                             f"got {delta!r}")
        _check_positive_int_or_none("hidden", hidden, none_means="d_model")
        if method not in SOLVERS:
            raise ValueError(f"method must be one of torchdiffeq's solvers "
                             f"{SOLVERS}; got {method!r}")
        _check_positive_int_or_none("max_position", max_position,
                                    none_means="no limit")
        self.delta, self.method, self.adjoint, self.max_position = (
            delta, method, adjoint, max_position)
        self.dynamics = (
            dynamics if dynamics is not None
            else MLPDynamics(self.d_model, hidden or self.d_model))
        self.p0 = nn.Parameter(torch.randn(self.n_layers, self.d_model)
                               * TOKEN_INIT_STD)                     # (N, D)
        self.register_buffer("cached",
                             torch.empty(self.n_layers, 0, self.d_model),
                             persistent=False)

    def solve(self, positions: Tensor,
              host_positions: Tensor | None = None) -> Tensor:
        """p^(n)(delta * positions) for every block: [n_layers, seq, d_model]
        (`host_positions`: their CPU copy).

        Not checked against `max_position` (the forward checks the positions'
        extent, which it reads on the host, before it calls this; so does
        `cache`)."""
        if self.solve_on == "host" and self.p0.device.type != "cpu":
            return self.solve_on_host(
                positions if host_positions is None else host_positions
            ).to(self.p0.device, non_blocking=True)
        return solve_positions(self.dynamics, self.p0, positions,
                               delta=self.delta, method=self.method,
                               adjoint=self.adjoint,
                               host_positions=host_positions)

    def solve_on_host(self, positions: Tensor) -> Tensor:
        """`solve` on the CPU with differentiable CPU copies of h's parameters
        and p0, whichever device they are on: the gradients flow back to them
        through the copies. [n_layers, seq, d_model] on the CPU."""
        from torch.func import functional_call
        state = ({n: p.to("cpu") for n, p in self.dynamics.named_parameters()},
                 {n: b.to("cpu") for n, b in self.dynamics.named_buffers()})
        positions = positions.to("cpu")
        return solve_positions(
            lambda t, p: functional_call(self.dynamics, state, (t, p)),
            self.p0.to("cpu"), positions, delta=self.delta,
            method=self.method, host_positions=positions)

    def _check_reach(self, largest: float) -> None:
        """ValueError if the solve would integrate past `max_position` (it
        starts at t = 0 whatever the offset)."""
        if self.max_position is not None and largest > self.max_position:
            raise ValueError(
                f"positions reach {largest:.10g}, beyond FLOATER's "
                f"max_position={self.max_position}: the ODE is integrated "
                f"from t = 0, one solver step per position (RK4), "
                f"{largest:.3g} sequential steps a forward. "
                f"Pass smaller positions, or build the scheme with a larger "
                f"max_position (None for no limit).")

    @torch.no_grad()
    def cache(self, num_positions: int) -> Tensor:
        """Solve once for positions 0..num_positions-1; eval-mode forwards
        then only index the table."""
        if not isinstance(num_positions, int) or num_positions < 1:
            raise ValueError(f"num_positions must be a positive int; "
                             f"got {num_positions!r}")
        self._check_reach(num_positions - 1)
        self.cached = self.solve(
            torch.arange(num_positions, device=self.p0.device),
            torch.arange(num_positions))
        self._cached_for = self._parameters_stamp()
        return self.cached

    def _parameters_stamp(self) -> tuple:
        """Which parameter values the cache was solved from: every
        parameter's storage and in-place version (`load_state_dict`, an
        optimizer step or any in-place edit bumps it)."""
        return tuple(stamp(p) for p in self.parameters())

    def _apply(self, fn, *args, **kwargs):
        """`.to()`, `.double()`, `.cuda()`: the cached table is a buffer and
        moves with the parameters, so a cache that was fresh before stays
        fresh (the new tensors are stamped)."""
        fresh = getattr(self, "_cached_for", None) == self._parameters_stamp()
        out = super()._apply(fn, *args, **kwargs)
        if fresh:
            self._cached_for = self._parameters_stamp()
        return out

    def train(self, mode: bool = True):
        # parameters are about to change: a cached table would go stale
        if mode:
            self.cached = self.cached[:, :0]
        return super().train(mode)

    def prepare(self, ctx: PositionContext) -> dict:
        pos, minmax = ctx.positions, ctx.minmax()
        if minmax is not None:
            self._check_reach(minmax[1])
        hit = (not self.training and not pos.is_floating_point()
               and minmax is not None
               and 0 <= minmax[0] and minmax[1] < self.cached.shape[1]
               and getattr(self, "_cached_for", None)
                   == self._parameters_stamp())                # not stale
        # (N, T, D)
        return {"floater": self.cached[:, pos] if hit
                else self.solve(pos, ctx.positions_on_host())}

    def layer_input(self, x: Tensor, ctx: PositionContext,
                    layer: int) -> Tensor:
        return x + ctx.tables["floater"][layer].to(x.dtype)         # (B, T, D)
