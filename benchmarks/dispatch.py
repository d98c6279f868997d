"""Timings of the dispatch engine against baselines measured in the same run.

    python benchmarks/dispatch.py [--short]

Targets (issue 2): dispatch_table(op) median <= 5 ms; resolve() of a 2-tensor call median
<= 1 ms; kernels() over every op <= 0.5 s. Baselines: torch's raw dump calls for one op,
running the call itself, and dumping + regex-parsing every op's table (the naive way).
Target (issue 26): kernels() over every op <= 0.7x the naive dump-and-parse.

Times are CPU times of this process (medians): on a machine shared with other work they
follow the others' load far less than wall times. ``--short``: fewer runs.

The first resolve of a freshly defined operator (a notebook's new op) asks the dispatcher
for that operator alone; its baseline is the lookup opmagic had before, an index of every
operator's name rebuilt whenever a name was missing from it, measured in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import re
import statistics
import time
from collections.abc import Callable, Iterator

import torch

import opmagic
from opmagic._torch import dispatcher

SHORT = False  # --short: a tenth of the runs (at least 3)


def cpu_seconds(fn: Callable[[], object]) -> float:
    """CPU time of one ``fn()``."""
    start = time.process_time()
    fn()
    return time.process_time() - start


def median_seconds(fn: Callable[[], object], repeat: int, warmup: int = 3) -> float:
    """Median CPU time of ``fn()`` over ``repeat`` runs after ``warmup`` runs."""
    repeat = max(3, repeat // 10) if SHORT else repeat
    for _ in range(warmup):
        fn()
    return statistics.median(cpu_seconds(fn) for _ in range(repeat))


_LINE = re.compile(r"^(\w+): (fallthrough )?(.*) \[([^\]]+)\]$")


def naive_all_tables() -> dict[str, dict[str, tuple[str, ...]]]:
    """The baseline for kernels(): dump every op's table and regex-parse every line."""
    out = {}
    for name in dispatcher.all_op_names():
        rows = {}
        for line in dispatcher.dump_table(name).splitlines():
            match = _LINE.match(line)
            if match:
                rows[match[1]] = match.groups()
        out[name] = rows
    return out


class FullIndexLookup:
    """The baseline operator lookup: overload names of every operator, rebuilt from the
    dispatcher's whole list when a name is missing or an indexed one went away."""

    def __init__(self) -> None:
        self.overloads: dict[str, list[str]] = {}

    def refresh(self) -> None:
        self.overloads = {}
        for full in dispatcher.all_op_names():
            qualname, _, overload = full.partition(".")
            self.overloads.setdefault(qualname, []).append(overload)

    def overload_names(self, qualname: str) -> Iterator[str]:
        if qualname not in self.overloads:
            self.refresh()
        names = self.overloads.get(qualname, [])
        if names and dispatcher.find_schema(qualname, names[0]) is None:
            self.refresh()
        return iter(self.overloads.get(qualname, []))

    def has_operator(self, name: str) -> bool:
        qualname, _, overload = name.partition(".")
        return overload in self.overload_names(qualname)


@contextlib.contextmanager
def full_index_lookups() -> Iterator[None]:
    """Route opmagic's per-operator lookups through the baseline's full index."""
    index = FullIndexLookup()
    per_operator = dispatcher.overload_names, dispatcher.has_operator
    dispatcher.overload_names = index.overload_names
    dispatcher.has_operator = index.has_operator
    try:
        yield
    finally:
        dispatcher.overload_names, dispatcher.has_operator = per_operator


_fresh_names = itertools.count()


def first_resolve_of_a_fresh_op(x: torch.Tensor) -> float:
    """Seconds of the first ``resolve`` of an operator defined just before (not timed)."""
    library = torch.library.Library("bench_fresh", "FRAGMENT")
    name = f"op{next(_fresh_names)}"
    library.define(f"{name}(Tensor x) -> Tensor")
    library.impl(name, torch.sin, "CPU")
    try:
        return cpu_seconds(lambda: opmagic.resolve(f"bench_fresh::{name}", x))
    finally:
        library._destroy()


