"""Cell timings: re-running a ``%%custom_op`` cell, and calling the op it made.

    python benchmarks/cells.py [--short]

Each figure is printed with its ratio to a baseline measured in the same run:

- re-running a ``%%custom_op`` cell (summary displayed, as a notebook does) against
  re-running the same operator as a plain ``torch.library.custom_op`` cell in the same
  IPython shell without opmagic; blocks of the two cells' runs alternate (the extension
  loaded for the magic's, unloaded after), so that a change of load weighs on both; each
  run is timed in CPU time (user + system of this process and of the processes it waited
  for, e.g. Graphviz's ``dot``), which other work on a shared machine inflates far less
  than wall time (printed beside it); target (issue 26): median <= 2x the plain cell;
- calling the op ``%%custom_op`` made against calling the same op made by
  ``torch.library.custom_op`` outside any session: rounds of 10k calls of each, back to
  back in alternating order, in CPU time; the ratio is the median of the rounds' ratios,
  which machine load drifting between rounds does not bias; target: ratio <= 1.05 (the magic adds
  nothing to the call path).

Run from the repository root: ``python benchmarks/cells.py`` (opmagic installed, or
``PYTHONPATH=.``). ``--short``: fewer runs, for a quick look. Exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from collections.abc import Callable

import torch
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

CALLS = 10_000

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


def _cpu_seconds() -> float:
    """CPU time of this process and of the children it waited for (user + system)."""
    used = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in used)


def _run(shell: InteractiveShell, cell: str, cell_id: str) -> tuple[float, float]:
    """Run ``cell`` once, its result displayed: (wall ms, CPU ms)."""
    wall, cpu = time.perf_counter(), _cpu_seconds()
    with capture_output():  # displayed (that is part of the time), not printed here
        result = shell.run_cell(cell, store_history=True, cell_id=cell_id)
    if not result.success:
        raise SystemExit(f"the benchmark cell failed: {result.error_in_exec!r}")
    return (time.perf_counter() - wall) * 1e3, (_cpu_seconds() - cpu) * 1e3


def _reruns(shell: InteractiveShell, cell: str, cell_id: str, reruns: int) -> list[tuple]:
    """(wall ms, CPU ms) of re-running ``cell``, after two warm-up runs."""
    return [_run(shell, cell, cell_id) for _ in range(reruns + 2)][2:]


def _alternating_reruns(
    shell: InteractiveShell, reruns: int, blocks: int
) -> tuple[list[tuple], list[tuple]]:
    """Re-runs of the plain cell without opmagic and of the %%custom_op cell, in ``blocks``
    alternating blocks (the extension loaded for the magic's, unloaded after)."""
    plain: list[tuple] = []
    magic: list[tuple] = []
    for _ in range(blocks):
        plain += _reruns(shell, PLAIN_CELL, "plain", reruns // blocks)
        shell.run_line_magic("load_ext", "opmagic")
        magic += _reruns(shell, MAGIC_CELL, "magic", reruns // blocks)
        shell.run_line_magic("unload_ext", "opmagic")
    return plain, magic


def _per_call_us(op: Callable, x: torch.Tensor) -> float:
    """CPU time of one round of CALLS calls, per call, in µs."""
    start = time.process_time()
    for _ in range(CALLS):
        op(x)
    return (time.process_time() - start) / CALLS * 1e6


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
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="fewer runs, for a quick look")
    short = parser.parse_args().short
    reruns, rounds = (15, 11) if short else (60, 21)  # re-runs of each cell, call rounds
    shell = InteractiveShell.instance()
    shell.run_cell("import torch\nfrom torch import Tensor", store_history=True)
    plain, magic = _alternating_reruns(shell, reruns, blocks=3)
    (baseline_wall, baseline_rerun), (wall, rerun) = (
        (statistics.median(t[0] for t in runs), statistics.median(t[1] for t in runs))
        for runs in (plain, magic)
    )
    shell.run_line_magic("load_ext", "opmagic")
    _run(shell, MAGIC_CELL, "magic")  # the op whose calls are timed

    magic_op = shell.user_ns["scale"]
    plain_op = _outside_op()
    x = torch.randn(4)
    magic_op(x), plain_op(x)  # the first custom op call imports torch._dynamo
    magic_rounds, plain_rounds = [], []
    for round_number in range(rounds):
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
            f"re-run a %%custom_op cell (median of {reruns}, CPU)",
            f"{rerun:.1f} ms (wall {wall:.1f} ms)",
            rerun / baseline_rerun,
            f"re-run the same plain custom_op cell, {baseline_rerun:.1f} ms (wall "
            f"{baseline_wall:.1f} ms)",
            rerun <= 2 * baseline_rerun,
            "<= 2x",
        ),
        (
            f"call the op %%custom_op made (median of {rounds} x {CALLS} calls)",
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
