"""How every task scores a model: in eval mode, without gradients, the model's mode restored after."""
from __future__ import annotations

import functools

import torch


def scoring(method):
    """Decorate a task's scoring method (`evaluate`, `score`, `accuracy`, ...): the model scores in eval mode
    under `torch.no_grad()` and goes back to the mode it had, so a score taken between training steps sees
    no dropout and the training after it keeps its own. A model that is not an `nn.Module` (a stand-in
    function) is only called under `no_grad`."""
    @functools.wraps(method)
    def scored(self, model, *args, **kwargs):
        if not isinstance(model, torch.nn.Module):
            with torch.no_grad():
                return method(self, model, *args, **kwargs)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                return method(self, model, *args, **kwargs)
        finally:
            model.train(was_training)
    return scored
