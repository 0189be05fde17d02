import pytest
import torch

import posenc


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def small_model(scheme="nope", causal=True, vocab=23, **kw):
    kw = {"d_model": 32, "n_heads": 4, "n_layers": 2, "max_len": 64, **kw}
    return posenc.build_model(scheme, vocab, causal=causal, **kw).eval()
