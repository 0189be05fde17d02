"""Chapter 11: RoPE against NoPE, learned and sinusoidal; context extension by PI and NTK scaling."""
from __future__ import annotations

from . import declare
from ._common import Sizes, lm


@declare("11_rope")
def rope(profile: str):
    size: Sizes | None = {
        "ci": dict(L=32, steps=300, batch_size=16, d_model=64, n_heads=4, n_layers=2, ft_steps=40, ft_batch=8,
                   max_tokens=4096, seeds=(0, 1, 2)),
        "full": dict(L=128, steps=1000, batch_size=32, d_model=128, n_heads=4, n_layers=4, ft_steps=100,
                     ft_batch=16, max_tokens=32768, seeds=(0, 1, 2))}.get(profile)
    if size is None:
        return []

    def spec(scheme, s):
        return lm(scheme, size["L"], steps=size["steps"], batch_size=size["batch_size"], d_model=size["d_model"],
                  n_heads=size["n_heads"], n_layers=size["n_layers"], warmup=30, seed=s, max_tokens=size["max_tokens"])

    out = [({"task": "lm", "scheme": scheme, "seed": s}, spec(scheme, s).replace(train={"log_every": 10}))
           for s in size["seeds"] for scheme in ("nope", "learned", "sinusoidal", "rope")]
    out += [({"task": "extension", "scheme": "rope", "seed": s},
             spec("rope", s).replace(train={"log_every": 10}, recipe="rope_extension",
                                     options={"factor": 4, "ft_steps": size["ft_steps"], "ft_batch": size["ft_batch"]}))
            for s in size["seeds"]]
    return out
