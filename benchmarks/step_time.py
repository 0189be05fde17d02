"""Training-step time of each relative scheme as a multiple of NoPE's, measured in one process.

    python benchmarks/step_time.py [--seq-len 256] [--schemes shaw xl t5 sinusoidal]

Schemes are timed in turns (round-robin), so load drifts hit all alike; prints the
median milliseconds per step and the ratio to NoPE. Ratios, not timings, are the result.
"""
import argparse

import torch

import posenc
from posenc.bench.costs import step_time_ratios

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--schemes", nargs="+", default=["sinusoidal", "shaw", "xl", "t5"])
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    schemes = [s for s in a.schemes if s in posenc.SCHEMES]
    print(f"device={a.device} seq_len={a.seq_len} batch={a.batch_size} d_model={a.d_model} layers={a.layers}")
    print(step_time_ratios(schemes, seq_len=a.seq_len, batch_size=a.batch_size, rounds=a.rounds, device=a.device,
                           model_kwargs=dict(d_model=a.d_model, n_layers=a.layers)).round(3))
