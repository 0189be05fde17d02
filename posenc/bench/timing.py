"""One round-robin timer shared by every benchmark, and a line that names the machine."""
from __future__ import annotations

import os
import platform
import time
from typing import Callable

import torch

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def interleaved_times(fns: dict[str, Callable[[], object]], *, rounds: int = 5, warmup: int = 1,
                      clock: str = "wall", device: str | torch.device = "cpu") -> dict[str, list[float]]:
    """Seconds of each call `fns[name]()`, called in turns: `warmup` untimed rounds, then `rounds`.

    clock: "wall" (perf_counter) or "cpu" (this process's CPU time, steadier on a shared
    machine when torch runs one thread). On CUDA the device is synchronised around calls.
    """
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {tuple(CLOCKS)}; got {clock!r}")
    if not (isinstance(rounds, int) and rounds >= 1):
        raise ValueError(f"rounds must be a positive int; got {rounds!r}")
    tick, cuda = CLOCKS[clock], torch.device(device).type == "cuda"
    times: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(warmup + rounds):
        for name, fn in fns.items():
            if cuda:
                torch.cuda.synchronize()
            t0 = tick()
            fn()
            if cuda:
                torch.cuda.synchronize()
            if r >= warmup:
                times[name].append(tick() - t0)
    return times


def machine(device: str | torch.device = "cpu") -> str:
    """Device, processor, core and thread counts, torch version: the header of every table."""
    device = torch.device(device)
    if device.type == "cuda":
        where = torch.cuda.get_device_name(device)
    else:
        where = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
    return f"{device.type}: {where}; torch {torch.__version__}, Python {platform.python_version()}"
