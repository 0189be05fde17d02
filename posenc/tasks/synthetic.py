"""Synthetic length-generalisation tasks (after Kazemnejad et al. 2023; Ruoss et al. 2023).

Every task draws a source of `n` items ("length n"). Models train on n <= L and are
tested up to 4L. Two families:

* sequence-to-sequence (`copy`, `reverse`, `recall`): the sequence
  `[BOS] x_1..x_n [SEP] y_1..y_m`. A causal model reads it shifted by one and predicts
  each y_t from everything before it (teacher forcing: if every y_t is right, greedy
  decoding reproduces the whole answer, so sequence accuracy = exact match). A
  bidirectional model sees `[MASK]` in place of every y_t and predicts all at once.
* labelling (`kback`, `index`, `position`): `[BOS] x_1..x_n`, one label per item that
  depends only on items at or before it, so the same inputs serve both kinds of model.

| task       | answer                           | needs                        |
| ---------- | -------------------------------- | ---------------------------- |
| `copy`     | y = x                            | aligning j with n+1+j        |
| `reverse`  | y_t = x_{n+1-t}                  | absolute/relative alignment  |
| `recall`   | the value stored with a key      | content lookup (+ adjacency) |
| `kback`    | label_i = x_{i-k}                | relative position            |
| `index`    | label_i = x_c for i >= c         | absolute position            |
| `position` | label_i = i - 1 (from 0)         | absolute position (a probe)  |
| `sort`     | y = x sorted                     | content ranking, counting    |
| `duplicate`| y = x x                          | aligning j with n+1+j, n+j   |
| `addition` | label_i = digit i of a + b       | the carry from the left      |
| `parity`   | label_i = x_1 + ... + x_i mod 2  | counting over the prefix     |
| `scan`     | a SCAN-like command's actions    | composition + alignment      |

`addition` is column addition as labelling: item i is the column (a_i, b_i) of two
n-digit decimal numbers written least significant digit first, one token per column
(100 of them), and its label is the sum's digit s_i = (a_i + b_i + c_i) mod 10, where
the carry c_i is 1 when the columns before i overflow (a run of 9s carries it on). The
digits are aligned by construction, so what the task asks of position is the carry:
reading the columns just before, as far back as a run of 9s goes. `parity` labels every
prefix of a bit string. `scan` is a generated command language in the spirit of
SCAN (Lake & Baroni 2018): n phrases "verb direction count" (verb in jump, walk, run,
look; direction in forward, left, right; count in once, twice, thrice) map to the
action sequence, each phrase's [turn] ACTION repeated count times; n is the number of
phrases. The answer is padded at its end with PAD to 6 actions per phrase; its first PAD is a
target (the model must say where the answer ends) and the rest are not, so that a model that
predicts PAD everywhere scores what the answers' ends are worth, not the 0.44 that scoring every
PAD gave.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

PAD, BOS, SEP, MASK = 0, 1, 2, 3
N_SPECIAL = 4
from ..model import IGNORE  # target id that the loss and the metrics skip
from ..attention import check_sizes
from .scoring import scoring


@dataclass
class SyntheticTask:
    """A generated task; `batch` makes inputs and targets for one length.

    Args:
        name: one of `TASKS`.
        train_length: L, the longest source seen in training (lengths min_length..L are drawn, where
            min_length is `min_train_length`, at least k + 1 for `kback` and `index`).
        n_symbols: alphabet size of the items.
        k: offset for `kback`, index for `index`.
        max_eval_factor: longest test length as a multiple of L (sizes the vocabulary
            of `recall` keys and `position` labels).
        min_train_length: the shortest training length (see `train_length`).
    """

    name: str
    train_length: int = 16
    n_symbols: int = 16
    k: int = 2
    max_eval_factor: int = 4
    min_train_length: int = 1

    def __post_init__(self):
        if self.name not in TASKS:
            raise ValueError(f"unknown task {self.name!r}; known tasks: {', '.join(TASKS)}")
        for arg in ("train_length", "n_symbols", "max_eval_factor", "min_train_length", "k"):
            value = getattr(self, arg)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{arg} must be an int; got {value!r}")
            if value < (0 if arg == "k" else 1):
                raise ValueError(f"{arg} must be >= {0 if arg == 'k' else 1}; got {value}")
        if self.min_train_length > self.train_length:
            raise ValueError(f"min_train_length={self.min_train_length} must be <= train_length={self.train_length}")
        if self.name in ("kback", "index") and not 0 <= self.k < self.train_length:
            raise ValueError(f"k must be in [0, train_length) for {self.name!r}; got {self.k}")
        if self.name == "scan" and self.n_symbols < 16:
            raise ValueError(f"n_symbols must be >= 16 for 'scan' (its words and actions); got {self.n_symbols}")

    @property
    def min_length(self) -> int:
        """Shortest source with something to predict (`kback`/`index` need more than k items)."""
        return max(self.min_train_length, self.k + 1 if self.name in ("kback", "index") else 1)

    @property
    def max_length(self) -> int:
        return self.train_length * self.max_eval_factor

    @property
    def vocab_size(self) -> int:
        outputs = {"recall": 2 * self.max_length, "position": self.max_length + 1, "addition": 100}.get(self.name, 0)
        return N_SPECIAL + max(self.n_symbols, outputs)

    def seq_len(self, length: int, causal: bool) -> int:
        """Tokens the model sees for a source of `length` items."""
        if self.name in LABELLING:
            return length + 1                                   # [BOS] x
        src, ans = {"recall": (2 * length + 1, 1), "duplicate": (length, 2 * length),
                    "scan": (3 * length, 6 * length)}.get(self.name, (length, length))
        return src + ans + 2 - int(causal)                      # [BOS] src [SEP] ans, shifted if causal

    def train_batch(self, batch_size: int, generator: torch.Generator, causal: bool) -> tuple[Tensor, Tensor]:
        """A batch at a length drawn uniformly from [min_train_length, L]."""
        check_sizes(batch_size=batch_size)
        n = int(torch.randint(self.min_length, self.train_length + 1, (1,), generator=generator))
        return self.batch(batch_size, n, generator, causal)

    def batch(self, batch_size: int, length: int, generator: torch.Generator, causal: bool) -> tuple[Tensor, Tensor]:
        """inputs [B, T] long and targets [B, T] long (IGNORE where nothing is asked)."""
        lo = self.k + 1 if self.name in ("kback", "index") else 1
        if not lo <= length <= self.max_length:
            raise ValueError(f"length must be in [{lo}, {self.max_length}] for {self.name!r}; got {length}")
        src, out = GENERATORS[self.name](self, batch_size, length, generator)
        if self.name in LABELLING:
            bos = torch.full((batch_size, 1), BOS)
            return torch.cat([bos, src], 1), torch.cat([torch.full_like(bos, IGNORE), out], 1)
        return seq2seq(src, out, causal)

    @scoring
    def evaluate(self, model, length: int, *, n_samples: int = 256, batch_size: int = 128,
                 seed: int = 0, device=None) -> dict:
        """Token accuracy and sequence accuracy (every target of a sample right) at one length."""
        if not isinstance(n_samples, int) or n_samples < 1:
            raise ValueError(f"n_samples must be a positive int; got {n_samples!r}")
        g = torch.Generator().manual_seed(seed * 100003 + length)
        right = total = seq_right = 0
        for start in range(0, n_samples, batch_size):
            x, y = self.batch(min(batch_size, n_samples - start), length, g, model.causal)
            y = y.to(device)
            asked = y != IGNORE
            hit = (model(x.to(device)).argmax(-1) == y) & asked
            right, total = right + int(hit.sum()), total + int(asked.sum())
            seq_right += int((hit == asked).all(1).sum())
        return {"accuracy": right / total, "seq_accuracy": seq_right / n_samples}

    @scoring
    def accuracy_by_position(self, model, length: int, *, n_samples: int = 256, seed: int = 0,
                             device=None) -> list:
        """Accuracy at each target slot (item index for labelling tasks, answer index otherwise), NaN at a slot
        that no sample asks about (kback's first k items, scan's padding), so that entry i is slot i."""
        x, y = self.batch(n_samples, length, torch.Generator().manual_seed(seed * 100003 + length), model.causal)
        y = y.to(device)
        asked = y != IGNORE
        hit = ((model(x.to(device)).argmax(-1) == y) & asked).sum(0).float()
        per_slot = hit / asked.sum(0).clamp(min=1)
        per_slot[~asked.any(0)] = float("nan")
        if self.name in LABELLING:
            return per_slot[1:].tolist()                                        # item i sits at slot i + 1, after [BOS]
        return per_slot[int(asked.any(0).nonzero()[0]):].tolist()               # from the answer's first slot


def up_to_the_end(targets: Tensor) -> Tensor:
    """`targets` [B, T] with every PAD after a row's first one set to IGNORE: an answer padded to a fixed
    width is scored up to and including its end, not on the padding that follows (which any model that
    knows where the answer ends, or that predicts PAD everywhere, gets right)."""
    pad = targets == PAD
    return targets.masked_fill(pad & (pad.cumsum(1) > 1), IGNORE)


def seq2seq(src: Tensor, ans: Tensor, causal: bool) -> tuple[Tensor, Tensor]:
    """[BOS] src [SEP] ans, shifted for a causal model or with masked answers otherwise. An answer padded to a
    fixed width (scan's) is a target up to its first PAD, its end (`up_to_the_end`)."""
    B, n = src.shape[0], src.shape[1]
    seq = torch.cat([torch.full((B, 1), BOS), src, torch.full((B, 1), SEP), ans], 1)  # (B, n + ans.shape[1] + 2)
    tgt = torch.full_like(seq, IGNORE)
    tgt[:, n + 2:] = up_to_the_end(ans)
    if causal:
        return seq[:, :-1], tgt[:, 1:]
    seq[:, n + 2:] = MASK
    return seq, tgt


def _items(task, B, n, g):
    return torch.randint(N_SPECIAL, N_SPECIAL + task.n_symbols, (B, n), generator=g)


def _copy(task, B, n, g):
    x = _items(task, B, n, g)
    return x, x.clone()


def _reverse(task, B, n, g):
    x = _items(task, B, n, g)
    return x, x.flip(1)


def _recall(task, B, n, g):
    """n distinct keys, each followed by its value, then one queried key."""
    keys = torch.rand(B, task.max_length, generator=g).argsort(1)[:, :n] + N_SPECIAL          # (B, n) distinct
    values = torch.randint(0, task.max_length, (B, n), generator=g) + N_SPECIAL + task.max_length
    pick = torch.randint(0, n, (B, 1), generator=g)
    src = torch.cat([torch.stack([keys, values], 2).flatten(1), keys.gather(1, pick)], 1)  # (B, 2n+1)
    return src, values.gather(1, pick)


def _kback(task, B, n, g):
    x = _items(task, B, n, g)
    y = torch.full_like(x, IGNORE)
    y[:, task.k:] = x[:, : n - task.k]
    return x, y


def _index(task, B, n, g):
    x = _items(task, B, n, g)
    y = torch.full_like(x, IGNORE)
    y[:, task.k:] = x[:, task.k: task.k + 1]
    return x, y


def _position(task, B, n, g):
    x = _items(task, B, n, g)
    return x, (torch.arange(n) + N_SPECIAL).expand(B, n).clone()


def _sort(task, B, n, g):
    x = _items(task, B, n, g)
    return x, x.sort(1).values


def _duplicate(task, B, n, g):
    x = _items(task, B, n, g)
    return x, torch.cat([x, x], 1)


def _addition(task, B, n, g):
    """Columns (a_i, b_i) as tokens 10 a_i + b_i, least significant first; labels the sum's digits."""
    a, b = torch.randint(0, 10, (2, B, n), generator=g)
    digits, carry = [], torch.zeros(B, dtype=torch.long)
    for i in range(n):
        total = a[:, i] + b[:, i] + carry
        digits.append(total % 10)
        carry = total // 10
    return 10 * a + b + N_SPECIAL, torch.stack(digits, 1) + N_SPECIAL


def _parity(task, B, n, g):
    bits = torch.randint(0, 2, (B, n), generator=g)
    return bits + N_SPECIAL, bits.cumsum(1) % 2 + N_SPECIAL


#: SCAN-like words: 4 verbs, 3 directions, 3 counts (ids N_SPECIAL + 0..9) and 6 actions (+10..15).
SCAN_VERBS, SCAN_DIRECTIONS, SCAN_COUNTS = ("jump", "walk", "run", "look"), ("forward", "left", "right"), \
    ("once", "twice", "thrice")
SCAN_ACTIONS = ("JUMP", "WALK", "RUN", "LOOK", "LTURN", "RTURN")


def _scan(task, B, n, g):
    """n phrases (verb, direction, count) -> ([turn] ACTION) * count per phrase, PAD-filled to 6n actions."""
    verb, direction, count = (torch.randint(0, k, (B, n), generator=g) for k in (4, 3, 3))
    src = torch.stack([verb, 4 + direction, 7 + count], 2).flatten(1) + N_SPECIAL      # (B, 3n)
    out = torch.full((B, 6 * n), PAD)
    for b in range(B):
        acts = []
        for v, d, c in zip(verb[b].tolist(), direction[b].tolist(), count[b].tolist()):
            step = ([13 + d] if d else []) + [10 + v]                                   # LTURN = 14, RTURN = 15
            acts += step * (c + 1)
        out[b, :len(acts)] = torch.tensor(acts) + N_SPECIAL
    return src, out


GENERATORS = {"copy": _copy, "reverse": _reverse, "recall": _recall,
              "kback": _kback, "index": _index, "position": _position,
              "sort": _sort, "duplicate": _duplicate, "addition": _addition, "parity": _parity, "scan": _scan}
TASKS = tuple(GENERATORS)
LABELLING = ("kback", "index", "position", "parity", "addition")
