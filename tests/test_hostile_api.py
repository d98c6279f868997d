"""Hostile arguments to the public functions, generated: each call returns, or raises an opmagic
error naming the argument, never another exception, and the op defined before still works.

Builds are stopped where the compiler would start (as in tests/magics/test_hostile_inputs.py):
the options must be refused before a build, and compiling per example is out of reach.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import opmagic
import opmagic.native.library
from opmagic.errors import OpmagicError

from .native.sources import VADD, op_source


class _WouldBuild(Exception):
    """Raised where a build would start: the arguments were accepted."""


def _no_build(*args: Any, **kwargs: Any) -> Any:
    """Stands in for ``published_build``."""
    raise _WouldBuild


_CUSTOM_OP = "def f(x: torch.Tensor) -> torch.Tensor:\n    return x + 1\n"


@pytest.fixture(scope="module")
def earlier_op() -> Iterator[Any]:
    """An op defined before the hostile calls; they must leave it working."""
    result = opmagic.custom_op_from_source(_CUSTOM_OP, "hzapi::kept", namespace={"torch": torch})
    yield result.op
    result.op._lib._destroy()


_SNAPSHOT = opmagic.snapshot()
_EXPORT_TO = Path(tempfile.mkdtemp(prefix="hzapi-export-")) / "pkg"  # never written: no session
_VALUED = opmagic.trace(torch.ones(2).cos, values=True)
_DIFF = opmagic.diff(_SNAPSHOT)


def _base_calls() -> dict[str, tuple[Callable[..., Any], dict[str, Any]]]:
    """Per public function: a valid call (the generated value replaces one argument)."""
    two = (torch.ones(2), torch.ones(2))
    return {
        "compile_library": (opmagic.compile_library, {"source": op_source("hzapi_lib")}),
        "compile_cuda_library": (opmagic.compile_cuda_library, {"source": op_source("hzapi_cu")}),
        "custom_op_from_source": (
            opmagic.custom_op_from_source,
            {"source": _CUSTOM_OP.replace("x + 1", "x"), "name": "hzapi::fresh"},
        ),
        "check_op": (opmagic.check_op, {"op": "aten::add.Tensor", "args": two}),
        "doctor": (
            lambda op, samples, rungs, until: opmagic.doctor(
                op, samples=samples, rungs=rungs, until=until, progress=False
            ),
            {"op": "aten::sin", "samples": [two[:1]], "rungs": ["fake"], "until": "fake"},
        ),
        "key_info": (opmagic.key_info, {"name": "CPU"}),
        "kernels": (opmagic.kernels, {"namespace": "hzapi", "keys": None, "missing": None}),
        "dispatch_table": (opmagic.dispatch_table, {"op": "aten::add.Tensor"}),
        "resolve": (
            lambda op, a, b: opmagic.resolve(op, a, b),
            {"op": "aten::add", "a": two[0], "b": 1},
        ),
        "compare": (
            opmagic.compare,
            {
                "candidate": torch.add,
                "reference": torch.add,
                "inputs": [two],
                "min_run_time": 0.001,
                "progress": False,
            },
        ),
        "cuda_kernel_from_source": (
            opmagic.cuda_kernel_from_source,
            {"source": VADD, "arch": None, "namespace": None, "label": None, "first_line": 1},
        ),
        "cdiv": (opmagic.cdiv, {"a": 10, "b": 3}),
        "export": (
            opmagic.export,
            {"directory": _EXPORT_TO, "name": "hz_pkg", "version": "0.1.0", "cells": None,
             "overwrite": False},
        ),
        "trace": (lambda fn: opmagic.trace(fn), {"fn": torch.ones(1).sum}),
        "trace options": (
            lambda values, warmup: opmagic.trace(torch.ones(1).sum, values=values, warmup=warmup),
            {"values": True, "warmup": False},
        ),
        "compare_traces": (
            opmagic.compare_traces,
            {"a": _VALUED, "b": _VALUED, "rtol": 1e-4, "atol": 1e-5, "labels": ("a", "b")},
        ),
        "diff": (opmagic.diff, {"before": _SNAPSHOT}),
        "DispatchDiff.table": (_DIFF.table, {"op": "hzapi::kept"}),
        "DispatchDiff.affected": (_DIFF.affected, {"calls": [("aten::sin", two[:1])]}),
    }


_BASES = _base_calls()
_TARGETS = [(function, parameter) for function, (_, base) in _BASES.items() for parameter in base]
_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.sampled_from([float("nan"), -0.5, 0.0, 1e-3, 300 * "x", object(), torch.ones(1)]),
    st.text(max_size=12),
    st.binary(max_size=4),
    st.lists(st.one_of(st.integers(-2, 2), st.text(max_size=3), st.none()), max_size=3),
    st.dictionaries(st.one_of(st.integers(-2, 2), st.text(max_size=3)), st.integers(), max_size=2),
    st.tuples(st.text(max_size=3), st.text(max_size=3)),
    # functions: some stand for an aten operator, some for several or none
    st.sampled_from([torch.add, torch.ones(1).add, torch.norm, torch.Tensor.backward, len]),
)


@pytest.mark.slow
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(target=st.sampled_from(_TARGETS), value=_VALUES)
def test_generated_api_arguments(earlier_op, monkeypatch, target, value) -> None:
    monkeypatch.setattr(opmagic.native.library, "published_build", _no_build)
    function, parameter = target
    call, base = _BASES[function]
    with contextlib.suppress(OpmagicError, _WouldBuild):
        call(**{**base, parameter: value})
    assert earlier_op(torch.zeros(1)).item() == 1.0
    assert torch.ops.hzapi.kept(torch.zeros(1)).item() == 1.0
    assert not _EXPORT_TO.exists()
