"""Tables built from positions live on the positions' device.

A CPU machine has no second device, but the `meta` device stands in for one: a
function that builds a constant on the CPU and combines it with meta positions raises,
exactly as it would with CUDA positions (chapter 02's sinusoidal table once did, and
only a GPU run found it). The last test runs every scheme on CUDA where there is one.
"""
import pytest
import torch

import posenc
from posenc.absolute import sinusoidal_at
from posenc.alibi import alibi_bias, alibi_slopes
from posenc.bias import t5_bucket
from posenc.deberta import log_bucket_position, relative_index
from posenc.relative import relative_ids
from posenc.rotary import apply_rope, rope_table
from posenc.scheme import summarise_positions

POS = torch.arange(8, device="meta")
REL = POS[None, :] - POS[:, None]
BUILDERS = {
    "sinusoidal_at": lambda: sinusoidal_at(POS, 16),
    "rope_table": lambda: rope_table(POS, 16)[0],
    "apply_rope": lambda: apply_rope(torch.empty(2, 8, 16, device="meta"), POS),
    "alibi_bias": lambda: alibi_bias(POS, alibi_slopes(4).to("meta")),
    "t5_bucket": lambda: t5_bucket(REL),
    "relative_ids": lambda: relative_ids(POS, POS, 4),
    "deberta relative_index": lambda: relative_index(POS, POS, 4),
    "deberta log buckets": lambda: log_bucket_position(REL, 4, 16),
}


@pytest.mark.parametrize("name", BUILDERS)
def test_tables_follow_the_positions_device(name):
    assert BUILDERS[name]().device.type == "meta"


@pytest.mark.parametrize("n", [1, 2, 5])
@pytest.mark.parametrize("dtype", [torch.long, torch.float32])
def test_summarising_positions_computes_where_they_are_until_its_one_read(n, dtype):
    """The summary is one transfer of (min, max, consecutive) from the positions' device. A constant made on the CPU
    and stacked with meta positions raises a device error before that read; the read itself is the only failure
    meta allows. The single-position case once built its constant on the CPU: every randomized-positions run on the
    H200 (2026-12-04) failed in the runner's one-token check (`check_random_positions`)."""
    with pytest.raises(NotImplementedError, match="meta tensor"):
        summarise_positions(torch.arange(n, dtype=dtype, device="meta"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("scheme", ["nope", "learned", "rope"])
def test_randomized_positions_train_on_cuda(scheme):
    from posenc.runs.train import check_random_positions
    model = posenc.build_model(scheme, 20, d_model=32, n_heads=4, n_layers=2, max_len=64, causal=True).cuda()
    check_random_positions(model, 64)
    tokens, positions = torch.randint(0, 20, (2, 16), device="cuda"), torch.randperm(64)[:16].sort().values
    model(tokens, positions=positions).float().logsumexp(-1).mean().backward()
    assert all(p.grad is None or p.grad.device.type == "cuda" for p in model.parameters())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("scheme", sorted(posenc.SCHEMES))
def test_every_scheme_trains_on_cuda(scheme):
    model = posenc.build_model(scheme, 20, d_model=32, n_heads=4, n_layers=2, causal=True).cuda()
    tokens = torch.randint(0, 20, (2, 16), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(tokens).float().logsumexp(-1).mean()
    loss.backward()
    assert all(p.grad is None or p.grad.device.type == "cuda" for p in model.parameters())
