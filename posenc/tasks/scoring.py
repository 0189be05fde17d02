"""How every task scores a model: in eval mode, without gradients, the model's mode restored after."""
from __future__ import annotations

import contextlib
import functools
import inspect

import torch

from ..attention import check_sizes


@contextlib.contextmanager
def scoring_mode(model):
    """Inside: `model` in eval mode under `torch.no_grad()`; after: back in the mode it had. A model that is not
    an `nn.Module` (a stand-in function) only gets the `no_grad`."""
    if not isinstance(model, torch.nn.Module):
        with torch.no_grad():
            yield model
        return
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        model.train(was_training)


#: Arguments of a scoring method that count something: each must be a positive int when given (not None).
COUNTS = ("length", "batch_size", "n_samples", "n_batches")


def scoring(method):
    """Decorate a task's scoring method (`evaluate`, `score`, `accuracy`, ...): the model scores in eval mode
    under `torch.no_grad()` and goes back to the mode it had (`scoring_mode`), so a score taken between
    training steps sees no dropout and the training after it keeps its own. The method's counts (`COUNTS`:
    length, batch_size, ...) are checked first, so a bad one is an error naming it, not a failure in a slice."""
    signature = inspect.signature(method)
    counted = [name for name in COUNTS if name in signature.parameters]

    @functools.wraps(method)
    def scored(self, model, *args, **kwargs):
        if counted:
            given = signature.bind(self, model, *args, **kwargs).arguments
            check_sizes(**{name: given[name] for name in counted if given.get(name) is not None})
        with scoring_mode(model):
            return method(self, model, *args, **kwargs)
    return scored
