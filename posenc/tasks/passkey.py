"""Passkey retrieval (Mohtashami and Jaggi 2023, "Landmark Attention"; the test of the
context-extension papers that follow it): find a number hidden at some depth of a long text.

One sample of length n (the characters the model reads) is

    filler[:k] + " the pass key is 42. remember it. " + filler[k:] + " what is the pass key? the pass key is " + 42

where the key is `digits` independent uniform decimal digits (leading zeros allowed, so the
answer is always `digits` characters) and k = round(depth * F) places the key sentence at a
fraction `depth` of the F filler characters (0: the start of the text, 1: just before the
question). A causal model reads the text shifted by one and predicts each key digit from
everything before it; a bidirectional one reads it with the digits replaced by <mask>. Only the
digits are targets (every other target is IGNORE): the loss and the metrics see nothing else.
Teacher forcing: when every digit is right, greedy decoding writes the whole key, so
`accuracy` (all digits right) is the exact-match retrieval rate; `digit_accuracy` is the
fraction of digits right.

Character-level, with the vocabulary of the shipped corpus (`CharCorpus.stdlib()`): a model of
the corpus LM reads this task unchanged. The filler is

* "repeat" (default): Landmark's own filler, "the grass is green. the sky is blue. the sun is
  yellow. here we go. there and back again. " repeated, from a random offset;
* "corpus": a window of the shipped stdlib-docstring text, from its training documents for
  training batches and its validation documents for evaluation.

Landmark's format, with three changes for a character-level model trained for a few hundred
CPU steps: lower case (the corpus vocabulary has both; it keeps the template short), a
fixed-width key of 2 digits by default (Landmark draws 1..50000 and states it twice), and no
task description before the text. The question keeps Landmark's closing "the pass key is ":
the first digit is then found by matching the key sentence's words (an induction-head lookup),
as a pretrained LM does. Why these defaults (2-layer d=64 RoPE model, L=128, 400 steps of 32):
this format with 2 digits is solved (exact match 0.99-1.0 at L, seeds 0 and 1); with corpus
filler 0.44; with 5 digits 0.00 (digit accuracy 0.30: the first digit is found, copying digit
i+1 after digit i is what takes long; about 1500 steps, and not for every seed).

Training batches draw a length uniformly from [min_length, train_length] (one per batch) and
a depth per sample (k uniform in 0..F); `evaluate_grid` scores fixed (length, depth) cells for
an accuracy heat map (validation filler), `evaluate(model, length)` the mean over `DEPTHS`.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from .corpus import MASK_ID, CharCorpus
from ..attention import check_sizes
from .scoring import scoring
from .synthetic import IGNORE

KEY_SENTENCE = (" the pass key is ", ". remember it. ")      # the key goes between the two parts
QUESTION = " what is the pass key? the pass key is "
REPEAT_FILLER = "the grass is green. the sky is blue. the sun is yellow. here we go. there and back again. "
FILLERS = ("corpus", "repeat")
#: Depths that `evaluate` averages over (and `evaluate_grid`'s default).
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


@functools.lru_cache(maxsize=1)
def shipped_corpus() -> CharCorpus:
    """The shipped corpus, built once: its vocabulary and its train/validation texts."""
    return CharCorpus.stdlib(train_length=1)


@dataclass
class PasskeyTask:
    """Passkey retrieval in filler text (see the module docstring for the format).

    Args:
        train_length: L, the longest text (in characters) of a training batch.
        digits: the length of the pass key.
        filler: "repeat" (Landmark's repeated sentences) or "corpus" (the shipped text).
        min_train_length: the shortest training text (raised to `min_length`, the template's
            size, when smaller).
    """

    train_length: int = 128
    digits: int = 2
    filler: str = "repeat"
    min_train_length: int = 1

    def __post_init__(self):
        for arg in ("train_length", "digits", "min_train_length"):
            value = getattr(self, arg)
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{arg} must be an int; got {value!r}")
            if value < 1:
                raise ValueError(f"{arg} must be >= 1; got {value}")
        if self.filler not in FILLERS:
            raise ValueError(f"filler must be one of {FILLERS}; got {self.filler!r}")
        if self.train_length < self.min_length:
            raise ValueError(f"train_length must be >= {self.min_length} (the key sentence, the question and "
                             f"{self.digits} digits with no filler); got {self.train_length}")
        if self.min_train_length > self.train_length:
            raise ValueError(f"min_train_length={self.min_train_length} must be <= train_length={self.train_length}")
        self.corpus = shipped_corpus()
        self._pre, self._post = (self.corpus.encode(s) for s in KEY_SENTENCE)
        self._question = self.corpus.encode(QUESTION)
        self._digit_ids = self.corpus.encode("0123456789")
        self._repeat = self.corpus.encode(REPEAT_FILLER)

    # -- format ------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.corpus.vocab_size

    @property
    def min_length(self) -> int:
        """The shortest text: key sentence (with the key) + question + answer (the key again), no filler."""
        return len(KEY_SENTENCE[0]) + len(KEY_SENTENCE[1]) + len(QUESTION) + 2 * self.digits

    def seq_len(self, length: int, causal: bool) -> int:
        """Tokens the model sees: `length` itself (the filler is sized to fit)."""
        return length

    def decode(self, ids) -> str:
        return self.corpus.decode(ids)

    def filler_length(self, length: int, causal: bool) -> int:
        """F = n + [causal] - (key sentence + question + answer): the text has n + 1 characters when shifted."""
        return length + int(causal) - self.min_length

    # -- batches -----------------------------------------------------------------
    def train_batch(self, batch_size: int, generator: torch.Generator, causal: bool) -> tuple[Tensor, Tensor]:
        """A batch at a length drawn uniformly from [max(min_train_length, min_length), L], depths per sample."""
        check_sizes(batch_size=batch_size)
        lo = max(self.min_train_length, self.min_length)
        n = int(torch.randint(lo, self.train_length + 1, (1,), generator=generator))
        return self.batch(batch_size, n, generator, causal)

    def batch(self, batch_size: int, length: int, generator: torch.Generator, causal: bool, *,
              depth: float | None = None, split: str = "train") -> tuple[Tensor, Tensor]:
        """inputs [B, length] long and targets [B, length] long (IGNORE except at the key digits).

        depth: the key sentence's place as a fraction of the filler (k = round(depth * F));
        None draws k uniformly from 0..F for every sample. split: which corpus text the filler
        comes from ("train" or "valid"; the "repeat" filler ignores it).
        """
        if not isinstance(length, int) or isinstance(length, bool) or length < self.min_length:
            raise ValueError(f"length must be an int >= {self.min_length} (digits={self.digits}); got {length!r}")
        if depth is not None and (not isinstance(depth, (int, float)) or isinstance(depth, bool)
                                  or not 0.0 <= depth <= 1.0):
            raise ValueError(f"depth must be a number in [0, 1] or None; got {depth!r}")
        if split not in ("train", "valid"):
            raise ValueError(f"split must be 'train' or 'valid'; got {split!r}")
        B, F = batch_size, self.filler_length(length, causal)
        key = torch.randint(0, 10, (B, self.digits), generator=generator)                     # (B, digits)
        answer = self._digit_ids[key]                                                          # token ids
        sentence = torch.cat([self._pre.expand(B, -1), answer, self._post.expand(B, -1)], 1)  # (B, S)
        if depth is None:
            k = torch.randint(0, F + 1, (B, 1), generator=generator)
        else:
            k = torch.full((B, 1), round(depth * F))
        body = self._insert(self._filler(B, F, generator, split), sentence, k)               # (B, F + S)
        text = torch.cat([body, self._question.expand(B, -1), answer], 1)                     # (B, n + causal)
        target = torch.full_like(text, IGNORE)
        target[:, -self.digits:] = answer
        if causal:
            return text[:, :-1], target[:, 1:]
        return text.masked_fill(target != IGNORE, MASK_ID), target

    def _filler(self, B: int, F: int, generator: torch.Generator, split: str) -> Tensor:
        """[B, F] filler ids: corpus windows from random starts, or the repeated sentences from a random offset."""
        if self.filler == "repeat":
            source = self._repeat.repeat(F // len(self._repeat) + 2)
            start = torch.randint(0, len(self._repeat), (B, 1), generator=generator)
        else:
            source = self.corpus.train_ids if split == "train" else self.corpus.valid_ids
            if F > len(source):
                raise ValueError(f"length needs {F} filler characters; the {split} text has {len(source)}")
            start = torch.randint(0, len(source) - F + 1, (B, 1), generator=generator)
        return source[start + torch.arange(F)]

    @staticmethod
    def _insert(filler: Tensor, sentence: Tensor, k: Tensor) -> Tensor:
        """filler[:k] + sentence + filler[k:] per row ([B, F], [B, S], k [B, 1]) -> [B, F + S]."""
        F, S = filler.shape[1], sentence.shape[1]
        t = torch.arange(F + S).expand(filler.shape[0], -1)
        in_sentence = (t >= k) & (t < k + S)
        from_filler = filler.gather(1, torch.where(t < k, t, t - S).clamp(0, max(F - 1, 0))) if F else sentence
        return torch.where(in_sentence, sentence.gather(1, (t - k).clamp(0, S - 1)), from_filler)

    # -- evaluation --------------------------------------------------------------
    @scoring
    def score(self, model, length: int, depth: float, *, n_samples: int = 128, batch_size: int = 64,
              seed: int = 0, device=None) -> dict:
        """{accuracy, digit_accuracy} of `n_samples` texts of `length` with the key at `depth` (validation filler)."""
        if not isinstance(n_samples, int) or isinstance(n_samples, bool) or n_samples < 1:
            raise ValueError(f"n_samples must be a positive int; got {n_samples!r}")
        g = torch.Generator().manual_seed((seed * 1_000_003 + length) * 1_009 + round(1000 * depth))
        right = exact = 0
        for start in range(0, n_samples, batch_size):
            x, y = self.batch(min(batch_size, n_samples - start), length, g, model.causal, depth=depth, split="valid")
            y = y.to(device)
            asked = y != IGNORE
            hit = (model(x.to(device)).argmax(-1) == y)[asked].view(-1, self.digits)          # (b, digits)
            right, exact = right + int(hit.sum()), exact + int(hit.all(1).sum())
        return {"accuracy": exact / n_samples, "digit_accuracy": right / (n_samples * self.digits)}

    @scoring
    def evaluate(self, model, length: int, *, depths=DEPTHS, n_samples: int = 128, batch_size: int = 64,
                 seed: int = 0, device=None) -> dict:
        """The Task protocol's score at one length: `score` averaged over `depths` (n_samples each)."""
        cells = [self.score(model, length, d, n_samples=n_samples, batch_size=batch_size, seed=seed, device=device)
                 for d in _depths(depths)]
        return {m: sum(c[m] for c in cells) / len(cells) for m in ("accuracy", "digit_accuracy")}

    @scoring
    def evaluate_grid(self, model, lengths, depths=DEPTHS, *, n_samples: int = 128, batch_size: int = 64,
                      seed: int = 0, device=None):
        """One row per (length, depth): {length, x_train, depth, accuracy, digit_accuracy}, for a heat map."""
        from ..table import Table
        rows = Table()
        for n in lengths:
            for d in _depths(depths):
                cell = self.score(model, n, d, n_samples=n_samples, batch_size=batch_size, seed=seed, device=device)
                rows.append({"length": n, "x_train": round(n / self.train_length, 3), "depth": d, **cell})
        return rows


def _depths(depths) -> list:
    depths = list(depths)
    if not depths or not all(isinstance(d, (int, float)) and not isinstance(d, bool) and 0 <= d <= 1 for d in depths):
        raise ValueError(f"depths must be a non-empty list of numbers in [0, 1]; got {depths!r}")
    return [float(d) for d in depths]
