"""A generated sentiment task where only word order decides the label ("A but B").

Each sentence of `length` tokens holds two sentiment phrases around the word "but",
filler words everywhere else:

    [fillers] A [fillers] but [fillers] B [fillers],   phrase = word | not word

Its label is the polarity of the phrase *after* "but" (as in "dull but moving"), where
"not" directly before a word flips it. Phrase A always has the opposite polarity to
B. Swapping A and B gives a sentence with the same words and the opposite label, and
both are equally likely, so any bag-of-words model (and any Transformer without
positions) is at exactly 50%: the task measures whether a model uses order
(which phrase follows "but") and adjacency ("not" right before a word).

By default every training batch is fresh, so a model that trains long enough learns
the rule exactly. With `n_train` it trains on one fixed set of that many sentences
(drawn from `TRAIN_SET_SEED`, the same set for every model and seed), as a real
classification data set would be, and is scored on fresh sentences: accuracy then
measures how well a model generalises the rule from few examples.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..model import classification_loss  # noqa: F401  (re-exported: the loss_fn for this module's tasks)
from .scoring import scoring

PAD, BUT, NOT = 0, 1, 2
N_SPECIAL = 3
#: Generator seed of the fixed training set (`n_train`); evaluation draws from its own seed (12345).
TRAIN_SET_SEED = 2020


@dataclass
class ContrastTask:
    """Binary "A but B" classification of fixed-length generated sentences.

    Args:
        length: tokens per sentence (>= 5: two negated phrases and "but").
        n_sentiment: sentiment words per polarity.
        n_fillers: neutral filler words.
        negation: put "not" before each phrase with probability 1/2.
        n_train: train on one fixed set of this many sentences (batches sampled from it with
            replacement); None (the default) draws fresh sentences for every batch.
    """

    length: int = 16
    n_sentiment: int = 8
    n_fillers: int = 24
    negation: bool = True
    num_classes: int = 2
    n_train: int | None = None

    def __post_init__(self):
        if not isinstance(self.length, int) or self.length < 5:
            raise ValueError(f"length must be an int >= 5; got {self.length!r}")
        for arg in ("n_sentiment", "n_fillers"):
            if not isinstance(getattr(self, arg), int) or getattr(self, arg) < 1:
                raise ValueError(f"{arg} must be a positive int; got {getattr(self, arg)!r}")
        if self.n_train is not None and (not isinstance(self.n_train, int) or isinstance(self.n_train, bool)
                                         or self.n_train < 1):
            raise ValueError(f"n_train must be None or a positive int; got {self.n_train!r}")
        self._train_set = None

    @property
    def vocab_size(self) -> int:
        return N_SPECIAL + 2 * self.n_sentiment + self.n_fillers

    def word(self, polarity: int, index: int) -> int:
        """Token id of sentiment word `index` of `polarity` (1 positive, 0 negative)."""
        return N_SPECIAL + (1 - polarity) * self.n_sentiment + index

    def sentence(self, label: int, g: torch.Generator, length: int | None = None) -> list[int]:
        """One sentence whose after-"but" phrase has polarity `label`."""
        length = self.length if length is None else length
        if isinstance(length, bool) or not isinstance(length, int) or length < 5:
            raise ValueError(f"length must be None or an int >= 5; got {length!r}")
        phrases = []
        for effective in (1 - label, label):                                   # A, then B
            negated = self.negation and bool(torch.randint(2, (1,), generator=g))
            raw = effective ^ int(negated)
            w = self.word(raw, int(torch.randint(self.n_sentiment, (1,), generator=g)))
            phrases.append([NOT, w] if negated else [w])
        n_fill = length - len(phrases[0]) - len(phrases[1]) - 1
        fill = (N_SPECIAL + 2 * self.n_sentiment + torch.randint(self.n_fillers, (n_fill,), generator=g)).tolist()
        c1, c2, c3 = sorted(torch.randint(n_fill + 1, (3,), generator=g).tolist())   # gap boundaries
        return fill[:c1] + phrases[0] + fill[c1:c2] + [BUT] + fill[c2:c3] + phrases[1] + fill[c3:]

    def batch(self, batch_size: int, g: torch.Generator, length: int | None = None) -> tuple[Tensor, Tensor]:
        """tokens [batch, length] long, labels [batch] long (balanced in expectation)."""
        labels = torch.randint(2, (batch_size,), generator=g)
        tokens = torch.tensor([self.sentence(int(y), g, length) for y in labels])
        return tokens, labels

    def train_set(self) -> tuple[Tensor, Tensor]:
        """The fixed training sentences and labels (`n_train` of them, from `TRAIN_SET_SEED`)."""
        if self.n_train is None:
            raise ValueError("this task has no fixed training set: n_train is None (fresh batches)")
        if self._train_set is None:
            self._train_set = self.batch(self.n_train, torch.Generator().manual_seed(TRAIN_SET_SEED))
        return self._train_set

    def train_batch(self, batch_size: int, g: torch.Generator, causal: bool = False) -> tuple[Tensor, Tensor]:
        """The `posenc.train` interface: fresh sentences, or a sample (with replacement) of the fixed
        training set when `n_train` is set; `causal` is ignored (one label per sentence)."""
        if self.n_train is None:
            return self.batch(batch_size, g)
        x, y = self.train_set()
        pick = torch.randint(self.n_train, (batch_size,), generator=g)
        return x[pick], y[pick]

    @scoring
    def evaluate(self, model, *, n_samples: int = 1000, length: int | None = None, seed: int = 12345,
                 device=None) -> dict:
        """Accuracy of `model.classify` on `n_samples` fresh sentences (a held-out generator seed)."""
        x, y = self.batch(n_samples, torch.Generator().manual_seed(seed), length)
        device = device or next(model.parameters()).device
        pred = model.classify(x.to(device)).argmax(-1).cpu()
        return {"accuracy": (pred == y).float().mean().item()}

    def decode(self, tokens: Tensor) -> str:
        """Readable words: +k / -k sentiment words, f filler, "not", "but"."""
        out = []
        for t in tokens.tolist():
            if t < N_SPECIAL:
                out.append(("<pad>", "but", "not")[t])
            elif t < N_SPECIAL + 2 * self.n_sentiment:
                i = t - N_SPECIAL
                out.append(f"+{i}" if i < self.n_sentiment else f"-{i - self.n_sentiment}")
            else:
                out.append("f")
        return " ".join(out)
