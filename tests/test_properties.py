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
    def pick(valid, invalid):
        """Mostly a valid value, sometimes (1 in 12) a bad one, so that most draws reach the forward pass."""
        return draw(st.sampled_from(valid)) if draw(st.integers(0, 11)) else draw(st.sampled_from(invalid))

    model_kwargs = {
        "vocab_size": pick([5, 23, 40], [0, -2, True, 7.5, None]),
        "d_model": pick([8, 16], [0, -4, True, 16.0]),
        "n_heads": pick([1, 2, 4], [0, -1, 3]),
        "n_layers": pick([1, 2], [0, -1, 1.5]),
        "max_len": pick([16, 64], [0, -3, True, 4]),
        "causal": pick([True, False], [1, None]),
        "d_ff": pick([None, 8], [0, -5, 3.5]),
        "dropout": pick([0.0, 0.1], [1.0, -0.2, float("nan")]),
        "cls_token": pick([False, True], [0]),
        "num_classes": pick([None, 3], [0, -2]),
    }
    batch, seq = draw(st.integers(0, 3)), draw(st.integers(0, 20))
    token_dtype = pick([torch.long], [torch.int32, torch.float32, torch.bool])
    high = pick([1, 5], [23, 45])
    tokens = torch.randint(0, high, (batch, seq)).to(token_dtype)
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
    return draw(st.sampled_from(SCHEMES)), model_kwargs, tokens, positions


@settings(max_examples=500, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(calls())
def test_build_and_forward_either_work_or_raise_a_clear_error(call):
    scheme, kwargs, tokens, positions = call
    kwargs = dict(kwargs)
    vocab = kwargs.pop("vocab_size")
    try:
        model = posenc.build_model(scheme, vocab, **kwargs).eval()
    except (ValueError, TypeError) as err:
        assert str(err)                                   # a message that says something
        return
    try:
        with torch.no_grad():
            out = model(tokens, positions)
    except (ValueError, TypeError) as err:
        assert str(err)
        return
    assert out.shape == (tokens.shape[0], tokens.shape[1], vocab)
    assert torch.isfinite(out).all()
