"""No false alarms (slow: these compile). Every op of torch's own ``custom_op_db`` with its
OpInfo samples climbs the eager rungs, opcheck and make_fx without a finding; a few
representative ops climb torch.compile (aot_eager, Inductor), export and AOTInductor too; and
C++ operators written as extension-cpp writes them (``%%torch_library``'s compile_library,
fakes and autograd registered from Python) are healthy.
"""

from __future__ import annotations

import pytest
import torch

from opmagic import compile_library, doctor

pytest.importorskip("expecttest", reason='needs pip install "opmagic[test]" (expecttest)')
from torch.testing._internal.custom_op_db import custom_op_db

pytestmark = pytest.mark.slow


def _samples(info) -> list[tuple[tuple, dict]]:
    """The OpInfo's samples on CPU in float32 (with requires_grad where it supports autograd)."""
    dtype = torch.float32 if torch.float32 in info.dtypes else sorted(info.dtypes, key=str)[0]
    grad = info.supports_autograd and dtype.is_floating_point
    return [
        ((sample.input, *sample.args), dict(sample.kwargs))
        for sample in info.sample_inputs("cpu", dtype, requires_grad=grad)
    ]


@pytest.mark.parametrize("info", custom_op_db, ids=lambda info: info.name)
def test_every_custom_op_db_op_has_no_finding(info) -> None:
    found = doctor(info.op, samples=_samples(info), until="make_fx", progress=False)
    assert found.ok, str(found)


@pytest.mark.parametrize("name", ["NumpyCubeCustomOp", "NumpyNonzeroCustomOp"])
def test_representative_ops_compile_and_export_healthy(name: str) -> None:
    """A differentiable op and one whose output size depends on the data, through Inductor
    and export (AOTInductor takes a minute on two cores: see the next test)."""
    info = next(i for i in custom_op_db if i.name == name)
    found = doctor(info.op, samples=_samples(info)[:2], until="export", progress=False)
    assert found.ok, str(found)
    assert found.rung("inductor").status == "pass" and found.rung("export").status == "pass"


def test_an_aot_inductor_package_of_a_healthy_op_runs_like_eager() -> None:
    info = next(i for i in custom_op_db if i.name == "NumpyMulCustomOp")
    found = doctor(
        info.op, samples=_samples(info)[:1], rungs=["export", "aot_inductor"], progress=False
    )
    assert found.ok, str(found)
    assert found.rung("aot_inductor").status == "pass"


# the extension-cpp tutorial's operators, written the same way: a CPU kernel per op in C++,
# fakes and autograd registered from Python
MULADD = r"""
#include <torch/extension.h>

at::Tensor muladd_cpu(const at::Tensor& a, const at::Tensor& b, double c) {
  TORCH_CHECK(a.sizes() == b.sizes() && a.dtype() == at::kFloat && b.dtype() == at::kFloat);
  return (a.contiguous() * b.contiguous() + c).contiguous();
}

at::Tensor mul_cpu(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.sizes() == b.sizes() && a.dtype() == at::kFloat && b.dtype() == at::kFloat);
  return (a.contiguous() * b.contiguous()).contiguous();
}

void add_out_cpu(const at::Tensor& a, const at::Tensor& b, at::Tensor& out) {
  TORCH_CHECK(a.sizes() == b.sizes() && b.sizes() == out.sizes() && out.is_contiguous());
  out.copy_(a + b);
}

TORCH_LIBRARY(doctor_ext, m) {
  m.def("mymuladd(Tensor a, Tensor b, float c) -> Tensor");
  m.def("mymul(Tensor a, Tensor b) -> Tensor");
  m.def("myadd_out(Tensor a, Tensor b, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(doctor_ext, CPU, m) {
  m.impl("mymuladd", &muladd_cpu);
  m.impl("mymul", &mul_cpu);
  m.impl("myadd_out", &add_out_cpu);
}
"""


def test_the_extension_cpp_ops_are_healthy(build_cache) -> None:
    library = compile_library(MULADD, progress=None)
    registrations = torch.library.Library("doctor_ext", "FRAGMENT")
    try:
        for name in ("mymuladd", "mymul"):
            torch.library.register_fake(
                f"doctor_ext::{name}", lambda a, b, *rest: torch.empty_like(a), lib=registrations
            )

        def backward(ctx, grad):
            a, b = ctx.saved_tensors
            return torch.ops.doctor_ext.mymul(grad, b), torch.ops.doctor_ext.mymul(grad, a), None

        def setup_context(ctx, inputs, output):
            ctx.save_for_backward(inputs[0], inputs[1])

        torch.library.register_autograd(
            "doctor_ext::mymuladd", backward, setup_context=setup_context, lib=registrations
        )
        ops = torch.ops.doctor_ext
        a, b = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
        samples = {
            ops.mymuladd.default: [
                ((a, b, 1.0), {}),
                ((torch.randn(2, 3), torch.randn(2, 3), -0.3), {}),
            ],
            ops.mymul.default: [((torch.randn(3), torch.randn(3)), {})],
            ops.myadd_out.default: [((torch.randn(3), torch.randn(3), torch.randn(3)), {})],
        }
        for op, given in samples.items():
            found = doctor(op, samples=given, until="aot_eager", progress=False)
            assert found.ok, str(found)
    finally:
        registrations._destroy()
        library.close()
