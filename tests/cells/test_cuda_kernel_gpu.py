"""``%%cuda_kernel`` on a GPU: ``--op`` kernels and autograd through ``%%custom_op``, checked
against torch. Skipped without a GPU; on one: ``python -m pytest -q -m gpu``.
"""

from __future__ import annotations

import pytest
import torch

from opmagic.native.cuda.toolkit import gpu_unavailable_reason

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(gpu_unavailable_reason() is not None, reason=str(gpu_unavailable_reason())),
]

SCALE = (
    'extern "C" __global__ void scale(const float* x, float factor, float* out, long n) {\n'
    "  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;\n"
    "  if (i < n) out[i] = x[i] * factor;\n"
    "}\n"
)
SPEC = (
    '--launch "out = torch.empty_like(x); '
    'scale[cdiv(x.numel(), 256), 256](x, factor, out, x.numel()); return out"'
)


def test_an_op_defined_by_the_cell_runs_its_kernel(cells):
    cells.run(
        f'%%cuda_kernel --op gk::scale --schema "(Tensor x, float factor) -> Tensor" {SPEC}\n'
        f"{SCALE}"
    )
    x = torch.randn(3000, device="cuda")
    torch.testing.assert_close(torch.ops.gk.scale(x, 1.5), x * 1.5)
    edited = SCALE.replace("x[i] * factor", "x[i] * factor + 1.0f")
    cells.run(
        f'%%cuda_kernel --op gk::scale --schema "(Tensor x, float factor) -> Tensor" {SPEC}\n'
        f"{edited}"
    )  # a new cell (no cell id) defining the same op: it replaces the first
    torch.testing.assert_close(torch.ops.gk.scale(x, 1.5), x * 1.5 + 1)


def test_autograd_through_a_custom_op_whose_cuda_kernel_is_the_cells(cells):
    cells.run(
        "%%custom_op gk::scaled\n"
        "def scaled(x: torch.Tensor, factor: float) -> torch.Tensor:\n"
        "    return x * factor\n"
        "@setup_context\n"
        "def _(ctx, inputs, output):\n"
        "    ctx.factor = inputs[1]\n"
        "@backward\n"
        "def _(ctx, grad):\n"
        "    return torch.ops.gk.scaled(grad, ctx.factor), None\n"
    )
    cells.run(f"%%cuda_kernel --op gk::scaled {SPEC}\n{SCALE}")
    x = torch.randn(2048, device="cuda", requires_grad=True)
    y = cells.ns["scaled"](x, 3.0)
    torch.testing.assert_close(y, x.detach() * 3)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, 3.0))


def test_autograd_through_a_custom_op_that_calls_the_launcher(cells):
    cells.run("import opmagic")
    cells.run(f"%%cuda_kernel\n{SCALE}")
    cells.run(
        "%%custom_op gk::launched\n"
        "def launched(x: torch.Tensor, factor: float) -> torch.Tensor:\n"
        "    out = torch.empty_like(x)\n"
        "    scale[opmagic.cdiv(x.numel(), 256), 256](x, factor, out, x.numel())\n"
        "    return out\n"
        "@fake\n"
        "def _(x, factor):\n"
        "    return torch.empty_like(x)\n"
        "@setup_context\n"
        "def _(ctx, inputs, output):\n"
        "    ctx.factor = inputs[1]\n"
        "@backward\n"
        "def _(ctx, grad):\n"
        "    return launched(grad, ctx.factor), None\n"
    )
    x = torch.randn(1000, device="cuda", dtype=torch.float32, requires_grad=True)
    y = cells.ns["launched"](x, -2.0)
    torch.testing.assert_close(y, x.detach() * -2)
    y.sum().backward()
    torch.testing.assert_close(x.grad, torch.full_like(x, -2.0))
