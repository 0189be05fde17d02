"""The CUDA cost table: every scheme at a GPU-sized model, RoPE at LLaMA's shapes, bias schemes with and
without a materialised [heads, n, n] bias.

    python -m posenc.bench --only gpu --save results/bench/cuda.json     # on a CUDA machine

Three tables, each timed in one process, in turns, as every benchmark here:

* `gpu_scheme_costs`: one training step (forward, loss, backward, AdamW) under bf16 autocast of every
  scheme against NoPE, and the allocator's peak memory over the step, at d = 512, 8 heads, 4 layers,
  sequences of 1024 and 4096 tokens (`GPU_MODEL`, `GPU_SEQ_LENS`);
* `rope_llama_times`: `rotate` forward + backward in both layouts (and the half layout's compiled kernel)
  against transformers' LLaMA `apply_rotary_pos_emb` and the memory-bound floor y = x * c, on bf16 q, k of
  LLaMA-7B's attention shape [1, 32, n, 128] at n = 2048 and 16384 (`LLAMA_ROPE`). Liger-Kernel reports
  its fused RoPE 4.3x faster than transformers' at 2k and 10x at 16k; the goal here is within 1.5x of the
  floor;
* `bias_backend_costs`: ALiBi and T5 with the bias computed inside FlexAttention (`attention_backend =
  "flex"`) against the same model with the [H, n, n] tensor (`"sdpa"`) and against NoPE: training-step
  time and peak memory at n = 4096 and 16384 (`FLEX_SEQ_LENS`, batch 1). The goal: a bias scheme within
  1.1x of NoPE's peak memory.

Every function also runs on CPU at small sizes (that is how the tests check it); the sizes above are
for a GPU.
"""
from __future__ import annotations

import time
from typing import Any

import torch

from ..model import build_model
from ..table import Table
from .costs import train_steps
from .kernels import time_rope_candidates
from .timing import interleaved_times

#: The GPU-sized model of the cost table, and its sequence lengths.
GPU_MODEL = dict(d_model=512, n_heads=8, n_layers=4, batch_size=8)
GPU_SEQ_LENS = (1024, 4096)
#: LLaMA-7B's attention: 32 heads of 128 dims, one sequence.
LLAMA_ROPE: dict[str, Any] = dict(batch=1, heads=32, head_dim=128, seq_lens=(2048, 16384))
#: Sequence lengths of the FlexAttention memory comparison (batch 1).
FLEX_SEQ_LENS = (4096, 16384)
VOCAB = 256


#: A model whose second step (after the first, which compiles and warms up) takes longer than this is left
#: out of its length's timing, with the reason in its row: FLOATER's ODE, solved in many small kernels, could
#: spend the window's minutes at 4096 tokens. One that runs out of memory is left out the same way.
SLOW_STEP_S = 3.0


def trial(step, device, forget=None) -> str | None:
    """None if `step` runs twice, the second time within SLOW_STEP_S, else why not ("out of memory", or the
    second step's time); `forget()` first drops what a scheme keeps between steps (`Scheme.clear_cache`)."""
    try:
        step()
        if forget is not None:
            forget()
        _sync(device)
        start = time.perf_counter()
        step()
        _sync(device)
    except torch.OutOfMemoryError:
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
        return "out of memory"
    took = time.perf_counter() - start
    return None if took <= SLOW_STEP_S else f"a step took {took:.1f} s (over {SLOW_STEP_S:g} s)"


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def peak_bytes(step, device, forget=None) -> int:
    """The allocator's peak over one call of `step` beyond what was allocated before it (CUDA), else 0.
    `forget()` runs before the measured call, so that a table a scheme keeps between steps (ALiBi's bias)
    is built, and counted, inside it as another scheme's is."""
    if torch.device(device).type != "cuda":
        return 0
    step()                                                    # optimizer state exists before the measured call
    if forget is not None:
        forget()
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


def _models(names, seq_len, sizes, device, backend=None):
    out = {}
    for label, scheme in names.items():
        torch.manual_seed(0)
        model = build_model(scheme, VOCAB, causal=True, max_len=seq_len, d_model=sizes["d_model"],
                            n_heads=sizes["n_heads"], n_layers=sizes["n_layers"]).to(device).train()
        if backend is not None:
            model.attention_backend = backend.get(label, "auto")
        out[label] = model
    return out


