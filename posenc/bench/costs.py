"""What a scheme costs: training-step time relative to NoPE, and Shaw's activation memory.

Timings vary from machine to machine and run to run: they are printed as ratios
measured in one process, interleaved round by round, never asserted in tests.
"""
from __future__ import annotations

import statistics

import torch

from .timing import interleaved_times
from ..host import host_checked
from ..model import build_model, lm_loss
from ..schemes.relative import clipped_relative_positions, gather_relative, spread_relative
from ..table import Table


def step_time_ratios(schemes, *, vocab_size: int = 64, seq_len: int = 128, batch_size: int = 16, causal: bool = True,
                     rounds: int = 5, steps: int = 3, model_kwargs: dict | None = None, device: str = "cpu") -> Table:
    """Median seconds per training step (forward, loss, backward, AdamW) and the ratio to NoPE.

    Schemes are timed in turns, `rounds` times `steps` steps each, so drifts of the
    machine's load hit all of them alike. Rows: {scheme, ms_per_step, vs_nope}.
    """
    schemes = ["nope"] + [s for s in schemes if s != "nope"]
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, vocab_size, (batch_size, seq_len), generator=g).to(device)
    y = torch.randint(0, vocab_size, (batch_size, seq_len), generator=g).to(device)
    runs = {}
    for name in schemes:
        torch.manual_seed(0)
        model = build_model(name, vocab_size, causal=causal, max_len=seq_len, **(model_kwargs or {})).to(device).train()
        runs[name] = train_steps(model, x, y, steps)
    times = {n: statistics.median(t) / steps for n, t in interleaved_times(runs, rounds=rounds, device=device).items()}
    return Table({"scheme": n, "ms_per_step": 1000 * t, "vs_nope": t / times["nope"]} for n, t in times.items())


def train_steps(model, x, y, steps: int = 1, *, dtype=None):
    """A callable doing `steps` training steps (forward, LM loss, backward, AdamW) on one batch, the forward
    under autocast to `dtype` (None: full precision). The batch's token values are checked once, here, so that
    a timed step does not read them back from a GPU (`host_checked`), as the runner's steps do not."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if hasattr(model, "check_inputs"):                     # posenc's models (x-transformers' have no such check)
        model.check_inputs(x)

    def run():
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            with torch.autocast(x.device.type, dtype=dtype, enabled=dtype is not None), host_checked():
                loss = lm_loss(model(x), y)
            loss.backward()
            opt.step()
    return run


def shaw_terms_naive(q, probs, table_k, table_v, ids):
    """Shaw's eqs. (3), (5) with the [Q, K, d] tensors a^K, a^V built explicitly (the reference)."""
    a_k, a_v = table_k[ids], table_v[ids]                                       # (Q, K, d) each
    return torch.einsum("bhqd,qkd->bhqk", q, a_k), torch.einsum("bhqk,qkd->bhqd", probs, a_v)


def shaw_terms_gather(q, probs, table_k, table_v, ids):
    """The same two terms by projecting q onto the (2k+1, d) table, then gathering / scattering."""
    n = table_k.shape[0]
    return gather_relative(q @ table_k.T, ids), spread_relative(probs, ids, n) @ table_v


def saved_bytes(fn, *args) -> int:
    """Bytes of the distinct storages autograd saves for the backward pass while `fn(*args)` runs."""
    storages = {}

    def pack(t):
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    for t in out if isinstance(out, tuple) else (out,):                        # the outputs are kept too
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def shaw_memory_table(lengths, *, batch_size: int = 8, n_heads: int = 8, head_dim: int = 64, k: int = 16) -> Table:
    """Activation bytes of Shaw's two position terms, naive [N, N, d] vs gather, per length N."""
    rows = Table()
    for n in lengths:
        q = torch.randn(batch_size, n_heads, n, head_dim, requires_grad=True)
        probs = torch.rand(batch_size, n_heads, n, n, requires_grad=True)
        tk = torch.randn(2 * k + 1, head_dim, requires_grad=True)
        tv = torch.randn(2 * k + 1, head_dim, requires_grad=True)
        ids = clipped_relative_positions(n, n, k)
        naive = saved_bytes(shaw_terms_naive, q, probs, tk, tv, ids)
        ours = saved_bytes(shaw_terms_gather, q, probs, tk, tv, ids)
        rows.append({"N": n, "naive_MiB": naive / 2 ** 20, "gather_MiB": ours / 2 ** 20, "naive/gather": naive / ours})
    return rows
