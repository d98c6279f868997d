"""The doctor's ladder, rung by rung, for a healthy op: its first run in this process (torch's
lazy imports, Inductor's and AOTInductor's first compiles) and a repeated run, against the
baseline of plain ``torch.library.opcheck`` of the same op on the same sample, run in the
same process right before each ladder.

The op is a ``torch.library.custom_op`` with a fake impl and an autograd formula, checked on
one float32 sample that requires grad. Wall times and CPU times (the process and its children,
where Inductor compiles) are printed: a shared machine inflates wall times. No target: the
figures say where the ladder's time goes (``until=`` and ``rungs=`` leave out costly rungs).

Run from the repository root: ``python benchmarks/doctor.py`` (opmagic installed, or
``PYTHONPATH=.``); ``--until RUNG`` stops the ladder there (e.g. ``--until export``).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import Tensor

from opmagic import doctor


@torch.library.custom_op("bench_doctor::scaled_mul", mutates_args=())
def scaled_mul(x: Tensor, y: Tensor, alpha: float) -> Tensor:
    return x * y * alpha


@scaled_mul.register_fake
def _(x, y, alpha):
    return torch.empty_like(x)


def _setup_context(ctx, inputs, output):
    x, y, alpha = inputs
    ctx.save_for_backward(x, y)
    ctx.alpha = alpha


def _backward(ctx, grad):
    x, y = ctx.saved_tensors
    return grad * y * ctx.alpha, grad * x * ctx.alpha, None


scaled_mul.register_autograd(_backward, setup_context=_setup_context)


def _cpu() -> float:
    """CPU seconds of this process and its children so far (Inductor and AOTInductor compile
    in child processes)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def _timed(fn) -> tuple[float, float]:
    """Wall and CPU seconds (this process and its children) of one call."""
    wall, cpu = time.perf_counter(), _cpu()
    fn()
    return time.perf_counter() - wall, _cpu() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--until", default=None, help="the last rung to climb")
    options = parser.parse_args()
    sample = (torch.randn(64, 32, requires_grad=True), torch.randn(64, 32), 0.5)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; op {scaled_mul}")
    for run in ("first run", "repeated run"):
        base_wall, base_cpu = _timed(lambda: torch.library.opcheck(scaled_mul, sample))
        diagnosis = None

        def climb() -> None:
            nonlocal diagnosis
            diagnosis = doctor(scaled_mul, *sample, until=options.until, progress=False)

        wall, cpu = _timed(climb)
        assert diagnosis is not None and diagnosis.ok, str(diagnosis)
        print(
            f"\n{run}: ladder {wall:.2f} s wall, {cpu:.2f} s CPU; baseline plain opcheck "
            f"{base_wall:.2f} s wall, {base_cpu:.2f} s CPU; ladder / opcheck = "
            f"{wall / base_wall:.1f}x wall, {cpu / max(base_cpu, 1e-9):.1f}x CPU"
        )
        for rung in diagnosis.rungs:
            seconds = f"{rung.seconds * 1e3:9.1f} ms" if rung.status != "skip" else " " * 12
            print(f"  {rung.title:<26} {rung.status:<4} {seconds}  {rung.detail}")


if __name__ == "__main__":
    main()
