"""``tests/``: pytest tests generated from the checks the author ran in the session.

Every sample of an ``opcheck`` (``--check``, ``check_op``, ``torch.library.opcheck`` in a cell)
becomes a ``torch.library.opcheck`` case, every ``gradcheck`` of ``check_op`` a gradcheck case,
every (small) case of a ``compare`` run an ``assert_close`` case against what its reference
returned then; each operator with a fake (or a CompositeImplicitAutograd kernel) gets a
``torch.compile(fullgraph=True)`` smoke test on its first sample; and a test compares every
operator's schema with ``ops.json``. The samples are copies taken when the checks ran, saved
in ``tests/samples.pt`` (tensors on the CPU, each sample's device recorded: a CUDA sample
runs, or skips, where the tests run).
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..cells.history import CheckRun

SAMPLES_FILE = "samples.pt"
TEST_FILE = "test_ops.py"
# how the compile smoke test compiles: FakeTensor tracing and AOTAutograd, as Inductor, without
# generating and compiling code for each op (the generated test says how to use Inductor)
COMPILE_BACKEND = "aot_eager"


@dataclass(frozen=True)
class Operator:
    """An operator of the package, as ``ops.json`` and the README list it."""

    name: str  # "ns::name" or "ns::name.overload"
    schema: str
    cell: str  # the label of the cell that defines it
    source: str  # the file that defines it: "ops.py", "csrc/mylib.cpp"
    has_fake: bool  # a fake/Meta kernel (or a CompositeImplicitAutograd one): compiles
    cuda_only: bool = False  # defined by a CUDA source, which only CUDA builds have
    triton: bool = False  # a %%triton_op: its kernels run on a GPU outside opmagic

    @property
    def qualname(self) -> str:
        """``ns::name`` without the overload."""
        return self.name.partition(".")[0]


@dataclass
class GeneratedTests:
    """The test module, the samples file, and what the tests cover."""

    module: str
    samples: bytes
    counts: dict[str, int] = field(default_factory=dict)  # cases per kind of test
    notes: list[str] = field(default_factory=list)


def generated_tests(
    package: str, operators: Sequence[Operator], runs: Iterable[CheckRun]
) -> GeneratedTests:
    """The tests of ``operators`` from the check ``runs`` of the exported cells."""
    by_name = {op.qualname: op for op in operators}
    samples: dict[str, dict[str, Any]] = {}
    cases: dict[str, list[str]] = {"opcheck": [], "gradcheck": [], "compare": [], "compile": []}
    notes: list[str] = []
    first_sample: dict[str, str] = {}
    for run in runs:
        qualname = run.op.partition(".")[0]
        op = by_name.get(qualname)
        if op is None:
            notes.append(f"cell {run.cell}'s {run.kind} of {run.op} is not of an operator of "
                         f"the package: not a test of it")
            continue
        if run.kind not in ("opcheck", "gradcheck", "compare"):
            notes.append(f"cell {run.cell}'s {run.kind} of {run.op}: no test is made of this "
                         "kind of check yet")
            continue
        for sample in run.samples:
            case = f"{run.kind}-{len(samples) + 1}"
            stored, devices = _stored(sample.args, sample.kwargs)
            entry: dict[str, Any] = {**stored, "devices": devices}
            if run.kind == "compare":
                entry["expected"], entry["expected_devices"] = _stored_value(sample.expected)
                entry["expected_args"], entry["expected_args_devices"] = _stored_value(
                    tuple(sample.expected_args or ())
                )
            samples[case] = entry
            first_sample.setdefault(qualname, case)
            extra = ""
            if run.kind == "compare":
                extra = f", {run.details.get('rtol')!r}, {run.details.get('atol')!r}"
            elif run.kind == "opcheck":
                test_utils = run.details.get("test_utils")
                extra = f", {tuple(test_utils)!r}" if test_utils else ", None"
            cases[run.kind].append(_param(run.op, case, run.cell, devices, op, extra))
    for op in operators:
        compiled_case = first_sample.get(op.qualname)
        if op.has_fake and compiled_case is not None:
            devices = samples[compiled_case]["devices"]
            cases["compile"].append(
                _param(_overload(op.name), compiled_case, op.cell, devices, op, "")
            )
        elif op.has_fake:
            notes.append(f"{op.name} has a fake but no sample to compile it on: run check_op or "
                         "%%custom_op --check on it once, then export again")
    buffer = io.BytesIO()
    torch.save(samples, buffer)
    counts = {kind: len(params) for kind, params in cases.items()}
    return GeneratedTests(_module(package, cases), buffer.getvalue(), counts, notes)


def _overload(name: str) -> str:
    """``ns::name.default`` for ``ns::name``: the compile test calls an OpOverload."""
    return name if "." in name else f"{name}.default"


def _param(
    op: str, case: str, cell: str, devices: list[str], operator: Operator, extra: str
) -> str:
    """One ``pytest.param(...)`` line: the operator, the sample, and when it must skip."""
    needs = sorted({d.split(":")[0] for d in devices} - {"cpu", "meta"})
    marks = [f"_needs({device!r})" for device in needs]
    if operator.cuda_only:
        marks.append("_CUDA_BUILD")
    if operator.triton and not needs:
        marks.append("_TRITON_ON_GPU")
    ident = f"{op.split('::')[-1]}-cell{cell.strip('[]')}-{case.rsplit('-', 1)[1]}"
    marks_text = f", marks=[{', '.join(marks)}]" if marks else ""
    return f"    pytest.param({op!r}, {case!r}{extra}, id={ident!r}{marks_text}),"


def _stored(args: tuple, kwargs: Any) -> tuple[dict[str, Any], list[str]]:
    """A sample's arguments with every tensor on the CPU, and the tensors' devices in order."""
    stored_args, devices = _stored_value(tuple(args))
    stored_kwargs, more = _stored_value(dict(kwargs))
    return {"args": stored_args, "kwargs": stored_kwargs}, devices + more


def _stored_value(value: Any) -> tuple[Any, list[str]]:
    """``value`` with tensors moved to the CPU (``requires_grad`` kept), and their devices."""
    devices: list[str] = []

    def move(item: Any) -> Any:
        if isinstance(item, torch.Tensor):
            devices.append(str(item.device))
            stored = item.detach()  # meta tensors stay meta: they have no data to copy
            stored = stored if stored.device.type in ("cpu", "meta") else stored.to("cpu")
            return stored.requires_grad_(True) if item.requires_grad else stored
        if isinstance(item, (list, tuple)):
            return type(item)(move(x) for x in item)
        if isinstance(item, dict):
            return {key: move(x) for key, x in item.items()}
        return item

    return move(value), devices


def _module(package: str, cases: dict[str, list[str]]) -> str:
    """The test module's text."""
    parts = [_HEADER.format(package=package, backend=COMPILE_BACKEND)]
    for kind, template in _TESTS.items():
        if cases[kind]:
            parts.append(template.format(params="\n".join(cases[kind])))
    return "".join(parts)


