"""`SCHEMES` (name -> Scheme class) and `build_model`, the package's front door."""
from __future__ import annotations

from .model import Transformer
from .nope import NoPE
from .scheme import Scheme

SCHEMES: dict[str, type[Scheme]] = {"nope": NoPE}


def register(name: str):
    """Class decorator adding a scheme to `SCHEMES` under `name`."""
    def add(cls: type[Scheme]) -> type[Scheme]:
        if not (isinstance(cls, type) and issubclass(cls, Scheme)):
            raise TypeError(f"register({name!r}) expects a Scheme subclass; got {cls!r}")
        SCHEMES[name] = cls
        return cls
    return add


def get_scheme(name: str) -> type[Scheme]:
    """The scheme class called `name`; a ValueError lists the known names otherwise."""
    if name not in SCHEMES:
        raise ValueError(f"unknown scheme {name!r}; known schemes: {', '.join(sorted(SCHEMES))}")
    return SCHEMES[name]


def build_model(scheme: str, vocab_size: int, *, d_model: int = 128, n_heads: int = 4, n_layers: int = 2,
                causal: bool, max_len: int = 512, d_ff: int | None = None, dropout: float = 0.0,
                cls_token: bool = False, tie_weights: bool = True, num_classes: int | None = None,
                **scheme_kwargs) -> Transformer:
    """A `Transformer` using the scheme called `scheme`.

    `max_len` is the longest sequence (tokens, plus [CLS] if any) that table-based
    schemes must serve; `scheme_kwargs` go to the scheme's constructor. The model is
    called as `model(tokens, positions=None)` -> logits [batch, seq, vocab].
    """
    if not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size must be a positive int; got {vocab_size!r}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False; got {causal!r}")
    for arg, value in (("d_model", d_model), ("n_heads", n_heads), ("n_layers", n_layers), ("max_len", max_len)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{arg} must be a positive int; got {value!r}")
    if d_model % n_heads:
        raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
    scheme_module = get_scheme(scheme)(d_model=d_model, n_heads=n_heads, n_layers=n_layers,
                                       max_len=max_len + int(cls_token), causal=causal, **scheme_kwargs)
    return Transformer(scheme_module, vocab_size, d_model=d_model, n_heads=n_heads, n_layers=n_layers,
                       causal=causal, d_ff=d_ff, dropout=dropout, cls_token=cls_token,
                       tie_weights=tie_weights, num_classes=num_classes)
