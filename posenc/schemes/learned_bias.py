"""Learned logit biases, one set per layer (hook 3b): KERPLE and FIRE.

KERPLE (Chi, Fan, Ramadge and Rudnicky, NeurIPS 2022, section 4) adds a conditionally
positive definite (CPD) kernel of the distance to the scaled logits; a CPD kernel plus a
constant is positive definite, and the constant cancels in the softmax. Its two variants,
with one (r1, r2) per head and per layer (the paper's Figure 1 draws them shared by the
layers; here, as for FIRE, every layer has its own),

    power:  b_ij = -r1 |i - j|^r2,            r1 > 0, 0 < r2 <= 2,
    log:    b_ij = -r1 log(1 + r2 |i - j|),   r1, r2 > 0.

The paper's code keeps (r1, r2) in range by clamping the raw values in place (at 1e-2, and
r2 <= 2 for the power variant); here they are smooth functions of free parameters,
r1 = softplus(rho1) and r2 = softplus(rho2) (log) or 2 sigmoid(rho2) (power), so they never
leave the range and their gradients never vanish at a clamp. Initial values are the code's:
r1 ~ U(0, 2), r2 ~ U(0, 1) (log); r1 ~ U(0, 1), r2 ~ U(0, 2) (power), kept 1e-2 from the ends.
The bias depends on |i - j| alone, so KERPLE is exactly shift-invariant.

FIRE (Li et al., ICLR 2024, section 3) learns the function of the distance instead, with a
log transform psi and *progressive interpolation*: the distance is divided by the query's
position, floored at a learned threshold tau (the paper's L),

    b_ij = f_theta( psi(i - j) / psi(max(tau, i)) ),    psi(x) = log(c x + 1),     (j <= i)

with f_theta: R -> R^heads an MLP (1 -> 32 -> heads, ReLU) and c > 0, tau > 0 learned, one
(f_theta, c, tau) per layer (or one for all: `shared_layers=True`). As in the paper's code,
c starts at 0.1 and tau at 512 (the paper trains on 2048 tokens; pass `init_threshold`, e.g.
a quarter of the training length, for other lengths); here c = exp(gamma) and
tau = tau0 exp(lambda), positive by construction (the code takes |c x| and |m tau0|). Choice
made here for bidirectional attention, where the paper defines only j <= i:

    b_ij = f_theta( psi(|i - j|) / psi(max(tau, i, j)) ),

which is the paper's formula wherever j <= i (then max(i, j) = i), is symmetric in (i, j),
and keeps the MLP's input in [0, 1] for non-negative positions, as in the causal case.
FIRE is therefore defined for both kinds of model (`causal_only = False`). It is *not*
shift-invariant: the normaliser moves with the query position. Once tau covers every
position, max(tau, i, j) = tau and the bias depends on |i - j| alone; shifting positions that all
stay below tau changes nothing.

`fit_fire_to_bias` checks the paper's Theorem 3.1 (FIRE can represent T5's bias, ALiBi and
KERPLE) numerically: it fits one FIRE layer to a given causal bias by least squares.

The MLP holds its weights as plain parameters, initialised as PyTorch's `nn.Linear` (the
paper's code): the model's N(0, 0.02) re-initialisation of every `nn.Linear` would zero the
hidden biases, which puts every ReLU's kink at x = 0 and leaves f_theta linear on [0, 1].
"""
from __future__ import annotations

import math
from typing import Callable, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..scheme import register
from ..scheme import PositionContext, Scheme, check_positions

KERNELS = ("log", "power")
_EPS = 1e-2  # the paper's code: parameters kept this far from the ends of their range at init


# -- functional core ------------------------------------------------------------------
def _distance(positions: Tensor) -> Tensor:
    """|j - i| as float32 [T, T], differenced in float64 for float positions (exact below 2^24) and in
    int64 for integer ones (a narrow dtype would wrap: uint8 200 - 0 - 200 is 56)."""
    pos = positions.to(torch.float64) if positions.is_floating_point() else positions.long()
    return (pos[None, :] - pos[:, None]).abs().float()


def _span(positions: Tensor) -> Tensor:
    """max(i, j) as float32 [T, T]: the position FIRE normalises by (the query's, when j <= i)."""
    pos = positions.float()
    return torch.maximum(pos[None, :], pos[:, None])


