import os
import tempfile

import pytest
import torch

# The ci tier is recomputed from an empty store under the tests (nbval's kernels inherit
# this variable): a chapter that falls back to ci (its full and paper tiers not stored in
# full) is compared with numbers made afresh, never with the committed ci records.
# `paper` and `full` records are read from results/.
os.environ.setdefault("POSENC_CI_STORE", tempfile.mkdtemp(prefix="posenc-ci-store-"))

import posenc  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def small_model(scheme="nope", causal=True, vocab=23, **kw):
    kw = {"d_model": 32, "n_heads": 4, "n_layers": 2, "max_len": 64, **kw}
    return posenc.build_model(scheme, vocab, causal=causal, **kw).eval()


def assert_no_causal_leak(model, vocab=23, n=20, cut=12):
    """Changing tokens from `cut` on leaves the outputs before `cut` unchanged, and changes those after."""
    tokens = torch.randint(0, vocab, (2, n))
    changed = tokens.clone()
    changed[:, cut:] = torch.randint(0, vocab, (2, n - cut))
    a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :cut], b[:, :cut])
    assert not torch.allclose(a[:, cut:], b[:, cut:])


def skip_bidirectional_if_causal_only(scheme, causal):
    """A `causal_only` scheme (xPos, CoPE) refuses causal=False (test_model checks that it does): skip that case."""
    if not causal and posenc.SCHEMES[scheme].causal_only:
        pytest.skip(f"{scheme} is causal_only")
