"""Cell timings: re-running a ``%%custom_op`` cell, and calling the op it made.

Each figure is printed with its ratio to a baseline measured in the same run:

- re-running a ``%%custom_op`` cell (summary displayed, as a notebook does) against
  re-running the same operator as a plain ``torch.library.custom_op`` cell in IPython
  without opmagic; target: median <= 50 ms;
- calling the op ``%%custom_op`` made against calling the same op made by
  ``torch.library.custom_op`` outside any session: rounds of 10k calls of each, back to
  back in alternating order; the ratio is the median of the rounds' ratios, which machine
  load drifting between rounds does not bias; target: ratio <= 1.05 (the magic adds
  nothing to the call path).

Run from the repository root: ``python benchmarks/cells.py`` (opmagic installed, or
``PYTHONPATH=.``). Exits 1 when a target is missed.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import torch
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

RERUNS = 50
CALLS = 10_000
ROUNDS = 21

BODY = """def scale(x: Tensor) -> Tensor:
    return x * 2

@fake
def _(x):
    return torch.empty_like(x)

@setup_context
def _(ctx, inputs, output):
    pass

@backward
def _(ctx, grad):
    return grad * 2
"""
MAGIC_CELL = f"%%custom_op bench::scale\n{BODY}"
PLAIN_CELL = (
    '@torch.library.custom_op("bench::plain_scale", mutates_args=())\n'
    + BODY.replace("@fake\n", "@scale.register_fake\n")
    .replace("@setup_context\ndef _(ctx, inputs, output):\n    pass\n\n", "")
    .replace("@backward\ndef _(ctx, grad):\n    return grad * 2\n", "")
    + "scale.register_autograd(lambda ctx, grad: grad * 2, setup_context=lambda *a: None)\n"
    + "scale\n"
)


def _median_ms(shell: InteractiveShell, cell: str, cell_id: str) -> float:
    """Median wall time of re-running ``cell`` (after two warm-up runs), in ms."""
    times = []
    for run in range(RERUNS + 2):
        start = time.perf_counter()
        with capture_output():  # displayed (that is part of the time), not printed here
            result = shell.run_cell(cell, store_history=True, cell_id=cell_id)
        if run >= 2:
            times.append((time.perf_counter() - start) * 1e3)
        if not result.success:
            raise SystemExit(f"the benchmark cell failed: {result.error_in_exec!r}")
    return statistics.median(times)


def _per_call_us(op: Callable, x: torch.Tensor) -> float:
    """Time of one round of CALLS calls, per call, in µs."""
    start = time.perf_counter()
    for _ in range(CALLS):
        op(x)
    return (time.perf_counter() - start) / CALLS * 1e6


def _outside_op() -> Callable:
    """The benchmark op made by torch.library.custom_op directly, with the same companions."""

    def scale(x: torch.Tensor) -> torch.Tensor:
        """The benchmark operator."""
        return x * 2

    op = torch.library.custom_op("bench::outside", mutates_args=())(scale)
    op.register_fake(lambda x: torch.empty_like(x))
    op.register_autograd(lambda ctx, grad: grad * 2, setup_context=lambda *args: None)
    return op


def main() -> int:
    """Measure, print each figure against its baseline, and return the exit status."""
    shell = InteractiveShell.instance()
    shell.run_cell("import torch\nfrom torch import Tensor", store_history=True)
    baseline_rerun = _median_ms(shell, PLAIN_CELL, "plain")
    shell.run_line_magic("load_ext", "opmagic")
    rerun = _median_ms(shell, MAGIC_CELL, "magic")

    magic_op = shell.user_ns["scale"]
    plain_op = _outside_op()
    x = torch.randn(4)
    magic_op(x), plain_op(x)  # the first custom op call imports torch._dynamo
    magic_rounds, plain_rounds = [], []
    for round_number in range(ROUNDS):
        if round_number % 2:
            plain_rounds.append(_per_call_us(plain_op, x))
            magic_rounds.append(_per_call_us(magic_op, x))
        else:
            magic_rounds.append(_per_call_us(magic_op, x))
            plain_rounds.append(_per_call_us(plain_op, x))
    call, baseline_call = statistics.median(magic_rounds), statistics.median(plain_rounds)
    call_ratio = statistics.median(m / p for m, p in zip(magic_rounds, plain_rounds, strict=True))
    shell.run_line_magic("unload_ext", "opmagic")
    plain_op._lib._destroy()

    rows = [
        (
            f"re-run a %%custom_op cell (median of {RERUNS})",
            f"{rerun:.1f} ms",
            rerun / baseline_rerun,
            f"re-run the same plain custom_op cell without opmagic, {baseline_rerun:.1f} ms",
            rerun <= 50,
            "<= 50 ms",
        ),
        (
            f"call the op %%custom_op made (median of {ROUNDS} x {CALLS} calls)",
            f"{call:.2f} us/call",
            call_ratio,
            f"the same op made by torch.library.custom_op, {baseline_call:.2f} us/call",
            call_ratio <= 1.05,
            "median paired ratio <= 1.05",
        ),
    ]
    for what, figure, ratio, baseline, met, target in rows:
        print(
            f"{what}: {figure} ({ratio:.2f}x baseline: {baseline}) target {target}: "
            f"{'met' if met else 'MISSED'}"
        )
    return 0 if all(row[4] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
