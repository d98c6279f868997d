"""The rungs that trace and compile: ``opcheck``, ``make_fx`` with symbolic shapes,
``torch.compile(fullgraph=True)`` with ``aot_eager`` then Inductor (static and dynamic
shapes), ``torch.export`` (and ``run_decompositions``) and an AOTInductor package.

Every compile goes through a function made for it, with a code object of its own: what dynamo
caches for it is dropped afterwards, and the user's compiled functions keep their caches.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from ..._torch import compilers
from .ladder import Ladder, Run, RungSkipped, first_lines, tensors_of
from .samples import Sample


def opcheck(ladder: Ladder) -> None:
    """``torch.library.opcheck`` on every sample (schema, autograd registration, FakeTensor,
    AOT dispatch with dynamic shapes); a failure is classified like any other."""
    for run in ladder.runs:
        sample = run.sample.fresh()
        outcomes = torch.library.opcheck(
            ladder.target.overload, sample.args, sample.kwargs, raise_exception=False
        )
        for test, outcome in outcomes.items():
            if isinstance(outcome, BaseException):
                ladder.explain(
                    outcome, f"opcheck {test} on {run.sample.described}", "compile-failure"
                )


def make_fx(ladder: Ladder) -> None:
    """``make_fx`` with symbolic shapes on every sample: the fake impl traces with sizes that
    are symbols (a fake that reads data or specializes on a size fails here)."""
    for run in ladder.runs:
        sample = run.sample.fresh()
        kwargs = sample.kwargs

        def call(*args: Any, kwargs: dict = kwargs) -> Any:
            return ladder.target.overload(*args, **kwargs)

        try:
            with torch.no_grad():
                compilers.make_fx_symbolic(call, sample.args)
        except Exception as error:
            ladder.explain(
                error, f"make_fx (symbolic shapes) on {run.sample.described}", "compile-failure"
            )


def aot_eager(ladder: Ladder) -> None:
    """``torch.compile(fullgraph=True, backend="aot_eager")``, static shapes on the first
    sample and dynamic shapes on every sample, against the kernel's results."""
    _compiled(ladder, "aot_eager")


def inductor(ladder: Ladder) -> None:
    """``torch.compile(fullgraph=True)`` with Inductor, as :func:`aot_eager`."""
    _compiled(ladder, "inductor")


def _compiled(ladder: Ladder, backend: str) -> None:
    """Compile the op with ``backend``, static then dynamic, and compare with eager."""
    for dynamic, runs in ((False, ladder.runs[:1]), (True, ladder.runs)):
        shapes = "dynamic" if dynamic else "static"
        with _compilable(ladder) as fn:
            compiled = torch.compile(fn, backend=backend, fullgraph=True, dynamic=dynamic)
            for run in runs:
                what = f"torch.compile ({backend}, {shapes} shapes) on {run.sample.described}"
                _expect_eager(ladder, run, compiled, what, "compile-failure")


@contextlib.contextmanager
def _compilable(ladder: Ladder) -> Iterator[Callable[..., Any]]:
    """A function calling the op, with a code object of its own, under the doctor's dynamo
    settings; what dynamo compiled for it is dropped at the end."""
    op = ladder.target.overload

    def call(*args: Any, **kwargs: Any) -> Any:
        return op(*args, **kwargs)

    call.__code__ = call.__code__.replace()  # a new code object: dynamo caches per code object
    try:
        with compilers.dynamo_settings():
            yield call
    finally:
        compilers.forget_compiled_code(call.__code__)


def _expect_eager(
    ladder: Ladder, run: Run, fn: Callable[..., Any], what: str, default: str
) -> None:
    """Run ``fn`` on a fresh copy of the run's sample; its outputs and written arguments must
    equal the kernel's. Ends the rung on an exception or a difference."""
    sample = run.sample.fresh()
    try:
        with torch.no_grad():
            output = fn(*sample.args, **sample.kwargs)
    except Exception as error:
        ladder.explain(error, what, default)
    difference = _difference(run, output, sample)
    if difference is not None:
        ladder.explain(AssertionError(difference), what, default, difference)


def _difference(run: Run, output: Any, after: Sample) -> str | None:
    """How an output (or a written argument) differs from the kernel's, or ``None``."""
    pairs = list(zip(tensors_of(run.output), tensors_of(output), strict=False))
    if len(tensors_of(run.output)) != len(tensors_of(output)):
        return f"returns {len(tensors_of(output))} tensor(s), eager {len(tensors_of(run.output))}"
    pairs += list(zip(run.after.tensors(), after.tensors(), strict=False))
    for expected, got in pairs:
        try:
            torch.testing.assert_close(got.detach(), expected.detach(), equal_nan=True)
        except AssertionError as error:
            return first_lines(error, 4)
    return None


def _exportable(op: Any) -> torch.nn.Module:
    """A module whose forward is one call of the op (what torch.export takes)."""

    class Exportable(torch.nn.Module):
        def forward(self, *args: Any, **kwargs: Any) -> Any:
            return op(*args, **kwargs)

    return Exportable()


def export(ladder: Ladder) -> None:
    """``torch.export.export`` on the first sample, then ``run_decompositions()``; the exported
    program's results against the kernel's."""
    run = ladder.runs[0]
    sample = run.sample.fresh()
    what = f"torch.export on {run.sample.described}"
    module = _exportable(ladder.target.overload)
    try:
        with torch.no_grad():
            exported = torch.export.export(module, sample.args, sample.kwargs)
            decomposed = exported.run_decompositions()
    except Exception as error:
        ladder.explain(error, what, "export-failure")
    ladder.exported = decomposed
    _expect_eager(ladder, run, decomposed.module(), what, "export-failure")


def aot_inductor(ladder: Ladder) -> None:
    """The exported program compiled with AOTInductor into a package, loaded and run."""
    exported = ladder.exported
    if exported is None:
        raise RungSkipped("needs the export rung to pass")
    run = ladder.runs[0]
    what = f"AOTInductor on {run.sample.described}"
    with tempfile.TemporaryDirectory(prefix="opmagic-doctor-") as folder:
        try:
            path = compilers.aot_inductor_package(exported, str(Path(folder) / "op.pt2"))
            runner = compilers.load_aot_inductor_package(path)
        except Exception as error:
            ladder.explain(error, what, "export-failure")
        _expect_eager(ladder, run, runner, what, "export-failure")
