"""Timing: ``torch.utils.benchmark``'s blocked autorange, on a clock that waits for the case's
accelerator at every read (a CUDA kernel's time is its run time, not its launch time)."""

from __future__ import annotations

import timeit
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torch.utils.benchmark import Measurement

DEFAULT_MIN_RUN_TIME = 0.2  # seconds blocked_autorange measures each function per case
MAX_MIN_RUN_TIME = 60.0  # seconds per function and case: more would look like a hang


def measure(run: Callable[[], Any], device: torch.device, min_run_time: float) -> Measurement:
    """``run``'s time per call from ``torch.utils.benchmark`` (blocked autorange).

    On an accelerator every clock read first waits for the device (``torch.cuda.synchronize``),
    so the time is the kernels' run time, not how long launching them took.
    """
    from torch.utils import benchmark

    return benchmark.Timer(
        "run()",
        globals={"run": run},
        timer=clock(device),
        num_threads=torch.get_num_threads(),  # as the op runs outside the benchmark
    ).blocked_autorange(min_run_time=min_run_time)


def clock(device: torch.device) -> Callable[[], float]:
    """The benchmark's clock for ``device``: synchronised with it unless it is the CPU."""
    if device.type == "cpu":
        return timeit.default_timer

    def synchronised() -> float:
        synchronize(device)
        return timeit.default_timer()

    return synchronised


def synchronize(device: torch.device) -> None:
    """Wait for the kernels queued on ``device`` (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is not None and accelerator.type == device.type:  # xpu, mps, ...
        torch.accelerator.synchronize(device)