def _kerple(distance: Tensor, r1: Tensor, r2: Tensor, kernel: str) -> Tensor:
    """The kernel on a [T, T] distance with r1, r2 [H]: [H, T, T] (no checks, no host sync)."""
    r1, r2 = r1[:, None, None], r2[:, None, None]
    if kernel == "log":
        return -r1 * torch.log1p(r2 * distance)
    nonzero = distance > 0                                  # d^r2 with a finite gradient in r2 at d = 0
    return -r1 * torch.where(nonzero, torch.where(nonzero, distance, 1.0) ** r2, 0.0)


def kerple_bias(positions: Tensor, r1: Tensor, r2: Tensor, kernel: str = "log") -> Tensor:
    """KERPLE's bias [heads, seq, seq] for 1-D `positions`, with r1, r2 [heads] (section 4)::

        log:    -r1 log(1 + r2 |i - j|)
        power:  -r1 |i - j|^r2          (r1, r2 > 0; r2 <= 2 for power)

    Returns float32 whatever r1's dtype: attention adds it to q k^T in q's dtype (`posenc.attention`).
    """
    _check_kernel(kernel)
    check_positions(positions)                  # int8 or uint8 would wrap when differenced: see _distance
    r1, r2 = (torch.as_tensor(r, dtype=torch.float32, device=positions.device) for r in (r1, r2))
    if r1.dim() != 1 or r1.shape != r2.shape:
        raise ValueError(f"r1 and r2 must be 1-D tensors [heads] of one shape; "
                         f"got {tuple(r1.shape)} and {tuple(r2.shape)}")
    if not bool((r1 > 0).all()) or not bool(torch.isfinite(r1).all()):
        raise ValueError("r1 must be positive and finite")
    if not bool((r2 > 0).all()) or not bool(torch.isfinite(r2).all()) or (kernel == "power" and not bool((r2 <= 2).all())):
        raise ValueError(f"r2 must be in {'(0, 2]' if kernel == 'power' else '(0, inf)'} for the {kernel} kernel")
    return _kerple(_distance(positions), r1, r2, kernel)


def _fire_input(distance: Tensor, span: Tensor, c: Tensor, threshold: Tensor) -> Tensor:
    """The MLP's input psi(d) / psi(max(tau, span)), psi(x) = log(1 + c x): same shape as `distance`."""
    return torch.log1p(c * distance) / torch.log1p(c * torch.maximum(span, threshold))


def _fire(distance: Tensor, span: Tensor, mlp, c: Tensor, threshold: Tensor) -> Tensor:
    """f(psi(d) / psi(max(tau, span))) as [H, T, T]: `mlp` maps [..., 1] -> [..., H]. The input is formed in
    float32 at least and given to the MLP in its parameters' dtype (a model cast to bf16 has a bf16 MLP)."""
    x = _fire_input(distance, span, c.float(), threshold.float())[..., None]          # (T, T, 1)
    weight = next(mlp.parameters(), None) if isinstance(mlp, nn.Module) else None
    return mlp(x if weight is None else x.to(weight.dtype)).permute(2, 0, 1)


def fire_bias(positions: Tensor, mlp: Callable[[Tensor], Tensor], c: float | Tensor,
              threshold: float | Tensor) -> Tensor:
    """FIRE's bias [heads, seq, seq] (section 3):
    `f(psi(|i - j|) / psi(max(tau, i, j)))`, `psi(x) = log(c x + 1)`.

    `mlp` maps [..., 1] -> [..., heads] (e.g.
    `nn.Sequential(nn.Linear(1, 32), nn.ReLU(), nn.Linear(32, heads))`, or a
    `FireMLP`); c > 0 and threshold tau > 0 are floats or 0-d tensors. For
    j <= i this is the paper's f(psi(i - j) / psi(max(tau, i))). Returns the
    MLP's output dtype (float32 for a float32 MLP, bf16 for one cast to
    bf16).
    """
    # int8 or uint8 would wrap when differenced: see _distance
    check_positions(positions)
    if not callable(mlp):
        raise TypeError(f"mlp must be callable ([..., 1] -> [..., heads]); "
                        f"got {type(mlp).__name__}")
    for arg, value in (("c", c), ("threshold", threshold)):
        if isinstance(value, bool) or not isinstance(
                value, (int, float, Tensor)):
            raise TypeError(f"{arg} must be a positive number or a 0-d "
                            f"tensor; got {value!r}")
    c, threshold = (
        torch.as_tensor(v, dtype=torch.float32, device=positions.device)
        for v in (c, threshold))
    for arg, value in (("c", c), ("threshold", threshold)):
        if (value.dim() != 0 or not bool(value > 0)
                or not bool(torch.isfinite(value))):
            raise ValueError(f"{arg} must be a positive finite number; "
                             f"got {value.tolist()!r}")
    return _fire(_distance(positions), _span(positions), mlp, c, threshold)


