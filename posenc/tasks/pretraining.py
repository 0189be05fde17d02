"""BERT-style pre-training at the book's scale: masked characters plus a [CLS] objective.

Each example is a window of `train_length` characters of `CharCorpus`; with
probability 1/2 its second half is replaced by the second half of another random
window. The model reads `[CLS] c_1 ... c_L` and minimises (BERT's pre-training loss,
with next-sentence prediction made character-level)

    L = L_MLM + L_CLS,
    L_MLM = mean over masked i of -log p(c_i | masked input)   (CharCorpus.mask: 15%),
    L_CLS = -log p(y | h_[CLS]),   y = 1 if the second half continues the first.

Targets travel as one long tensor [B, 1 + L] so that `posenc.train` can batch them:
column 0 is y, columns 1.. are the masked-character targets (IGNORE elsewhere).

`cls_task="noise_tail"` swaps the [CLS] objective for one a small model learns: with
probability 1/2 the last L/4 characters are replaced by uniformly random characters
(y = 0) and [CLS] must tell. The evidence sits at the far end of the window, away
from [CLS]'s own position, which is what TUPE's [CLS] reset is about. The replaced
characters are not MLM targets (noise cannot be predicted).

Uniform noise also differs from text in its character frequencies, so a model can find
it by counting characters, wherever they sit. `cls_task="shuffled_half"` keeps the
counts: with probability 1/2 the last L/2 characters are put in a random order (y = 0).
The window then holds the same characters as an intact one, so any rule that ignores
order, a bag of characters or a model without positions included, scores exactly 1/2,
and [CLS] has to read the order of the half of the window away from it. (A last
quarter shuffled, like the noise, is barely learned at the book's paper scale: 0.55 and
0.54 [CLS] accuracy after 3000 steps, BERT-A and TUPE-A, seed 0; a half, 0.96 and 0.93.)
`cls_task="shuffled_span"` shuffles L/2 consecutive characters that start anywhere in
the window (offset uniform in 0..L/2), so the evidence has no fixed place: a [CLS] that
looks at a fixed part of the window by position gains less there.
The shuffled characters are not MLM targets. A permutation that leaves them as they
were is replaced by a rotation by one, which changes every sequence but one whose
characters are all equal; that one has a single order, so its window stays intact
(y = 1). Every y = 0 window therefore differs from the text.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..model import IGNORE, lm_loss
from .corpus import MASK_ID, CharCorpus
from .scoring import scoring

CLS_TASKS = ("continuation", "noise_tail", "shuffled_half", "shuffled_span")


@dataclass
class MaskedLMWithCLS:
    """Masked-LM batches with a [CLS] continuation label, on a `CharCorpus`."""

    corpus: CharCorpus
    swap_prob: float = 0.5
    cls_task: str = "continuation"

    def __post_init__(self):
        if self.cls_task not in CLS_TASKS:
            raise ValueError(f"cls_task must be one of {CLS_TASKS}; got {self.cls_task!r}")
        if not isinstance(self.corpus, CharCorpus):
            raise TypeError(f"corpus must be a posenc.tasks.CharCorpus; got {type(self.corpus).__name__}")
        if not 0.0 <= self.swap_prob <= 1.0:
            raise ValueError(f"swap_prob must lie in [0, 1]; got {self.swap_prob!r}")
        if self.corpus.train_length < 4:
            raise ValueError(f"corpus.train_length must be >= 4; got {self.corpus.train_length}")

    @property
    def vocab_size(self) -> int:
        return self.corpus.vocab_size

    @property
    def train_length(self) -> int:
        return self.corpus.train_length

    def batch(self, ids: Tensor, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Inputs [B, L] (masked) and targets [B, 1 + L] (label, masked targets) from the text `ids`."""
        if self.cls_task != "continuation":
            return self._tail_batch(ids, batch_size, generator)
        L, half = self.train_length, self.train_length // 2
        start = torch.randint(0, len(ids) - L, (2, batch_size), generator=generator)   # (2, B)
        windows = torch.stack([ids[s: s + L] for s in start[0].tolist()])              # (B, L)
        other = torch.stack([ids[s + half: s + L] for s in start[1].tolist()])         # (B, L - half)
        swap = torch.rand(batch_size, generator=generator) < self.swap_prob            # (B,)
        windows[swap, half:] = other[swap]
        inputs, targets = self.corpus.mask(windows, generator)
        return inputs, torch.cat([(~swap).long()[:, None], targets], 1)

    def _tail_batch(self, ids: Tensor, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """y = 1 for an intact window, 0 when part of it is replaced: the last L/4 characters by uniform noise
        ("noise_tail"), the last L/2 by themselves in a random order ("shuffled_half"), or L/2 consecutive ones
        from a uniform offset in 0..L/2 likewise ("shuffled_span"); the replaced characters are not MLM targets."""
        L = self.train_length
        n = max(1, L // 4) if self.cls_task == "noise_tail" else L // 2
        start = torch.randint(0, len(ids) - L, (batch_size,), generator=generator)      # (B,)
        windows = torch.stack([ids[s: s + L] for s in start.tolist()])                 # (B, L)
        if self.cls_task == "noise_tail":
            new = torch.randint(MASK_ID + 1, self.vocab_size, (batch_size, n), generator=generator)
        else:
            order = torch.rand(batch_size, n, generator=generator).argsort(-1)         # one permutation per row
        offset = (torch.randint(0, L - n + 1, (batch_size, 1), generator=generator) if self.cls_task == "shuffled_span"
                  else torch.full((batch_size, 1), L - n))
        where = offset + torch.arange(n)                                                # (B, n): the replaced slots
        old = windows.gather(1, where)
        if self.cls_task != "noise_tail":
            new = old.gather(1, order)
            kept = (new == old).all(1)
            new[kept] = old[kept].roll(1, dims=1)                                       # changes all but c c ... c
        swap = torch.rand(batch_size, generator=generator) < self.swap_prob            # (B,)
        if self.cls_task != "noise_tail":
            swap &= (new != old).any(1)                                                 # one order only: intact
        windows[swap] = windows[swap].scatter(1, where[swap], new[swap])
        inputs, targets = self.corpus.mask(windows, generator)
        targets[swap] = targets[swap].scatter(1, where[swap], IGNORE)
        return inputs, torch.cat([(~swap).long()[:, None], targets], 1)

    def train_batch(self, batch_size: int, generator: torch.Generator, causal: bool = False):
        """The `posenc.train` interface; bidirectional only."""
        if causal:
            raise ValueError("MaskedLMWithCLS trains bidirectional models only; got causal=True")
        return self.batch(self.corpus.train_ids, batch_size, generator)

    @scoring
    def evaluate(self, model, *, n_batches: int = 8, batch_size: int = 64, seed: int = 0, device=None) -> dict:
        """Validation MLM loss (nats/char), [CLS] loss and accuracy on fixed held-out batches."""
        g = torch.Generator().manual_seed(seed)
        mlm = cls = acc = 0.0
        for _ in range(n_batches):
            x, y = self.batch(self.corpus.valid_ids, batch_size, g)
            parts = loss_parts(model, x.to(device), y.to(device))
            mlm, cls, acc = mlm + parts["mlm"].item(), cls + parts["cls"].item(), acc + parts["acc"].item()
        return {"mlm": mlm / n_batches, "cls": cls / n_batches, "cls_acc": acc / n_batches}


def loss_parts(model, x: Tensor, y: Tensor) -> dict:
    """L_MLM, L_CLS and the [CLS] accuracy, from one pass of a model with cls_token and num_classes=2."""
    if getattr(model, "cls", None) is None or getattr(model, "classifier", None) is None:
        raise ValueError("model needs cls_token=True and num_classes=2 (build_model arguments)")
    h, _ = model.hidden_states(x)                                       # (B, 1 + L, D)
    logits = model.classifier(h[:, 0])                                  # (B, 2)
    return {"mlm": lm_loss(model.head(h[:, 1:]), y[:, 1:]),
            "cls": F.cross_entropy(logits.float(), y[:, 0]),
            "acc": (logits.argmax(-1) == y[:, 0]).float().mean()}


def pretraining_loss(model, x: Tensor, y: Tensor) -> Tensor:
    """L_MLM + L_CLS (the `loss_fn` of `posenc.train`)."""
    parts = loss_parts(model, x, y)
    return parts["mlm"] + parts["cls"]
