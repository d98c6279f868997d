"""Hostile arguments to the public functions, generated: each call returns, or raises an opmagic
error naming the argument, never another exception, and the op defined before still works.

Builds are stopped where the compiler would start (as in tests/magics/test_hostile_inputs.py):
the options must be refused before a build, and compiling per example is out of reach.

Each test draws ``OPMAGIC_HOSTILE_EXAMPLES`` examples (default 150: CI's share); the full run
of issue 29 is ``OPMAGIC_HOSTILE_EXAMPLES=1000 pytest tests/test_hostile_api.py
tests/magics/test_hostile_inputs.py --hypothesis-show-statistics``.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import opmagic
import opmagic.native.library
from opmagic.dispatch.contexts import CallContext
from opmagic.errors import OpmagicError
from opmagic.verify.samples import TensorSpec
from opmagic.view.explorer.model import ExplorerModel

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


def _odd_tensors() -> list[torch.Tensor]:
    """Tensors most code never meets: meta, quantized, nested, sparse, complex, empty, 0-dim."""
    with warnings.catch_warnings():  # quantized and nested tensors warn that they are old/new
        warnings.simplefilter("ignore")
        return [
            torch.ones(2, device="meta"),
            torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8),
            torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
            torch.ones(2, 2).to_sparse(),
            torch.ones(2, dtype=torch.complex64),
            torch.ones(0),
            torch.tensor(1.0),
            torch.ones(2, dtype=torch.bool),
            torch.ones(2, requires_grad=True),
        ]


_ODD = _odd_tensors()


def _kernel() -> Any:
    """The quick path's vector add (NVRTC compiles it without a GPU), once."""
    if "vadd" not in _KERNELS:
        pytest.importorskip("cuda.bindings.nvrtc", reason='needs pip install "opmagic[cuda]"')
        _KERNELS["vadd"] = opmagic.compile_cuda_kernels(VADD).vadd
    return _KERNELS["vadd"]


_KERNELS: dict[str, Any] = {}


def _explored(op: Any, shape: Any, dtype: Any, view: Any, fake: Any) -> Any:
    """The explorer's sample builder and model: an operator's schema turned into sample
    arguments of ``shape`` (a text as typed), resolved under ``fake``."""
    model = ExplorerModel(op)
    for slot in model.slots:
        slot.tensor = TensorSpec(shape=shape, dtype=dtype, view=view)
    model.set_context(fake=fake)
    return model.outcome()


def _more_calls() -> dict[str, tuple[Callable[..., Any], dict[str, Any]]]:
    """The functions issue 29 found raising internal errors, each with a valid call."""
    two = (torch.ones(2), torch.ones(2))
    return {
        "CudaKernel[config]": (lambda config: _kernel()[config], {"config": (1, 32)}),
        "CudaKernel.launch": (
            lambda grid, block, shared_mem, stream, arg: _kernel().launch(
                grid, block, arg, arg, arg, 2, shared_mem=shared_mem, stream=stream
            ),
            {"grid": 1, "block": 32, "shared_mem": 0, "stream": None, "arg": torch.ones(2)},
        ),
        "precompile_headers": (
            opmagic.precompile_headers,
            {"sources": [op_source("hzapi_pch")], "opt_level": 1, "extra_cflags": (), "wait": True},
        ),
        "CallContext": (
            lambda **fields: CallContext(**fields).resolve("aten::add.Tensor", *two),
            {
                "no_grad": False,
                "inference_mode": False,
                "autocast": None,
                "vmap": False,
                "fake": False,
                "logging": False,
            },
        ),
        "CallContext.resolve": (
            lambda fake, vmap, a, b: CallContext(fake=fake, vmap=vmap).resolve("aten::add", a, b),
            {"fake": True, "vmap": False, "a": two[0], "b": two[1]},
        ),
        "CallContext.trace": (
            lambda fake, a: CallContext(fake=fake).trace("aten::mul", a, a),
            {"fake": True, "a": two[0]},
        ),
        "explorer samples": (
            _explored,
            {
                "op": "aten::add.Tensor",
                "shape": "2, 2",
                "dtype": "float32",
                "view": "none",
                "fake": False,
            },
        ),
        "TensorSpec.build": (
            lambda **fields: TensorSpec(**fields).build("x"),
            {
                "device": "cpu",
                "dtype": "float32",
                "requires_grad": False,
                "layout": "strided",
                "view": "none",
                "shape": "2, 2",
            },
        ),
        "compile_cuda_kernels": (opmagic.compile_cuda_kernels, {"source": VADD}),
        "triton_op_from_source": (
            opmagic.triton_op_from_source,
            {"source": _CUSTOM_OP.replace("x + 1", "x"), "name": "hzapi::tri", "interpret": True},
        ),
    }


