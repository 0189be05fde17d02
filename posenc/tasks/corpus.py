"""Character-level language modelling on text that ships with the package.

The default corpus is `data/stdlib_docstrings.txt.gz`: the English docstrings of
CPython 3.11's standard library, one document per module (see
`scripts/build_corpus.py` for the exact selection and why). Its SHA-256 is pinned, so
every machine trains on the same 1.38 M characters. `CharCorpus.from_path` reads any
other UTF-8 text (e.g. a local WikiText-103) with the same code.

Split: documents (modules) are assigned to validation when their index is a multiple
of `valid_every` (10% by default), so no module straddles the split.

Evaluation follows the ALiBi paper (Press et al., 2022): the validation text is cut
into non-overlapping chunks of the evaluation length L_eval, each chunk is scored
on its own (every token predicted from the chunk prefix only), and the per-character
negative log-likelihood is averaged over all chunks. We report it in nats, as
perplexity exp(nll), and in bits per character nll / ln 2.
"""
from __future__ import annotations

import gzip
import hashlib
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from ..attention import check_sizes
from .scoring import scoring
from .synthetic import IGNORE

STDLIB_SHA256 = "47822cc2eb305dfa93c60bdc6cbeda4497469b1c4da5373506423fb4ff56e7eb"
DOC_SEP = "\f"
SPECIALS = ("<unk>", "<mask>")  # ids 0 and 1; characters follow
UNK, MASK_ID = 0, 1


def stdlib_text() -> str:
    """The pinned stdlib-docstring corpus; raises if the shipped bytes changed."""
    data = gzip.decompress(resources.files("posenc").joinpath("data/stdlib_docstrings.txt.gz").read_bytes())
    if hashlib.sha256(data).hexdigest() != STDLIB_SHA256:
        raise RuntimeError("posenc/data/stdlib_docstrings.txt.gz does not match its pinned SHA-256")
    return data.decode("ascii")


