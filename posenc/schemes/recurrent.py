"""Positions from a recursion: a GRU before the Transformer (the discrete form of FLOATER).

A recurrent layer needs no positional encoding: its state after token i has seen i
updates, so it already knows (roughly) where it is. Put one in front of the Transformer
and every token's vector carries its position (the suggestion of Su's 2021 article):

    h_0 = h0                                   (learned, init 0)
    h_i = GRU(h_{i-1}, x_i),      i = 1 .. n   (a single-layer torch.nn.GRU of width H)
    x_i -> x_i + W h_i + b                     (hook `embed`; W: [d_model, H], N(0, 0.02))

with the GRU's equations (PyTorch's gate order r, z, n; sigma the logistic function)

    r_i = sigma(W_ir x_i + b_ir + W_hr h_{i-1} + b_hr)
    z_i = sigma(W_iz x_i + b_iz + W_hz h_{i-1} + b_hz)
    n_i = tanh(W_in x_i + b_in + r_i * (W_hn h_{i-1} + b_hn))
    h_i = (1 - z_i) * n_i + z_i * h_{i-1}  =  h_{i-1} + (1 - z_i) * (n_i - h_{i-1}).

`residual=False` drops the x_i term, x_i -> W h_i + b: the article's literal form, where
the Transformer only sees the recurrent layer's outputs.

Relation to FLOATER. FLOATER's code solves dp/dt = h(t, p); one explicit Euler step of
size delta is p_{k+1} = p_k + delta h(t_k, p_k), a recursion p_{k+1} = f(p_k). The last
form of the GRU update is exactly such a step, of dh/dt = n - h, with a learned, per
coordinate step size (1 - z_i) in (0, 1): FLOATER is the continuous limit of a recursion,
the GRU a discrete recursion with the step learned.

What the GRU adds over a counter. A recursion that reads nothing, p_{k+1} = f(p_k) (a
counter, FLOATER, the sinusoidal rotation p_{k+1} = M_1 p_k), gives every sequence the same
code at position k: a table, computable once. The GRU reads the tokens, so its code can
count only some of them (words, separators), reset at a boundary, or hold a summary of
the content so far: it is a contextual position like CoPE's counts, and it cannot be
cached as a table the way FLOATER is.

Positions. The scheme never reads `ctx.positions`: where a token is comes from how many
updates the recursion made, i.e. from its index in the sequence as given. An offset of the
position ids therefore changes nothing (`shift_invariant = True` in this package's sense),
although the code is absolute in the index (it counts from the first token), and there is
no `max_len`: the model runs at any length; whether the states past the training length
mean anything is for training to decide (they may settle, or run away as FLOATER's trained
codes do, chapter 03).

Direction. In a causal model the GRU runs left to right, so h_i depends on x_1..x_i only
and nothing leaks from the future. A bidirectional model gets, by default, a bidirectional
GRU (outputs [forward h_i; backward h_i], 2H wide, projected by W: [d_model, 2H]), whose
backward half counts from the end of the sequence; `bidirectional=False` keeps the
left-to-right GRU there too. A bidirectional GRU in a causal model is refused.

Cost. The recursion is sequential over the sequence: n dependent GRU steps of
O(d_model H + H^2) each, which no hardware parallelises across positions (cuDNN only fuses
the step). In generation it is cheap: one more step per new token, with h_{i-1} kept.
It runs in float32 even under autocast (n roundings of a bfloat16 state would add up).
Dynamo does not trace `torch.nn.GRU`, so `torch.compile(model, fullgraph=True)` refuses this
scheme; `torch.compile(model)` compiles the rest with graph breaks around the GRU.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..scheme import register
from ..scheme import PositionContext, Scheme


@register("rnn")
class Recurrent(Scheme):
    """x_i + W h_i + b with h_i = GRU(h_{i-1}, x_i) from a learned h_0 (hook
    `embed`); see the module docstring.

    Args:
        hidden: the GRU's width H (default d_model).
        bidirectional: a bidirectional GRU; None (default) follows the model:
            True in a bidirectional model, False in a causal one (where True
            is refused: it would leak).
        residual: True (default): x_i + W h_i + b; False: W h_i + b
            (the article's form).
    """

    # ctx.positions is never read:
    # an offset of every position id changes nothing
    shift_invariant = True
    vmappable = False  # torch.nn.GRU has no torch.func.vmap batching rule

    def __init__(self, *, hidden: int | None = None,
                 bidirectional: bool | None = None, residual: bool = True,
                 **kw):
        super().__init__(**kw)
        hidden = self.d_model if hidden is None else hidden
        if (not isinstance(hidden, int) or isinstance(hidden, bool)
                or hidden < 1):
            raise ValueError(
                f"hidden must be a positive int (the GRU's width); "
                f"got {hidden!r}")
        if bidirectional is None:
            bidirectional = not self.causal
        if not isinstance(bidirectional, bool):
            raise TypeError(f"bidirectional must be True, False or None; "
                            f"got {bidirectional!r}")
        if bidirectional and self.causal:
            raise ValueError(
                "bidirectional=True needs a bidirectional model "
                "(causal=False): in a causal model the backward GRU "
                "would carry future tokens into earlier positions")
        if not isinstance(residual, bool):
            raise TypeError(f"residual must be True or False; "
                            f"got {residual!r}")
        self.hidden, self.bidirectional, self.residual = (
            hidden, bidirectional, residual)
        directions = 2 if bidirectional else 1
        self.gru = nn.GRU(self.d_model, hidden, num_layers=1,
                          batch_first=True, bidirectional=bidirectional)
        # (dirs, H), p(0) of FLOATER
        self.h0 = nn.Parameter(torch.zeros(directions, hidden))
        # W, b: init by the model
        self.proj = nn.Linear(directions * hidden, self.d_model)

    def states(self, x: Tensor) -> Tensor:
        """The GRU's outputs h_1..h_n for inputs x [batch, seq, d_model]:
        [batch, seq, dirs * H].

        The recursion runs in the GRU's own precision (float32) even under
        autocast: a bfloat16 state would round at each of the n dependent
        steps, and not every cuDNN supports bfloat16 RNNs.
        """
        dtype = next(self.gru.parameters()).dtype
        # (dirs, B, H)
        h0 = (self.h0[:, None, :].expand(-1, x.shape[0], -1)
              .contiguous().to(dtype))
        with torch.autocast(x.device.type, enabled=False):
            out, _ = self.gru(x.to(dtype), h0)
        return out                                            # (B, T, dirs*H)

    def codes(self, x: Tensor) -> Tensor:
        """The vectors added to the inputs, W h_i + b:
        [batch, seq, d_model]."""
        return self.proj(self.states(x))

    def embed(self, x: Tensor, ctx: PositionContext) -> Tensor:
        code = self.codes(x).to(x.dtype)                          # (B, T, D)
        return x + code if self.residual else code
