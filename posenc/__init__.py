"""posenc: Transformer positional encodings, derived, implemented and trained.

    >>> import torch, posenc
    >>> model = posenc.build_model("nope", vocab_size=32, causal=True)
    >>> model(torch.randint(0, 32, (8, 64))).shape       # tokens [batch, seq] -> logits [batch, seq, vocab]
    torch.Size([8, 64, 32])

Layers, imported one way, down: `compiled` (torch.compile with an eager fallback) and `scheme`
(the hooks and the registry) <- `schemes/` (one module per family, registered on import) <-
`attention`, `model` <- `tasks/`, `vision/` <- `runs/` (spec, store, training, runner),
`analysis`, `plots`, `bench/`; `book` (what a chapter glues for the site) imports nothing of posenc.
"""
import sys as _sys

from . import schemes
from .scheme import SCHEMES, PositionContext, Scheme, get_scheme, register
from .attention import Attention
from .model import Transformer, build_model
from .table import Table
from . import tasks, vision, analysis
from .runs.train import TrainConfig, train
from .runs.evaluate import length_table, run
from .runs.profiles import (chapter_claims, load_claims, load_results, record_claim, resolve, save_claim,
                             save_results)
from . import runs, functional

# Each scheme module is also reachable at its short, documented path (`posenc.rotary`,
# `posenc.absolute`, ...), the contract's spelling, without a hand-kept list.
for _name in schemes.MODULES:
    _module = _sys.modules[f"{__name__}.schemes.{_name}"]
    _sys.modules.setdefault(f"{__name__}.{_name}", _module)
    globals().setdefault(_name, _module)

__all__ = ["plots", "tasks", "vision", "runs", "analysis", "functional", "schemes", "SCHEMES", "build_model",
           "get_scheme", "register", "Scheme", "PositionContext", "Attention", "Transformer", "TrainConfig", "train",
           "run", "length_table", "Table", "resolve", "save_results", "load_results", "save_claim", "record_claim",
           "load_claims", "chapter_claims"]
__version__ = "0.2.0"

#: Modules loaded when first used: `plots` (matplotlib) and `interactive` (plotly figures). A training
#: process (a runner's worker, a GPU job) never draws, and starts about a second sooner without them.
_ON_FIRST_USE = ("plots", "interactive")


def __getattr__(name: str):
    if name in _ON_FIRST_USE:
        import importlib
        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_ON_FIRST_USE))