@dataclass
class CharCorpus:
    """A character corpus split into train/valid id tensors.

    Args:
        text: the whole corpus; documents separated by form feeds (``"\\f"``).
        train_length: context length L the model trains on.
        valid_every: every `valid_every`-th document goes to validation.
        mask_prob: fraction of characters masked for bidirectional (MLM) training.
    """

    text: str
    train_length: int = 128
    valid_every: int = 10
    mask_prob: float = 0.15

    def __post_init__(self):
        if not isinstance(self.text, str) or not self.text:
            raise ValueError("text must be a non-empty str (documents separated by form feeds)")
        if not isinstance(self.train_length, int) or isinstance(self.train_length, bool) or self.train_length < 1:
            raise ValueError(f"train_length must be a positive int; got {self.train_length!r}")
        if isinstance(self.valid_every, bool) or not isinstance(self.valid_every, int) or self.valid_every < 2:
            raise ValueError(f"valid_every must be an int >= 2; got {self.valid_every!r}")
        if isinstance(self.mask_prob, bool) or not isinstance(self.mask_prob, (int, float)) or not 0 <= self.mask_prob <= 1:
            raise ValueError(f"mask_prob must be a fraction in [0, 1] (0.15 masks 15%); got {self.mask_prob!r}")
        docs = self.text.split(DOC_SEP)
        train = DOC_SEP.join(d for i, d in enumerate(docs) if i % self.valid_every)
        valid = DOC_SEP.join(d for i, d in enumerate(docs) if not i % self.valid_every)
        if not valid or not train:
            raise ValueError(f"text must hold at least 2 documents separated by '\\f' (got {len(docs)}) "
                             "or be long enough to split")
        self.chars = sorted(set(train))
        self.stoi = {c: i + len(SPECIALS) for i, c in enumerate(self.chars)}
        self.train_ids, self.valid_ids = self.encode(train), self.encode(valid)
        if len(self.train_ids) < self.train_length + 2:
            raise ValueError(f"train_length={self.train_length} needs a training text of at least "
                             f"{self.train_length + 2} characters; got {len(self.train_ids)}")

    @classmethod
    def stdlib(cls, **kwargs) -> "CharCorpus":
        """The default corpus shipped with posenc."""
        return cls(stdlib_text(), **kwargs)

    @classmethod
    def from_path(cls, corpus_path: str | Path, **kwargs) -> "CharCorpus":
        """Any UTF-8 text file. Without form feeds it is split into 100 equal documents."""
        path = Path(corpus_path)
        if not path.is_file():
            raise ValueError(f"corpus_path {str(path)!r} is not a file")
        text = path.read_text(encoding="utf-8")
        if DOC_SEP not in text:
            step = math.ceil(len(text) / 100)
            text = DOC_SEP.join(text[i:i + step] for i in range(0, len(text), step))
        return cls(text, **kwargs)

    @property
    def vocab_size(self) -> int:
        return len(SPECIALS) + len(self.chars)

    def unigram_entropy(self, split: str = "valid") -> float:
        """H = -sum_c p(c) ln p(c) in nats, p the character frequencies of `split`: the loss of a
        model that ignores context (the plateau a masked-character model starts on)."""
        ids = {"train": self.train_ids, "valid": self.valid_ids}.get(split)
        if ids is None:
            raise ValueError(f"split must be 'train' or 'valid'; got {split!r}")
        p = torch.bincount(ids, minlength=self.vocab_size).double() / len(ids)
        p = p[p > 0]
        return float(-(p * p.log()).sum())

    def encode(self, s: str) -> Tensor:
        return torch.tensor([self.stoi.get(c, UNK) for c in s], dtype=torch.long)

    def decode(self, ids) -> str:
        itos = list(SPECIALS) + self.chars
        return "".join(itos[int(i)] for i in ids)

    # -- training --------------------------------------------------------------
    def train_batch(self, batch_size: int, generator: torch.Generator, causal: bool) -> tuple[Tensor, Tensor]:
        """Random windows of the training text: next-character (causal) or masked (MLM)."""
        check_sizes(batch_size=batch_size)
        L = self.train_length
        start = torch.randint(0, len(self.train_ids) - L, (batch_size,), generator=generator)   # last: s + L = len - 1
        windows = torch.stack([self.train_ids[s: s + L + 1] for s in start.tolist()])   # (B, L+1)
        if causal:
            return windows[:, :-1], windows[:, 1:]
        return self.mask(windows[:, :-1], generator)

    def mask(self, ids: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """BERT-style masking: targets at a `mask_prob` fraction of positions, inputs -> <mask>."""
        chosen = torch.rand(ids.shape, generator=generator) < self.mask_prob
        return ids.masked_fill(chosen, MASK_ID), ids.masked_fill(~chosen, IGNORE)

    # -- evaluation (ALiBi protocol) ------------------------------------------
    def eval_chunks(self, length: int, max_tokens: int | None = None) -> tuple[Tensor, Tensor]:
        """Non-overlapping chunks of the validation text: inputs and next-char targets [N, length].

        `max_tokens` keeps only the first `max_tokens` characters of the validation
        text, so that every evaluation length scores (nearly) the same text.
        """
        if length < 1:
            raise ValueError(f"length must be >= 1; got {length}")
        usable = len(self.valid_ids) - 1 if max_tokens is None else min(max_tokens, len(self.valid_ids) - 1)
        n = usable // length
        if n < 1:
            limit = "" if max_tokens is None or max_tokens >= len(self.valid_ids) - 1 else f" (max_tokens={max_tokens})"
            raise ValueError(f"the validation text scored ({usable} chars{limit}) is shorter than length={length}")
        ids = self.valid_ids[: n * length + 1]
        return ids[:-1].view(n, length), ids[1:].view(n, length)

    @scoring
    def evaluate(self, model, length: int, *, max_tokens: int | None = 32768, batch_size: int = 16,
                 seed: int = 0, device=None) -> dict:
        """Mean per-character NLL over non-overlapping chunks of `length` (ALiBi protocol).

        A bidirectional model is scored on masked characters instead (masks fixed by `seed`).
        """
        inputs, targets = self.eval_chunks(length, max_tokens)
        if not model.causal:
            inputs, targets = self.mask(inputs, torch.Generator().manual_seed(seed))
        nll, count = 0.0, 0
        for x, y in zip(inputs.split(batch_size), targets.split(batch_size)):
            logits = model(x.to(device)).float()
            nll += F.cross_entropy(logits.flatten(0, 1), y.to(device).flatten(), ignore_index=IGNORE,
                                   reduction="sum").item()
            count += int((y != IGNORE).sum())
        nll /= count
        return {"nll": nll, "ppl": math.exp(nll), "bpc": nll / math.log(2), "tokens": count}