_HEADER = '''"""Tests of {package}'s operators, generated by opmagic from the checks run in the
notebook: opcheck and gradcheck samples, compare runs (against what the reference returned
then), a torch.compile smoke test per operator with a fake, and the schemas of ops.json.

Run them against the installed package: pip install --no-build-isolation . && pytest tests
"""

import json
import pathlib

import pytest
import torch

import {package}

HERE = pathlib.Path(__file__).parent
# each sample: its arguments (tensors on the CPU), its tensors' devices, and for compare
# cases what the reference returned and its arguments after the call
SAMPLES = torch.load(HERE / "samples.pt", weights_only=True)
# FakeTensor tracing and AOTAutograd, as Inductor does, without generating code; set it to
# "inductor" to also compile each op's graph (slower)
COMPILE_BACKEND = "{backend}"
# operators a CUDA source defines exist in CUDA builds only
_CUDA_BUILD = pytest.mark.skipif(not {package}.CUDA_BUILD, reason="built without CUDA")
# a %%triton_op's kernels ran in Triton's interpreter in the notebook; here they need a GPU
_TRITON_ON_GPU = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="Triton kernels need a GPU outside opmagic"
)


def _needs(device_type):
    """Skip a sample whose tensors live on a device this machine does not have."""
    module = getattr(torch, device_type, None)
    available = module is not None and getattr(module, "is_available", lambda: False)()
    return pytest.mark.skipif(not available, reason=f"needs a {{device_type}} device")


def _op(name):
    """torch.ops.ns.name.overload (or the packet) for "ns::name.overload"."""
    namespace, _, rest = name.partition("::")
    op = getattr(torch.ops, namespace)
    for part in rest.split("."):
        op = getattr(op, part)
    return op


def _on_devices(value, devices):
    """A fresh copy of a stored value, each tensor on its recorded device."""
    devices = iter(devices)

    def place(item):
        if isinstance(item, torch.Tensor):
            moved = item.detach().to(next(devices)).clone()
            return moved.requires_grad_(item.requires_grad)
        if isinstance(item, (list, tuple)):
            return type(item)(place(x) for x in item)
        if isinstance(item, dict):
            return {{key: place(x) for key, x in item.items()}}
        return item

    return place(value)


def _sample(case):
    """(args, kwargs) of a stored sample, fresh, on their devices."""
    sample = SAMPLES[case]
    args, kwargs = _on_devices((sample["args"], sample["kwargs"]), sample["devices"])
    return args, kwargs


def test_the_operators_have_the_schemas_of_ops_json():
    snapshot = json.loads((HERE.parent / "ops.json").read_text())
    for operator in snapshot["operators"]:
        if operator["cuda_only"] and not {package}.CUDA_BUILD:
            continue
        name, _, overload = operator["name"].partition(".")
        op = _op(f"{{name}}.{{overload or 'default'}}")
        assert str(op._schema) == operator["schema"], operator["name"]
'''

