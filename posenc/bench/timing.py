"""One round-robin timer shared by every benchmark, and a line that names the machine."""
from __future__ import annotations

import ctypes
import os
import platform
import time
from typing import Callable, Hashable, TypeVar

import torch

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
Name = TypeVar("Name", bound=Hashable)      # what names a timed call: a str, or a tuple such as (library, scheme)


def interleaved_times(fns: dict[Name, Callable[[], object]], *, rounds: int = 5, warmup: int = 1,
                      clock: str = "wall", device: str | torch.device = "cpu",
                      rotate: bool = False) -> dict[Name, list[float]]:
    """Seconds of each call `fns[name]()`, called in turns: `warmup` untimed rounds, then `rounds`.

    clock: "wall" (perf_counter) or "cpu" (this process's CPU time, steadier on a shared
    machine when torch runs one thread). On CUDA the device is synchronised around calls.
    rotate: start round r at the (r mod len(fns))-th function, so that each is timed in every place of the
    turn equally often (over a multiple of len(fns) rounds) and a drift within a turn, e.g. the
    machine warming as it runs, does not always land on the last ones. The lists stay in round order.
    """
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {tuple(CLOCKS)}; got {clock!r}")
    if not (isinstance(rounds, int) and rounds >= 1):
        raise ValueError(f"rounds must be a positive int; got {rounds!r}")
    tick, cuda = CLOCKS[clock], torch.device(device).type == "cuda"
    times: dict[Name, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for r in range(warmup + rounds):
        shift = r % len(names) if rotate and names else 0
        for name in names[shift:] + names[:shift]:
            fn = fns[name]
            if cuda:
                torch.cuda.synchronize()
            t0 = tick()
            fn()
            if cuda:
                torch.cuda.synchronize()
            if r >= warmup:
                times[name].append(tick() - t0)
    return times


#: glibc's mallopt parameters (malloc.h) and the values `steady_heap` gives them: never give freed memory back
#: to the system, and serve every block under 1 GiB from the heap rather than from a fresh mapping.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
KEPT_HEAP = {M_TRIM_THRESHOLD: 2**31 - 1, M_MMAP_THRESHOLD: 2**30}


def steady_heap() -> bool:
    """Make freed memory stay in this process (glibc only), so that a timed call that allocates a large buffer
    reuses the one freed by the call before it instead of faulting fresh pages in from the kernel.

    With glibc's defaults a block of 32 MiB or more ([8, 1024, 1024] float32, a bias of the kernel table) is
    mapped and unmapped at every call; what the clock then measures is page faults, and how many depends on
    what ran earlier in the process (the bias table's ratios moved from 0.10 to 0.47 with the sections run
    before it). The same setting as MALLOC_TRIM_THRESHOLD_ and MALLOC_MMAP_THRESHOLD_ in the environment, or
    as PyTorch's advice to time CPU code under a caching allocator (jemalloc, tcmalloc). For the benchmark's
    process only: `posenc` leaves a training process's allocator as it finds it. True where it took effect.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        return all(libc.mallopt(param, value) == 1 for param, value in KEPT_HEAP.items())
    except (OSError, AttributeError):             # not glibc (macOS, musl, Windows): nothing to set
        return False


def machine(device: str | torch.device = "cpu") -> str:
    """Device, processor, core and thread counts, torch version: the header of every table."""
    device = torch.device(device)
    if device.type == "cuda":
        where = torch.cuda.get_device_name(device)
    else:
        threads = torch.get_num_threads()
        where = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                 f"{threads} torch thread{'' if threads == 1 else 's'}")
    return f"{device.type}: {where}; torch {torch.__version__}, Python {platform.python_version()}"