def first_resolves(x: torch.Tensor, repeat: int = 60) -> tuple[float, float]:
    """Median first-resolve time of fresh ops, per-operator lookup and full-index baseline,
    taken alternately so that both see the same load."""
    per_operator, full_index = [], []
    for _ in range(max(3, repeat // 10) if SHORT else repeat):
        per_operator.append(first_resolve_of_a_fresh_op(x))
        with full_index_lookups():
            full_index.append(first_resolve_of_a_fresh_op(x))
    return statistics.median(per_operator), statistics.median(full_index)


def report(
    name: str,
    seconds: float,
    target: float,
    baseline_name: str,
    baseline: float,
    ratio_target: float | None = None,
) -> bool:
    """Print one figure, its target and its ratio to the baseline (and the ratio's target,
    if it has one); True when on target."""
    ok = seconds <= target
    ratio = seconds / baseline
    ratio_ok = ratio_target is None or ratio <= ratio_target
    verdict = "PASS" if ratio_ok else "FAIL"
    held = f" (target <= {ratio_target:g}x: {verdict})" if ratio_target else ""
    print(
        f"{name:<34} {seconds * 1e3:9.3f} ms  (target <= {target * 1e3:g} ms: "
        f"{'PASS' if ok else 'FAIL'})  vs {baseline_name}: {baseline * 1e3:.3f} ms, "
        f"ratio {ratio:.2f}x{held}"
    )
    return ok and ratio_ok


def main() -> int:
    """Run every benchmark; exit status 1 when a target is missed."""
    global SHORT
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--short", action="store_true", help="a tenth of the runs")
    SHORT = parser.parse_args().short
    print(f"torch {torch.__version__}, {len(dispatcher.all_op_names())} operators\n")
    x, y = torch.randn(64, 64, requires_grad=True), torch.randn(64, 64)
    results = []

    for op in ("aten::add.Tensor", "aten::native_layer_norm"):
        table = median_seconds(lambda op=op: opmagic.dispatch_table(op), repeat=200)
        raw = median_seconds(
            lambda op=op: (dispatcher.dump_table(op), dispatcher.dump_registrations(op)), repeat=200
        )
        results.append(report(f"dispatch_table({op})", table, 5e-3, "torch's two raw dumps", raw))

    add = torch.ops.aten.add.Tensor
    resolved = median_seconds(lambda: opmagic.resolve(add, x, y), repeat=500)
    called = median_seconds(lambda: add(x, y), repeat=500)
    results.append(
        report("resolve(aten::add.Tensor, x, y)", resolved, 1e-3, "running the call", called)
    )
    with torch.autocast("cpu"):
        resolved = median_seconds(lambda: opmagic.resolve(torch.ops.aten.mm, x, y), repeat=300)
        called = median_seconds(lambda: torch.ops.aten.mm(x, y), repeat=300)
    results.append(
        report("resolve(aten::mm) under autocast", resolved, 1e-3, "running the call", called)
    )

    fresh, full_index = first_resolves(y)
    results.append(
        report("first resolve of a new op", fresh, 1e-3, "an index of every op's name", full_index)
    )

    kernel_runs, naive_runs = [], []
    naive_all_tables(), opmagic.kernels()  # warm-up
    for _ in range(3 if SHORT else 7):  # alternately, so that both see the same load
        kernel_runs.append(cpu_seconds(opmagic.kernels))
        naive_runs.append(cpu_seconds(naive_all_tables))
    all_kernels, naive = statistics.median(kernel_runs), statistics.median(naive_runs)
    results.append(
        report(
            "kernels() over every op",
            all_kernels,
            0.5,
            "dump + regex-parse every table",
            naive,
            ratio_target=0.7,
        )
    )
    wide = median_seconds(lambda: opmagic.kernels(wide=True), repeat=5, warmup=1)
    results.append(
        report(
            "kernels(wide=True) over every op", wide, 0.5, "dump + regex-parse every table", naive
        )
    )
    return 0 if all(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
