"""What FlexAttention costs a run whose length changes: one compile per new shape, then eager.

    python benchmarks/flex_recompiles.py [--scheme alibi] [--device cpu|cuda] [--lengths 64 72 ...]

Times one forward of a small bias-scheme model with `attention_backend="flex"` at each length in
turn (a length seen before is cached; a new one compiles, as FlexAttention is compiled with
`dynamic=False`); past torch.compile's recompile limit the kernel runs eager for the rest of the
process. This is why `attention_backend="auto"` takes FlexAttention only from
`posenc.model.FLEX_MIN_KEYS` keys on (results/README.md, "FlexAttention from 2048 keys only").
On CPU the forward only (PyTorch has no CPU backward for FlexAttention); on CUDA forward and backward.
Wall times vary by machine and are never asserted in tests.
"""
import argparse
import time

import torch

import posenc

if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scheme", default="alibi", choices=("alibi", "t5"))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--lengths", type=int, nargs="+", default=[64, 64, 72, 80, 88, 96, 104, 112, 120, 128, 136, 144, 64, 144])
    args = p.parse_args()
    torch.manual_seed(0)
    model = posenc.build_model(args.scheme, 30, causal=True, d_model=64, n_heads=4, n_layers=2,
                               max_len=max(args.lengths)).to(args.device)
    model.attention_backend = "flex"
    backward = torch.device(args.device).type == "cuda"
    model.train(backward)
    seen = set()
    print(f"{args.scheme}, d=64, 2 layers, batch 2, {'forward + backward' if backward else 'forward'} on {args.device}")
    for n in args.lengths:
        x = torch.randint(0, 30, (2, n), device=args.device)
        start = time.perf_counter()
        with torch.set_grad_enabled(backward):
            out = model(x)
            if backward:
                out.float().square().mean().backward()
        if torch.device(args.device).type == "cuda":
            torch.cuda.synchronize()
        print(f"  n={n:>5}  {'seen ' if n in seen else 'new  '}  {time.perf_counter() - start:8.3f} s")
        seen.add(n)
