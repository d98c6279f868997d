"""What a dispatcher diff costs: ``opmagic.snapshot()`` of every operator, and
``opmagic.diff(before)`` after a one-kernel change, against reading every operator's dump
naively, measured in the same run.

    python benchmarks/diff.py

Baselines: the naive dump (``torch._C._dispatch_dump`` of every operator, kept as text) and
the naive diff (every dump read again, every operator's dump parsed on both sides and
compared). Targets: a snapshot takes <= 0.5 s and <= 1.0x the naive dump. A
snapshot keeps the dumps unparsed, so it costs what reading them costs; a diff reads them
again (torch has no cheaper record of what changed: no counter or fingerprint per operator)
and parses only the operators whose text differs. Medians of alternating runs.
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable

import torch

import opmagic
from opmagic.dispatch.diff.state import parse_op_state

TARGET_SECONDS = 0.5
TARGET_RATIO = 1.0
_C = torch._C


def naive_dump() -> dict[str, str]:
    """Every operator's dump, read one by one."""
    return {name: _C._dispatch_dump(name) for name in _C._dispatch_get_all_op_names()}


def naive_diff(before: dict[str, str]) -> list[str]:
    """Every dump read again, both sides parsed for every operator, the changed ones listed."""
    after = naive_dump()
    return [
        name
        for name in before.keys() | after.keys()
        if (before.get(name) and parse_op_state(before[name]))
        != (after.get(name) and parse_op_state(after[name]))
    ]


def medians(*runs: Callable[[], object], repeat: int = 25) -> list[float]:
    """Median wall time of each function, the functions run alternately (same load)."""
    for run in runs:
        run()
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(repeat):
        for run, sink in zip(runs, times, strict=True):
            start = time.perf_counter()
            run()
            sink.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def main() -> None:
    operators = len(_C._dispatch_get_all_op_names())
    dump_s, snapshot_s = medians(naive_dump, opmagic.snapshot)
    before, before_dumps = opmagic.snapshot(), naive_dump()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about overriding an aten kernel
        library = torch.library.Library("aten", "IMPL")
        library.impl("sin", lambda x: x * 0, "CPU")
    try:
        diff_s, naive_diff_s = medians(
            lambda: opmagic.diff(before), lambda: naive_diff(before_dumps), repeat=7
        )
        found = opmagic.diff(before)
    finally:
        library._destroy()
    met = snapshot_s <= TARGET_SECONDS and snapshot_s / dump_s <= TARGET_RATIO
    print(f"{operators:,} operators")
    print(f"naive dump (baseline)          {dump_s * 1e3:7.1f} ms")
    print(
        f"opmagic.snapshot()             {snapshot_s * 1e3:7.1f} ms  "
        f"{snapshot_s / dump_s:.2f}x the naive dump (target <= {TARGET_RATIO:.1f}x, "
        f"<= {TARGET_SECONDS} s: {'met' if met else 'MISSED'})"
    )
    print(f"naive diff (dump + parse all)  {naive_diff_s * 1e3:7.1f} ms")
    print(
        f"opmagic.diff(before)           {diff_s * 1e3:7.1f} ms  "
        f"{diff_s / dump_s:.2f}x the naive dump, {diff_s / naive_diff_s:.2f}x the naive diff"
    )
    print()
    print(found)


if __name__ == "__main__":
    main()
