"""What ``%%triton_op``'s checks cost in Triton's interpreter: a launch of a cell's vector add
(front end checked once per argument types, every load and store bounds-checked) against the
same kernel launched by the bare interpreter (``TRITON_INTERPRET=1`` style), measured in the
same run, alternately; and the first launch, which runs Triton's compiler front end.

    python benchmarks/triton_kernels.py

The bare interpreter is the baseline: it reads and writes any address a kernel computes; the
ratio is what catching an out-of-bounds access (and running Triton's own library and helper
kernels interpreted) adds to a launch.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import triton

from opmagic.cells.custom_op import source_file
from opmagic.native import triton as native

KERNEL = """
import triton
import triton.language as tl

@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + tl.load(y_ptr + offsets, mask=mask), mask=mask)
"""


def kernel(instrumented: bool) -> object:
    """The vector add made for the interpreter, as a cell makes it (or left bare)."""
    namespace: dict = {}
    filename = source_file(f"<benchmark {instrumented}>", KERNEL)
    with native.kernels_made_for(native.INTERPRETER):
        exec(compile(KERNEL, filename, "exec"), namespace)
    if instrumented:
        native.instrument_cell_kernels(namespace, filename, native.INTERPRETER)
    return namespace["add_kernel"]


def median_seconds(
    measured: Callable[[], object], baseline: Callable[[], object], repeat: int = 15
) -> tuple[float, float]:
    """Median wall times of ``measured()`` and ``baseline()``, run alternately."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeat):
        for run, kept in ((measured, times[0]), (baseline, times[1])):
            start = time.perf_counter()
            run()
            kept.append(time.perf_counter() - start)
    return statistics.median(times[0]), statistics.median(times[1])


def main() -> None:
    torch.set_num_threads(1)
    checked, bare = kernel(True), kernel(False)
    for n, block in ((1_000, 256), (98_432, 1024)):
        x, y, out = torch.randn(n), torch.randn(n), torch.empty(n)
        grid = (triton.cdiv(n, block),)

        def launch(add: object, x=x, y=y, out=out, grid=grid, block=block) -> None:
            add[grid](x, y, out, x.numel(), BLOCK=block)

        start = time.perf_counter()
        launch(checked)  # the first launch of these argument types: the front end runs
        first = time.perf_counter() - start
        with_checks, baseline = median_seconds(lambda: launch(checked), lambda: launch(bare))
        print(
            f"vector add, {n} elements, {grid[0]} programs: checked launch "
            f"{with_checks * 1e3:.1f} ms, bare interpreter {baseline * 1e3:.1f} ms "
            f"(ratio {with_checks / baseline:.2f}); first checked launch {first * 1e3:.1f} ms"
        )


if __name__ == "__main__":
    main()