# -- modules ---------------------------------------------------------------------------
class FireMLP(nn.Module):
    """f_theta: [..., 1] -> [..., heads], Linear(1, hidden) -> ReLU -> Linear(hidden, heads),
    with plain parameters initialised as `nn.Linear`'s (so that the model's init leaves them)."""

    def __init__(self, n_heads: int, hidden: int = 32):
        super().__init__()
        self.w1, self.b1 = nn.Parameter(torch.empty(hidden, 1)), nn.Parameter(torch.empty(hidden))
        self.w2, self.b2 = nn.Parameter(torch.empty(n_heads, hidden)), nn.Parameter(torch.empty(n_heads))
        for w, b in ((self.w1, self.b1), (self.w2, self.b2)):     # nn.Linear.reset_parameters
            bound = 1.0 / math.sqrt(w.shape[1])
            nn.init.uniform_(w, -bound, bound)
            nn.init.uniform_(b, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(F.relu(F.linear(x, self.w1, self.b1)), self.w2, self.b2)


class FireLayer(nn.Module):
    """One layer's FIRE: f_theta, c = exp(gamma) and tau = tau0 exp(lambda)."""

    init_threshold: Tensor                  # tau0, a buffer

    def __init__(self, n_heads: int, hidden: int = 32, init_c: float = 0.1,
                 init_threshold: float = 512.0):
        super().__init__()
        self.mlp = FireMLP(n_heads, hidden)
        self.log_c = nn.Parameter(torch.tensor(math.log(init_c)))
        # tau = tau0 exp(lambda) (code: tau0 |m|)
        self.log_scale = nn.Parameter(torch.zeros(()))
        self.register_buffer("init_threshold",
                             torch.tensor(float(init_threshold)))

    @property
    def c(self) -> Tensor:
        return self.log_c.exp()

    @property
    def threshold(self) -> Tensor:
        return self.init_threshold * self.log_scale.exp()

    def forward(self, distance: Tensor, span: Tensor) -> Tensor:
        """distance |j - i| and span max(i, j), both [T, T]
        -> bias [H, T, T]."""
        return _fire(distance, span, self.mlp, self.c, self.threshold)


@register("kerple")
class KERPLE(Scheme):
    """A CPD kernel of the distance `|i - j|` on the logits, one (r1, r2) per
    head and layer.

    Args:
        kernel: "log" (`-r1 log(1 + r2 |i - j|)`, the paper's best) or
            "power" (`-r1 |i - j|^r2`).
    """

    shift_invariant = True

    def __init__(self, *, kernel: str = "log", **kw):
        super().__init__(**kw)
        _check_kernel(kernel)
        self.kernel = kernel
        shape = (self.n_layers, self.n_heads)
        # the code's U(0, s) inits
        s1, s2 = (2.0, 1.0) if kernel == "log" else (1.0, 2.0)
        r1 = (torch.rand(shape) * s1).clamp(min=_EPS)
        r2 = (torch.rand(shape) * s2).clamp(_EPS, s2 - _EPS)
        self.rho1 = nn.Parameter(_softplus_inverse(r1))
        self.rho2 = nn.Parameter(_softplus_inverse(r2) if kernel == "log"
                                 else torch.logit(r2 / 2))

    @property
    def r1(self) -> Tensor:
        """[layers, heads], positive."""
        return F.softplus(self.rho1)

    @property
    def r2(self) -> Tensor:
        """[layers, heads], positive (log) or in (0, 2) (power)."""
        return (F.softplus(self.rho2) if self.kernel == "log"
                else 2 * torch.sigmoid(self.rho2))

    def prepare(self, ctx: PositionContext) -> dict:
        return {"kerple_distance": _distance(ctx.positions)}

    def layer_logit_bias(self, ctx: PositionContext, layer: int) -> Tensor:
        return _kerple(ctx.tables["kerple_distance"],
                       self.r1[layer], self.r2[layer], self.kernel)


@register("fire")
class FIRE(Scheme):
    """A learned function of the progressively normalised log distance, one per layer.

    Args:
        hidden: width of the MLP f_theta (paper: 32).
        init_c: initial c of psi(x) = log(c x + 1) (paper's code: 0.1).
        init_threshold: initial tau (paper's code: 512, with 2048-token training).
        shared_layers: one (f_theta, c, tau) for all layers instead of one per layer.
    """

    def __init__(self, *, hidden: int = 32, init_c: float = 0.1, init_threshold: float = 512.0,
                 shared_layers: bool = False, **kw):
        super().__init__(**kw)
        if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden < 1:
            raise ValueError(f"hidden must be a positive int; got {hidden!r}")
        for arg, value in (("init_c", init_c), ("init_threshold", init_threshold)):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < math.inf:
                raise ValueError(f"{arg} must be a positive finite number; got {value!r}")
        if not isinstance(shared_layers, bool):
            raise TypeError(f"shared_layers must be True or False; got {shared_layers!r}")
        self.shared_layers = shared_layers
        self.layers = nn.ModuleList(FireLayer(self.n_heads, hidden, init_c, init_threshold)
                                    for _ in range(1 if shared_layers else self.n_layers))

    def prepare(self, ctx: PositionContext) -> dict:
        tables = {"fire_distance": _distance(ctx.positions),
                  "fire_span": _span(ctx.positions)}
        if self.shared_layers:  # one bias for every layer: build it once
            tables["fire_bias"] = self.layers[0](tables["fire_distance"],
                                                 tables["fire_span"])
        return tables

    def layer_logit_bias(self, ctx: PositionContext, layer: int) -> Tensor:
        if self.shared_layers:
            return ctx.tables["fire_bias"]
        return self.layers[layer](ctx.tables["fire_distance"],
                                  ctx.tables["fire_span"])


# -- expressivity (the paper's Theorem 3.1) -----------------------------------------------
def fit_fire_to_bias(target: Tensor, steps: int = 300, seed: int = 0, *, hidden: int = 32,
                     init_threshold: float | None = None, lr: float = 0.005) -> tuple[FIRE, float]:
    """Fit one FIRE layer to a causal bias `target` [heads, n, n] by least squares on j <= i.

    Returns (a one-layer causal `FIRE` scheme with the fitted parameters, the relative error
    ||b - target||_F / ||target||_F over the entries j <= i). Variable projection: the output
    layer of f_theta is the exact least-squares solution for the current hidden features, and
    Adam moves the rest (hidden layer, c, tau); by the envelope theorem the gradient of the
    projected loss is the gradient with the output layer held at its optimum; the hidden
    units start as relu(x - t_k) with knots t_k between the inputs (`seed` picks which), and
    the best parameters seen are kept. tau starts at n (`init_threshold`): then the normaliser
    psi(tau) is one constant and a target that depends on i - j alone (T5, ALiBi, KERPLE) is a
    function of one variable, x = psi(i - j) / psi(tau), to approximate.

    A width-h f_theta is a piecewise-linear function of x with at most h kinks: it follows
    smooth targets (ALiBi, KERPLE) closely at h = 32. T5's bias, one free value per bucket, drawn
    through the n distances with bends only at them, has a kink at every exact distance and two
    at the edges of each log bucket (36 for n = 64); a function bending between distances may
    need fewer, but the fit, which places the knots by gradient, finds no exact one at a width
    of 32. Any function of n distances is matched exactly once h >= n - 1 (a knot between every
    two inputs).
    """
    if not isinstance(target, Tensor) or not target.is_floating_point():
        raise TypeError(f"target must be a float tensor [heads, n, n]; got {_describe(target)}")
    if target.dim() != 3 or target.shape[1] != target.shape[2] or target.shape[1] < 2 or target.shape[0] < 1:
        raise ValueError(f"target must be [heads, n, n] with n >= 2; got shape {tuple(target.shape)}")
    if not bool(torch.isfinite(target.tril()).all()):
        raise ValueError("target must be finite on the entries j <= i")
    for arg, value, low in (("steps", steps, 0), ("seed", seed, 0)):
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            raise ValueError(f"{arg} must be a non-negative int; got {value!r}")
    heads, n = target.shape[0], target.shape[1]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        scheme = FIRE(d_model=heads, n_heads=heads, n_layers=1, max_len=n, causal=True, hidden=hidden,
                      init_threshold=float(n) if init_threshold is None else init_threshold)
        layer, pos = cast(FireLayer, scheme.layers[0]), torch.arange(n)
        rows, cols = torch.tril_indices(n, n)
        distance, span = _distance(pos)[rows, cols], _span(pos)[rows, cols]       # (N,) entries j <= i
        _place_knots(layer, distance, span)
    y = target.detach().cpu().float()[:, rows, cols].T                                 # (N, H)
    opt = torch.optim.Adam([layer.mlp.w1, layer.mlp.b1, layer.log_c, layer.log_scale], lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(1, steps))
    best = (math.inf, {k: v.clone() for k, v in layer.state_dict().items()})
    for step in range(steps + 1):                              # Adam keeps moving at an optimum: keep the best
        opt.zero_grad()
        loss = _projected_residual(layer, distance, span, y).square().mean()
        if loss.item() < best[0]:
            best = (loss.item(), {k: v.clone() for k, v in layer.state_dict().items()})
        if step < steps:
            loss.backward()
            opt.step()
            sched.step()
    layer.load_state_dict(best[1])
    with torch.no_grad():
        residual = _projected_residual(layer, distance, span, y)
    return scheme, float(residual.norm() / y.norm().clamp(min=1e-30))


def _place_knots(layer: FireLayer, distance: Tensor, span: Tensor) -> None:
    """Hidden unit k as relu(x - t_k): one with t below every input (a linear term), the others with
    knots t_k at midpoints between consecutive distinct inputs x (a random subset when there are more
    midpoints than units; extra units at random inside the inputs' range)."""
    with torch.no_grad():
        xs = _fire_input(distance, span, layer.c, layer.threshold).unique()       # sorted
        mid, k = (xs[1:] + xs[:-1]) / 2, len(layer.mlp.b1) - 1
        extra = xs[0] + (xs[-1] - xs[0]) * torch.rand(max(0, k - len(mid)))
        knots = torch.cat([xs[:1] - 1, mid[torch.randperm(len(mid))[:k]], extra])
        layer.mlp.w1.fill_(1.0)
        layer.mlp.b1.copy_(-knots)


def _projected_residual(layer: FireLayer, distance: Tensor, span: Tensor, y: Tensor) -> Tensor:
    """Sets the output layer (w2, b2) to the least-squares fit of y on the hidden features and
    returns the residual (N, H), differentiable in the hidden layer, c and tau."""
    mlp = layer.mlp
    x = _fire_input(distance, span, layer.c, layer.threshold)                      # (N,)
    h = F.relu(F.linear(x[:, None], mlp.w1, mlp.b1))                               # (N, hidden)
    features = torch.cat([h, torch.ones_like(h[:, :1])], 1)                       # (N, hidden + 1)
    with torch.no_grad():                                                          # ridge-regularised normal equations
        f64 = features.double()
        gram = f64.T @ f64
        gram += 1e-9 * gram.diagonal().mean() * torch.eye(len(gram), dtype=gram.dtype)  # dead ReLUs: zero columns
        solution = torch.linalg.solve(gram, f64.T @ y.double()).float()          # (hidden + 1, H)
        mlp.w2.copy_(solution[:-1].T)
        mlp.b2.copy_(solution[-1])
    return features @ solution - y


# -- helpers ---------------------------------------------------------------------------
def _check_kernel(kernel) -> None:
    if not isinstance(kernel, str) or kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {', '.join(map(repr, KERNELS))}; got {kernel!r}")


def _softplus_inverse(y: Tensor) -> Tensor:
    """x with softplus(x) = y > 0: log(exp(y) - 1), written to stay finite for small and large y."""
    return y + torch.log(-torch.expm1(-y))


def _describe(value) -> str:
    return f"{value.dtype} of shape {tuple(value.shape)}" if isinstance(value, Tensor) else type(value).__name__