_TESTS = {
    "opcheck": '''

@pytest.mark.parametrize("op, case, test_utils", [
{params}
])
def test_opcheck(op, case, test_utils):
    args, kwargs = _sample(case)
    chosen = {{"test_utils": test_utils}} if test_utils else {{}}  # the checks the notebook ran
    torch.library.opcheck(_op(op), args, kwargs, **chosen)
''',
    "gradcheck": '''

@pytest.mark.parametrize("op, case", [
{params}
])
def test_gradcheck(op, case):
    args, kwargs = _sample(case)
    inputs = [
        a.detach().to(torch.float64).requires_grad_()
        if isinstance(a, torch.Tensor) and a.is_floating_point()
        else a
        for a in args
    ]
    assert torch.autograd.gradcheck(lambda *xs: _op(op)(*xs, **kwargs), tuple(inputs))
''',
    "compare": '''

@pytest.mark.parametrize("op, case, rtol, atol", [
{params}
])
def test_matches_the_reference(op, case, rtol, atol):
    args, kwargs = _sample(case)
    sample = SAMPLES[case]
    expected = _on_devices(sample["expected"], sample["expected_devices"])
    expected_args = _on_devices(sample["expected_args"], sample["expected_args_devices"])
    actual = _op(op)(*args, **kwargs)
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)
    for after, reference_after in zip(args, expected_args):
        if isinstance(reference_after, torch.Tensor):  # in-place kernels change arguments
            torch.testing.assert_close(after, reference_after, rtol=rtol, atol=atol)
''',
    "compile": '''

@pytest.mark.parametrize("op, case", [
{params}
])
def test_compiles_with_fullgraph(op, case):
    function = _op(op)
    args, kwargs = _sample(case)
    expected = function(*args, **kwargs)
    torch._dynamo.reset()
    compiled = torch.compile(
        lambda *args, **kwargs: function(*args, **kwargs), fullgraph=True, backend=COMPILE_BACKEND
    )
    args, kwargs = _sample(case)
    torch.testing.assert_close(compiled(*args, **kwargs), expected)
''',
}
