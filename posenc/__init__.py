"""posenc: Transformer positional encodings, derived, implemented and trained.

    >>> import posenc
    >>> model = posenc.build_model("nope", vocab_size=32, causal=True)
    >>> logits = model(tokens)          # tokens [batch, seq] -> [batch, seq, vocab]
"""
from . import plots, tasks
from .attention import Attention
from .evaluate import length_table, run
from .model import Transformer
from .profiles import load_claims, load_results, resolve, save_claim, save_results
from .registry import SCHEMES, build_model, get_scheme, register
from .scheme import PositionContext, Scheme
from .table import Table
from .train import TrainConfig, train
from . import alibi  # noqa: F401
from . import absolute, floater  # noqa: F401
from . import deberta, pretraining, tupe  # noqa: F401
from . import rotary  # noqa: F401
from . import bias, relative  # noqa: F401
from . import cnn, complex_order, tasks_order  # noqa: F401
from . import vision  # noqa: F401

__all__ = ["plots", "tasks", "SCHEMES", "build_model", "get_scheme", "register", "Scheme", "PositionContext", "Attention",
           "Transformer", "TrainConfig", "train", "run", "length_table", "Table", "resolve",
           "save_results", "load_results", "save_claim", "load_claims"]
__version__ = "0.1.0"
