"""``triton_op_from_source`` on a GPU: kernels compiled for the device, their compile errors at
cell lines, ``torch.compile(fullgraph=True)`` through the op, timing against torch, and the
interpreter on request. Skipped without a GPU (with the reason); on one:
``python -m pytest -q -m gpu tests/cells/test_triton_op_gpu.py``.
"""

from __future__ import annotations

import itertools

import pytest
import torch

import opmagic
from opmagic import triton_op_from_source
from opmagic.errors import TritonKernelError
from opmagic.native.triton import gpu_unavailable_reason

pytest.importorskip("triton")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(gpu_unavailable_reason() is not None, reason=str(gpu_unavailable_reason())),
]

ADD = """
import triton
import triton.language as tl
from torch.library import wrap_triton

@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x {op} tl.load(y_ptr + offsets, mask=mask), mask=mask)

def add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = out.numel()
    wrap_triton(add_kernel)[(triton.cdiv(n, 1024),)](x, y, out, n, BLOCK=1024)
    return out
"""
_names = itertools.count(1)


def define(op: str = "+", **kwargs) -> tuple[dict, opmagic.TritonOpResult]:
    namespace = {"torch": torch}
    result = triton_op_from_source(
        ADD.format(op=op), f"tgpu{next(_names)}::add", namespace=namespace, **kwargs
    )
    return namespace, result


def test_kernels_are_compiled_for_the_gpu_and_match_torch():
    namespace, result = define()
    assert result.mode == "device" and result.why.startswith("compiled for ")
    x, y = torch.randn(98432, device="cuda"), torch.randn(98432, device="cuda")
    torch.testing.assert_close(namespace["add"](x, y), x + y)
    traced = opmagic.trace(namespace["add"], x, y)
    (launch,) = traced.calls[0].notes
    assert launch.mode == "device" and launch.grid == (97,)


def test_a_compile_error_is_shown_at_the_kernels_cell_line():
    namespace, _ = define(op="+ undefined_name +")
    x = torch.randn(10, device="cuda")
    with pytest.raises(TritonKernelError, match=r":11\): NameError: undefined_name"):
        namespace["add"](x, x)


@pytest.mark.slow
def test_torch_compile_fullgraph_sees_the_kernel_and_an_edit_compiles_anew():
    namespace, _ = define()
    x, y = torch.randn(4096, device="cuda"), torch.randn(4096, device="cuda")
    compiled = torch.compile(lambda a, b: namespace["add"](a, b) * 2, fullgraph=True)
    torch.testing.assert_close(compiled(x, y), (x + y) * 2)
    namespace, _ = define(op="*")
    recompiled = torch.compile(lambda a, b: namespace["add"](a, b) * 2, fullgraph=True)
    torch.testing.assert_close(recompiled(x, y), (x * y) * 2)


def test_compare_times_the_op_against_torch_on_the_gpu():
    _, result = define()

    def inputs(size, dtype, device):
        a = torch.randn(size, dtype=dtype, device=device)
        return a, torch.randn_like(a)

    comparison = opmagic.compare(result.op, torch.add, inputs, sizes=[2**16, 2**20])
    assert comparison.passed
    assert all(row.timing is not None and row.reference_timing is not None
               for row in comparison.rows)


def test_the_interpreter_on_request_checks_gpu_tensors_through_host_copies():
    namespace, result = define(interpret=True)
    assert result.mode == "interpreter"
    x, y = torch.randn(3000, device="cuda"), torch.randn(3000, device="cuda")
    torch.testing.assert_close(namespace["add"](x, y), x + y)
