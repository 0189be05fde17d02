"""Selective k-back: find the marked item k marked items back (after the selective copy and counting
tasks of CoPE's paper, Golovneva et al. 2024, section 4).

A source of `n` items mixes *marked* symbols (the answers, `n_symbols` of them) with
*fillers* (`n_fillers` other symbols), each item marked with probability `mark_prob`.
With m_1, m_2, ... the marked items in order and c_i the number of marked items among
x_1..x_i, the label of item i is

    label_i = m_{c_i - k}          (asked when c_i > k; k = 0 is the latest marked item)

so the answer sits k marked items back, at a token distance that varies from sample to
sample. Counting marked keys finds it in one step -- CoPE's gates can count exactly the
marked items, and its position e[k + 1] then names the answer -- while a position made of
token counts (RoPE, NoPE's implicit one) has to learn the distribution of the gaps. The
format is that of `posenc.tasks.synthetic`'s labelling tasks: `[BOS] x_1..x_n`, one label
per item that depends only on items at or before it, so the same inputs serve both kinds
of model; `evaluate` and `accuracy_by_position` are `SyntheticTask`'s.

Beyond the training length L two things can grow: with `dilute=False` the marked items
keep their density (more of them, the same gaps); with `dilute=True` a source of n > L
items holds as many marked items as one of L (expected mark_prob * L) spread over n, so
the gaps stretch by n / L and only a count of marked items, not a distance, transfers.
A source with at most k marked items is drawn again, so that every sample asks something.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .synthetic import BOS, IGNORE, N_SPECIAL, SyntheticTask


@dataclass
class CountingTask:
    """Selective k-back: label_i is the marked item k marked items before the latest one.

    Args:
        train_length: L, the longest source seen in training (lengths min_train_length..L are drawn).
        k: how many marked items back (0: the latest marked item at or before i).
        n_symbols: marked symbols (the answers); n_fillers: unmarked symbols.
        mark_prob: probability that an item is marked (at lengths <= L).
        dilute: beyond L, keep the expected number of marked items of length L (gaps stretch).
        max_eval_factor: longest test length as a multiple of L.
        min_train_length: shortest training source (at least k + 1).
    """

    train_length: int = 16
    k: int = 1
    n_symbols: int = 8
    n_fillers: int = 4
    mark_prob: float = 0.3
    dilute: bool = False
    max_eval_factor: int = 4
    min_train_length: int = 4

    def __post_init__(self):
        for arg in ("train_length", "k", "n_symbols", "n_fillers", "max_eval_factor", "min_train_length"):
            value = getattr(self, arg)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{arg} must be an int; got {value!r}")
            if value < (0 if arg == "k" else 1):
                raise ValueError(f"{arg} must be >= {0 if arg == 'k' else 1}; got {value}")
        if not isinstance(self.mark_prob, (int, float)) or isinstance(self.mark_prob, bool) \
                or not 0.0 < self.mark_prob <= 1.0:
            raise ValueError(f"mark_prob must be a number in (0, 1]; got {self.mark_prob!r}")
        if not isinstance(self.dilute, bool):
            raise TypeError(f"dilute must be True or False; got {self.dilute!r}")
        if not self.k < self.min_train_length <= self.train_length:
            raise ValueError(f"need k < min_train_length <= train_length; got k={self.k}, "
                             f"min_train_length={self.min_train_length}, train_length={self.train_length}")

    @property
    def min_length(self) -> int:
        """Shortest source with something to predict: more than k items."""
        return self.k + 1

    @property
    def max_length(self) -> int:
        return self.train_length * self.max_eval_factor

    @property
    def vocab_size(self) -> int:
        return N_SPECIAL + self.n_symbols + self.n_fillers

    def seq_len(self, length: int, causal: bool) -> int:
        """Tokens the model sees for a source of `length` items: [BOS] x."""
        return length + 1

    def mark_rate(self, length: int) -> float:
        """Probability that an item of a source of `length` items is marked."""
        if self.dilute and length > self.train_length:
            return self.mark_prob * self.train_length / length
        return float(self.mark_prob)

    def train_batch(self, batch_size: int, generator: torch.Generator, causal: bool) -> tuple[Tensor, Tensor]:
        """A batch at a length drawn uniformly from [min_train_length, L]."""
        n = int(torch.randint(self.min_train_length, self.train_length + 1, (1,), generator=generator))
        return self.batch(batch_size, n, generator, causal)

    def batch(self, batch_size: int, length: int, generator: torch.Generator, causal: bool) -> tuple[Tensor, Tensor]:
        """inputs [B, n + 1] long ([BOS] x) and targets [B, n + 1] long (IGNORE where c_i <= k)."""
        if not isinstance(length, int) or not self.min_length <= length <= self.max_length:
            raise ValueError(f"length must be in [{self.min_length}, {self.max_length}]; got {length!r}")
        x, y = selective_kback(batch_size, length, self.k, self.n_symbols, self.n_fillers, self.mark_rate(length),
                               generator)
        bos = torch.full((batch_size, 1), BOS)
        return torch.cat([bos, x], 1), torch.cat([torch.full_like(bos, IGNORE), y], 1)

    evaluate = SyntheticTask.evaluate                      # token and sequence accuracy at one length
    accuracy_by_position = SyntheticTask.accuracy_by_position


def selective_kback(batch_size: int, length: int, k: int, n_symbols: int, n_fillers: int, mark_prob: float,
                    generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Items [B, n] (marked symbols N_SPECIAL.. + n_symbols, then fillers) and labels m_{c_i - k} [B, n].

    Every source holds more than k marked items (a row with fewer is drawn again), so every
    sample asks something and no batch has an empty loss.
    """
    B, n = batch_size, length
    if not k < n:
        raise ValueError(f"length must be > k={k}; got {length}")
    accept = 1.0 - sum(math.comb(n, c) * mark_prob ** c * (1 - mark_prob) ** (n - c) for c in range(k + 1))
    if accept < 1e-3:
        raise ValueError(f"mark_prob={mark_prob:g} is too small for length {n}: fewer than 1 source in 1000 "
                         f"holds more than k={k} marked items")
    marked = torch.rand(B, n, generator=generator) < mark_prob                          # (B, n)
    while (short := marked.sum(1) <= k).any():                                          # redraw rows with <= k marks
        marked[short] = torch.rand(int(short.sum()), n, generator=generator) < mark_prob
    symbols = torch.randint(N_SPECIAL, N_SPECIAL + n_symbols, (B, n), generator=generator)
    fillers = torch.randint(N_SPECIAL + n_symbols, N_SPECIAL + n_symbols + n_fillers, (B, n), generator=generator)
    x = torch.where(marked, symbols, fillers)
    count = marked.long().cumsum(1)                                                     # (B, n) c_i
    in_order = x.gather(1, torch.argsort((~marked).long(), dim=1, stable=True))        # m_1, m_2, ... then fillers
    y = in_order.gather(1, (count - k - 1).clamp(min=0))                               # m_{c_i - k}
    return x, y.masked_fill(count <= k, IGNORE)