def _timed(steps: dict, device, rounds: int, forget: dict, left_out: dict) -> tuple[dict, dict]:
    """Best time and peak memory of each step, timed in turns; if the models together then run out of memory
    (each passed its trial alone, but all of them stay resident), each is timed on its own instead, and one that
    still runs out is left out by name."""
    try:
        times = {n: min(t) for n, t in interleaved_times(steps, rounds=rounds, device=device).items()} if steps else {}
        return times, {n: peak_bytes(s, device, forget[n]) for n, s in steps.items()}
    except torch.OutOfMemoryError:
        pass
    times, peaks = {}, {}
    for n, step in steps.items():
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
        try:
            times[n] = min(interleaved_times({n: step}, rounds=rounds, device=device)[n])
            peaks[n] = peak_bytes(step, device, forget[n])
        except torch.OutOfMemoryError:
            times.pop(n, None)
            left_out[n] = "out of memory"
    return times, peaks


def _ratios(models, seq_len, batch_size, device, dtype, rounds) -> Table:
    """Rows {scheme, seq, train_ms, train/nope, peak_MiB, peak/nope, left_out} for `models` (NoPE first). A model
    that fails its `trial` keeps a row of Nones with the reason in `left_out`, and is freed before the others run."""
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randint(0, VOCAB, (batch_size, seq_len), generator=g).to(device) for _ in range(2))
    first = next(iter(models))
    forget = {n: m.scheme.clear_cache for n, m in models.items()}
    steps, left_out = {}, {}
    for n, m in list(models.items()):
        step = train_steps(m, x, y, dtype=dtype)
        left_out[n] = trial(step, device, forget[n])
        if left_out[n] is None:
            steps[n] = step
        else:
            del models[n], step                                   # its optimizer state goes (the model with the table)
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    times, peaks = _timed(steps, device, rounds, forget, left_out)
    base_time, base_peak = times.get(first), peaks.get(first)

    def ratio(value, base):
        return value / base if value is not None and base else None
    return Table({"scheme": n, "seq": seq_len, "train_ms": 1e3 * times[n] if n in times else None,
                  "train/nope": ratio(times.get(n), base_time),
                  "peak_MiB": peaks[n] / 2 ** 20 if n in peaks else None,
                  "peak/nope": ratio(peaks.get(n), base_peak), "left_out": left_out[n]} for n in left_out)


def gpu_scheme_costs(schemes=None, *, seq_lens=GPU_SEQ_LENS, sizes=GPU_MODEL, rounds: int = 5,
                     device: str = "cuda", dtype=torch.bfloat16) -> Table:
    """Rows {scheme, seq, train_ms, train/nope, peak_MiB, peak/nope, left_out}: one training step of each scheme
    (NoPE first, then a second NoPE model as the noise control) under autocast to `dtype`; a scheme that runs out
    of memory or past SLOW_STEP_S a step at a length has Nones there and the reason in `left_out`."""
    from ..scheme import SCHEMES
    names = {"nope": "nope", "nope (control)": "nope",
             **{s: s for s in (schemes or sorted(SCHEMES)) if s != "nope"}}
    rows = Table()
    for n in seq_lens:
        rows.extend(_ratios(_models(names, n, sizes, device), n, sizes["batch_size"], device, dtype, rounds))
    return rows


def rope_llama_times(*, seq_lens=LLAMA_ROPE["seq_lens"], heads: int = LLAMA_ROPE["heads"],
                     head_dim: int = LLAMA_ROPE["head_dim"], batch: int = LLAMA_ROPE["batch"], rounds: int = 20,
                     device: str = "cuda", dtype=torch.bfloat16) -> Table:
    """Rows {seq, candidate, ms, vs_floor, vs_reference}: forward + backward of q and k [batch, heads, seq, head_dim]."""
    return Table({"seq": n, **row} for n in seq_lens
                 for row in time_rope_candidates((batch, heads, n, head_dim), rounds, "wall", device, dtype))


def bias_backend_costs(schemes=("alibi", "t5"), *, seq_lens=FLEX_SEQ_LENS, sizes=GPU_MODEL, batch_size: int = 1,
                       backends=("flex", "sdpa"), rounds: int = 5, device: str = "cuda",
                       dtype=torch.bfloat16) -> Table:
    """Rows {scheme, seq, train_ms, train/nope, peak_MiB, peak/nope, left_out}: NoPE, then each bias scheme with
    its bias inside FlexAttention ("<scheme> flex") and as the [H, n, n] tensor ("<scheme> sdpa")."""
    names = {"nope": "nope"}
    backend = {}
    for s in schemes:
        for b in backends:
            names[f"{s} {b}"] = s
            backend[f"{s} {b}"] = b
    from ..attention import _FLEX
    rows = Table()
    for n in seq_lens:
        for r in _ratios(_models(names, n, sizes, device, backend), n, batch_size, device, dtype, rounds):
            kernel = "eager (the compile failed)" if _FLEX.fell_back else "compiled"   # what the flex rows timed
            rows.append({**r, "flex kernel": kernel if r["scheme"].endswith(" flex") and not r["left_out"] else None})
    return rows