_BASES = {**_base_calls(), **_more_calls()}
_TARGETS = [(function, parameter) for function, (_, base) in _BASES.items() for parameter in base]
# every operator name, for the explorer's "unusual schemas" (Dimname, Generator, Storage...)
_OPS = sorted(torch._C._dispatch_get_all_op_names())
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
    # the value shapes of issue 29: huge and infinite numbers, odd sequences, text that is not
    # UTF-8 (a lone surrogate, as a notebook's JSON can hold), odd tensors, shapes as typed
    st.sampled_from(
        [
            float("inf"),
            -float("inf"),
            10**30,
            -(2**63),
            1e300,
            1 + 2j,
            (1, 2, 3, 4),
            (0,),
            (1, -1),
            [2, 2.5],
            (True,),
            ((1,), 2),
            torch.Size([2]),
            range(3),
            "2, x",
            "2,,3",
            "-1",
            "99999999999999999999",
            "\udcff",
            "é\udc80 TORCH_LIBRARY(x, m) {}",
            VADD.replace("a[i]", "\udcffa[i]"),
            op_source("hzapi_lib").replace("scale", "sc\udc80ale"),
            "cpu",
            "meta",
            "qint8",
            "conj",
        ]
    ),
    st.sampled_from(_ODD),
    st.lists(st.sampled_from(_ODD), min_size=1, max_size=2).map(lambda ts: [tuple(ts)]),
    st.sampled_from(_OPS),
)
_EXAMPLES = int(os.environ.get("OPMAGIC_HOSTILE_EXAMPLES", "150"))


@pytest.fixture
def no_builds(monkeypatch) -> None:
    """Builds and precompiles stop where the compiler would start (see the module doc)."""
    from opmagic.native import headers

    monkeypatch.setattr(opmagic.native.library, "published_build", _no_build)
    monkeypatch.setattr(headers, "prepare_prefix", _no_build)
    monkeypatch.setattr(headers, "start_in_background", _no_build)
    monkeypatch.setattr(headers._Precompile, "run_now", _no_build)


def _call_leaves_the_earlier_op(earlier_op: Any, target: tuple[str, str], value: Any) -> None:
    """Call ``target``'s function with ``value`` for its parameter: it returns or raises an
    opmagic error, the op defined before still works, and nothing was exported."""
    function, parameter = target
    call, base = _BASES[function]
    with contextlib.suppress(OpmagicError, _WouldBuild):
        call(**{**base, parameter: value})
    assert earlier_op(torch.zeros(1)).item() == 1.0
    assert torch.ops.hzapi.kept(torch.zeros(1)).item() == 1.0
    assert not _EXPORT_TO.exists()


@pytest.mark.slow
@settings(
    max_examples=_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(target=st.sampled_from(_TARGETS), value=_VALUES)
def test_generated_api_arguments(earlier_op, no_builds, target, value) -> None:
    _call_leaves_the_earlier_op(earlier_op, target, value)


@pytest.mark.slow
@pytest.mark.parametrize("target", _TARGETS, ids="{0[0]}-{0[1]}".format)
def test_every_argument_refuses_every_odd_tensor(earlier_op, no_builds, target) -> None:
    """Every parameter of every public function given each tensor most code never meets, in
    every run (the generated test draws only some of these pairs: a nested tensor's missing
    sizes reached users of export's ``cells`` through ``list()``)."""
    for value in _ODD:
        _call_leaves_the_earlier_op(earlier_op, target, value)


@pytest.mark.slow
@settings(
    max_examples=_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    function=st.sampled_from(["CudaKernel[config]", "CudaKernel.launch"]),
    grid=_VALUES,
    block=_VALUES,
)
def test_generated_launch_configurations(no_builds, function, grid, block) -> None:
    """Grid and block together (issue 29's 101 internal errors were the launcher's)."""
    with contextlib.suppress(OpmagicError):
        if function == "CudaKernel[config]":
            _kernel()[grid, block]
        else:
            _kernel().launch(grid, block, torch.ones(2), torch.ones(2), torch.ones(2), 2)


@pytest.mark.slow
@settings(
    max_examples=_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    op=st.sampled_from(_OPS),
    shape=st.one_of(st.text(max_size=8), st.sampled_from(["", "0", "2, 2", "1, 1, 1, 1"])),
    fake=st.booleans(),
)
def test_generated_explorer_samples(op, shape, fake) -> None:
    """Every operator's schema (Dimname, Generator, Storage, Tensor?[] ...) and typed shapes."""
    outcome = _explored(op, shape, "float32", "none", fake)
    assert (outcome.resolution is None) != (outcome.message is None)
