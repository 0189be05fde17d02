"""The stored cost tables, as the chapters read them.

`results/bench/cpu.json` is the CPU table (`python -m posenc.bench --save`), the one on which the book's
CPU cost goals are judged. `results/bench/cuda.json` is the CUDA cost table, made in a GPU window by
`scripts/gpu_costs.sh` (sections gpu, schemes and, where x-transformers is installed, xt). Each file is
{"machine": the machine line, "sections": {name: {"title", "rows"}}}; a section can be missing from
either, so readers ask for a section and say where it came from.
"""
from __future__ import annotations

from pathlib import Path

from ..table import Table

#: The devices with a stored table, `results/bench/<device>.json`.
BENCH_DEVICES = ("cpu", "cuda")
#: The CUDA cost table's goals (issue: the apply_rope kernel within 1.5x of the memory-bound floor; a bias
#: scheme through FlexAttention within 1.1x of NoPE's peak memory).
ROPE_FLOOR_GOAL = 1.5
FLEX_PEAK_GOAL = 1.1


def stored_bench(device: str = "cpu", root: str | Path | None = None) -> dict | None:
    """The stored table of `device` ("cpu" or "cuda") under `root` (default: `results/bench`), or None
    where it has not been made. ValueError names an unknown device."""
    from ..runs.profiles import load_results
    from ..runs.store import results_root
    if device not in BENCH_DEVICES:
        raise ValueError(f"device must be one of {list(BENCH_DEVICES)}; got {device!r}")
    return load_results(device, Path(root) if root is not None else results_root() / "bench")


def stored_section(name: str, devices=("cpu",), root: str | Path | None = None) -> dict | None:
    """{"device", "machine", "title", "rows"} of section `name` from the first of `devices` whose stored
    table holds it, or None where none does."""
    for device in devices:
        bench = stored_bench(device, root)
        if bench is not None and name in bench["sections"]:
            return {"device": device, "machine": bench["machine"], **bench["sections"][name]}
    return None


def cuda_summary(gpu_rows: dict) -> dict[str, Table]:
    """The `gpu` section's three tables (`posenc.bench.gpu`) as a chapter shows them.

    * "schemes": one row per scheme, its training step / NoPE's and peak memory / NoPE's at each length;
    * "rope": each candidate's forward + backward time / the floor's and / its reference's at each length,
      with `goal` (<= ROPE_FLOOR_GOAL x the floor) on our rows;
    * "bias": NoPE and each bias scheme through FlexAttention ("flex") or with the [H, n, n] tensor ("sdpa"),
      with `goal` (peak <= FLEX_PEAK_GOAL x NoPE's) on the flex rows.
    A goal is True, False, or None where the table holds no number for it (peak memory off CUDA, or a row left
    out: `posenc.bench.gpu.trial`). The tables are saved one by one as they are made, so a window cut short
    keeps some: only those present are returned.
    """
    out = {}
    if "schemes" in gpu_rows:
        schemes = Table(gpu_rows["schemes"])
        lens = list(dict.fromkeys(schemes.column("seq")))
        wide = Table()
        for s in dict.fromkeys(schemes.column("scheme")):
            row = {"scheme": s}
            for n in lens:
                [r] = schemes.where(scheme=s, seq=n)
                row |= {f"step/nope @{n}": r["train/nope"], f"peak/nope @{n}": r["peak/nope"]}
            if any(r.get("left_out") for r in schemes.where(scheme=s)):
                row["left out"] = "; ".join(f"@{r['seq']}: {r['left_out']}" for r in schemes.where(scheme=s)
                                            if r.get("left_out"))
            wide.append(row)
        out["schemes"] = wide
    if "rope" in gpu_rows:
        out["rope"] = Table({**r, "goal": (r["vs_floor"] <= ROPE_FLOOR_GOAL) if r["candidate"].startswith("ours")
                             else None} for r in gpu_rows["rope"])
    if "bias" in gpu_rows:
        out["bias"] = Table({**r, "goal": (None if r["peak/nope"] is None else r["peak/nope"] <= FLEX_PEAK_GOAL)
                             if r["scheme"].endswith(" flex") else None} for r in gpu_rows["bias"])
    return out


__all__ = ["BENCH_DEVICES", "ROPE_FLOOR_GOAL", "FLEX_PEAK_GOAL", "stored_bench", "stored_section",
           "cuda_summary"]
