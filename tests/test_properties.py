"""Property-based test of the public API: any drawn input either works (finite logits of the right
shape) or raises ValueError/TypeError naming the problem, never anything else."""
import math

import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import posenc

SCHEMES = sorted(posenc.SCHEMES)
INTS = st.one_of(st.integers(-3, 70), st.sampled_from([True, 2.0, "8", None]))


@st.composite
def calls(draw):
    bad = []

    def pick(valid, invalid, name=None):
        """Mostly a valid value, sometimes (1 in 12) a bad one, noted under `name` in `bad`."""
        if draw(st.integers(0, 11)):
            return draw(st.sampled_from(valid))
        bad.append(name)
        return draw(st.sampled_from(invalid))

    model_kwargs = {
        "vocab_size": pick([5, 23, 40], [0, -2, True, 7.5, None], "vocab_size"),
        "d_model": pick([8, 16], [0, -4, True, 16.0], "d_model"),
        "n_heads": pick([1, 2, 4], [0, -1, 3], "n_heads"),
        "n_layers": pick([1, 2], [0, -1, 1.5], "n_layers"),
        "max_len": pick([16, 64, 4], [0, -3, True], "max_len"),      # 4: valid, but shorter than most draws
        "causal": pick([True, False], [1, None], "causal"),
        "d_ff": pick([None, 8], [0, -5, 3.5], "d_ff"),
        "dropout": pick([0.0, 0.1], [1.0, -0.2, float("nan")], "dropout"),
        "cls_token": pick([False, True], [0], "cls_token"),
        "num_classes": pick([None, 3], [0, -2], "num_classes"),
    }
    batch, seq = draw(st.integers(0, 3)), draw(st.integers(0, 20))
    token_dtype = pick([torch.long], [torch.int32, torch.float32, torch.bool], "tokens")
    high = pick([1, 5], [23, 45], "tokens?")              # ids up to 44: bad only where vocab_size is smaller
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))      # drawn, so every replay is the same
    tokens = torch.randint(0, high, (batch, seq), generator=gen).to(token_dtype)
    kind = draw(st.sampled_from(["none", "arange", "offset", "float", "uint8", "int8", "nan", "inf", "short",
                                 "2d", "bool", "negative", "huge", "half"]))
    positions = {
        "none": None, "arange": torch.arange(seq), "offset": torch.arange(seq) + draw(st.integers(0, 100)),
        "float": torch.arange(seq) * draw(st.floats(0.1, 3.0)), "uint8": torch.arange(seq, dtype=torch.uint8) + 200,
        "int8": torch.arange(seq, dtype=torch.int8), "nan": torch.full((seq,), math.nan),
        "inf": torch.full((seq,), math.inf), "short": torch.arange(max(0, seq - 1)), "2d": torch.arange(seq)[None],
        "bool": torch.ones(seq, dtype=torch.bool), "negative": torch.arange(seq) - 5, "huge": torch.arange(seq) + 10**6,
        "half": torch.arange(seq).half(),
    }[kind]
    return draw(st.sampled_from(SCHEMES)), model_kwargs, tokens, positions, kind, bad


#: The arguments whose name a refusal may give for a bad value of each drawn argument (a head count
#: that does not divide d_model is named as "d_model=... must be divisible by n_heads=...").
NAMES = {"vocab_size": ("vocab_size",), "d_model": ("d_model",), "n_heads": ("n_heads", "d_model"),
         "n_layers": ("n_layers",), "max_len": ("max_len",), "causal": ("causal",), "d_ff": ("d_ff",), "dropout": ("dropout",),
         "cls_token": ("cls_token",), "num_classes": ("num_classes",)}
#: Positions every scheme takes at any length within max_len: the default, and 0..n-1 given explicitly.
PLAIN = ("none", "arange")


@settings(max_examples=500, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(calls())
def test_build_and_forward_either_work_or_raise_an_error_naming_the_bad_argument(call):
    """A bad argument is refused, by name; a call with nothing bad works. The drawn values that are bad in
    some combinations only (max_len=4, token ids up to 44, positions other than the default) may be refused
    by any name the call has, but never with another exception."""
    scheme, kwargs, tokens, positions, kind, bad = call
    kwargs = dict(kwargs)
    vocab = kwargs.pop("vocab_size")
    bad_build = [b for b in bad if b in NAMES]
    cls = posenc.SCHEMES[scheme]
    refused_scheme = getattr(cls, "causal_only", False) and kwargs["causal"] is False
    # a [CLS] classifier under a causal mask would see only [CLS] itself: refused in any scheme
    refused_cls = kwargs["causal"] is True and kwargs.get("cls_token") is True and kwargs.get("num_classes") is not None
    try:
        model = posenc.build_model(scheme, vocab, **kwargs).eval()
    except (ValueError, TypeError) as err:
        message = str(err)
        if bad_build:
            assert any(n in message for b in bad_build for n in NAMES[b]) or (refused_cls and "cls_token" in message), \
                (bad_build, message)
        else:                       # nothing bad: only a causal-only scheme (xPos, CoPE) in an encoder, or a causal
            assert (refused_scheme or refused_cls) and "causal" in message, (scheme, kwargs, message)  # [CLS] classifier
        return
    assert not bad_build, f"{scheme} built with bad {bad_build}: {kwargs}"
    try:
        with torch.no_grad():
            out = model(tokens, positions)
    except (ValueError, TypeError) as err:
        message = str(err)
        assert "tokens" in message or "positions" in message or "position" in message or "max_len" in message, message
        plain = ("tokens" not in bad and (tokens.numel() == 0 or int(tokens.max()) < vocab) and kind in PLAIN
                 and tokens.shape[1] + kwargs["cls_token"] <= kwargs["max_len"])
        assert not plain, f"{scheme} refused a plain call: {message}"
        return
    assert out.shape == (tokens.shape[0], tokens.shape[1], vocab)
    assert torch.isfinite(out).all()

