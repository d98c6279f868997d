"""``%%cuda_kernel`` in a real IPython shell with the session: both paths, without a GPU."""

from __future__ import annotations

import pytest
import torch
from IPython.core.error import UsageError

import opmagic
from opmagic._torch import custom_op_state
from opmagic.errors import CompileError, NoGPUError, OpmagicError, ToolchainError
from opmagic.native.cuda.toolkit import find_cuda_toolkit, gpu_unavailable_reason

from ..native.sources import VADD

pytest.importorskip("cuda.bindings.nvrtc", reason='needs pip install "opmagic[cuda]"')

SPEC = (
    '--launch "out = torch.empty_like(a); vadd[cdiv(a.numel(), 256), 256](a, b, out, a.numel());'
    ' return out"'
)
VADD_OP = f'%%cuda_kernel --op ck::vadd --schema "(Tensor a, Tensor b) -> Tensor" {SPEC}\n{VADD}'
no_gpu = pytest.mark.skipif(gpu_unavailable_reason() is None, reason="checks the no-GPU behaviour")


def test_the_magic_documents_its_options(cells):
    doc = cells.shell.find_cell_magic("cuda_kernel").__doc__
    assert "vadd[grid, block](a, b, out, n)" in doc and "NoGPUError" in doc
    help_text = cells.shell.find_cell_magic("cuda_kernel").__doc__ + str(
        cells.shell.magics_manager.registry["CudaKernelMagics"].cuda_kernel.parser.format_help()
    )
    for option in ("--arch", "--flags", "--include", "--op", "--launch", "--schema", "--whole"):
        assert option in help_text


def test_a_cell_of_kernels_binds_a_launcher_per_kernel(cells):
    result = cells.run(f"%%cuda_kernel\n{VADD}").result
    assert set(result.bound) == {"vadd"} and cells.ns["vadd"] is result.kernels.vadd
    assert result.kernels.where(result.kernels.vadd.signature.line).endswith("line 2")
    assert "vadd[grid, block](a, b, out, n)" in str(result)


def test_op_makes_the_kernel_the_cuda_kernel_shown_at_the_cell_line(cells):
    result = cells.run(VADD_OP, cell_id="ck-op").result
    assert result.op.defined and result.op.schema == "ck::vadd(Tensor a, Tensor b) -> Tensor"
    entry = opmagic.dispatch_table("ck::vadd")["CUDA"]
    assert entry.kind == "kernel" and entry.source.endswith("line 1")  # the magic's line
    with pytest.raises(NotImplementedError, match="'ck::vadd' with arguments from the 'CPU'"):
        torch.ops.ck.vadd(torch.ones(2), torch.ones(2))
    report = str(cells.shell.run_line_magic("opmagic", "session"))
    assert "ck::vadd: def, CUDA kernel" in report and "CUDA kernels (sm_80): vadd" in report


@no_gpu
def test_without_a_gpu_the_op_and_the_launcher_say_no_gpu_is_present(cells):
    cells.run(VADD_OP)
    with pytest.raises(NoGPUError, match="No GPU can run kernels here"):
        cells.ns["vadd"][1, 32](torch.ones(2), torch.ones(2), torch.empty(2), 2)
    cuda_kernel = torch.ops.ck.vadd.default
    with pytest.raises(NoGPUError, match="Cannot launch kernel vadd"):
        cuda_kernel.redispatch(torch._C.DispatchKeySet("CUDA"), torch.ones(2), torch.ones(2))


def test_rerunning_the_cell_replaces_the_kernel_and_retires_the_old_launcher(cells):
    first = cells.run(VADD_OP, cell_id="ck-rerun").result
    edited = VADD_OP.replace("a[i] + b[i]", "a[i] + 2 * b[i]")
    second = cells.run(edited, cell_id="ck-rerun").result  # no "already registered" warning
    assert first.kernels.closed and not second.kernels.closed
    with pytest.raises(RuntimeError, match="replaced by a newer run of its cell"):
        first.kernels.vadd[1, 32](torch.ones(1), torch.ones(1), torch.ones(1), 1)
    registrations = torch._C._dispatch_dump("ck::vadd")
    assert registrations.count("\nCUDA: registered") == 1, registrations


def test_rerunning_replaces_the_kernel_where_torch_refuses_python_overrides(cells, monkeypatch):
    # torch 2.11's Library.impl refuses a second Python kernel for an op's key by default
    # (allow_override=False; 2.13 allows it): re-runs failed on the GPU machine's torch
    impl = torch.library.Library.impl

    def impl_refusing_overrides(self, op_name, fn, dispatch_key="", **kwargs):
        kwargs.setdefault("allow_override", False)
        return impl(self, op_name, fn, dispatch_key, **kwargs)

    monkeypatch.setattr(torch.library.Library, "impl", impl_refusing_overrides)
    cells.run(VADD_OP.replace("ck::vadd", "ck::vadd211"), cell_id="ck-211")
    edited = VADD_OP.replace("ck::vadd", "ck::vadd211").replace("a[i] + b[i]", "a[i] - b[i]")
    second = cells.run(edited, cell_id="ck-211").result
    assert "a[i] - b[i]" in second.kernels.source
    cells.run(edited)  # another cell defining the same op replaces it too
    registrations = torch._C._dispatch_dump("ck::vadd211")
    assert registrations.count("\nCUDA: registered") == 1, registrations


def test_a_custom_op_gets_the_cuda_kernel_and_keeps_its_autograd(cells):
    cells.run(
        "%%custom_op ck::scaled\n"
        "def scaled(x: torch.Tensor, factor: float) -> torch.Tensor:\n"
        "    return x * factor\n"
        "@setup_context\n"
        "def _(ctx, inputs, output):\n"
        "    ctx.factor = inputs[1]\n"
        "@backward\n"
        "def _(ctx, grad):\n"
        "    return grad * ctx.factor, None\n"
    )
    kernel = (
        'extern "C" __global__ void scale(const float* x, float f, float* out, long n) {\n'
        "  long i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] = x[i] * f;\n}\n"
    )
    spec = (
        '--launch "out = torch.empty_like(x); '
        'scale[cdiv(x.numel(), 128), 128](x, factor, out, x.numel()); return out"'
    )
    result = cells.run(f"%%cuda_kernel --op ck::scaled {spec}\n{kernel}").result
    assert not result.op.defined and result.op.library is None  # register_kernel("cuda")
    table = opmagic.dispatch_table("ck::scaled")
    assert table["CUDA"].kind == "kernel" and table["AutogradCUDA"].kind == "autograd"
    assert "cuda" in custom_op_state.custom_op_parts(cells.ns["scaled"])["device_kernels"]
    x = torch.ones(2, requires_grad=True)
    cells.ns["scaled"](x, 3.0).sum().backward()  # the CPU path is the custom op's own
    assert x.grad.tolist() == [3.0, 3.0]


def test_a_compile_error_points_at_the_cell_line_and_keeps_the_previous_run(cells):
    cells.run(VADD_OP, cell_id="ck-error")
    broken = VADD_OP.replace("a[i] + b[i]", "a[i] + c[i]")
    error = cells.fail(broken, cell_id="ck-error")
    assert isinstance(error, CompileError)
    assert str(error).startswith("NVRTC: compile error at cell [")
    assert "line 4:" in str(error).splitlines()[0]
    assert opmagic.dispatch_table("ck::vadd")["CUDA"].kind == "kernel"
    assert not cells.ns["vadd"].closed


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (f"--op ck::bad {SPEC}", "does not exist yet: give its schema"),
        ('--op ck::bad --schema "(Tensor a) -> Tensor" --launch "return a + nope"', "uses nope"),
        (
            '--op ck::bad --schema "(Tensor a) -> Tensor" --launch "vadd[1, 1](a, a, a, 1)"',
            "no return",
        ),
        ('--op ck::bad --schema "(Tensor a -> Tensor" --launch "return a"', "does not parse"),
        ('--op aten::add --launch "return a"', "torch's own operator"),
        ('--launch "return a"', "--op NS::NAME and --launch SPEC go together"),
        ("--whole", "--whole do not apply to a cell of extern"),
    ],
)
def test_bad_options_are_one_clear_error(cells, line, message):
    """Options that do not apply are a UsageError; what the quick path refuses, its own
    OpmagicError (a schema that does not parse, a launch body that does not work)."""
    error = cells.fail(f"%%cuda_kernel {line}\n{VADD}")
    assert isinstance(error, (UsageError, OpmagicError)), repr(error)
    assert str(error).startswith("%%cuda_kernel: ") and message in str(error), str(error)
    assert "ck::bad" not in torch._C._dispatch_get_all_op_names()


def test_unload_removes_the_op(cells):
    cells.run(VADD_OP)
    cells.shell.run_line_magic("unload_ext", "opmagic")
    assert "ck::vadd" not in torch._C._dispatch_get_all_op_names()
    cells.shell.run_line_magic("load_ext", "opmagic")  # the fixture unloads it again


def _has_nvcc() -> bool:
    """Whether the full path can build here."""
    try:
        find_cuda_toolkit()
    except ToolchainError:
        return False
    return True


FULL = """\
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

__global__ void twice_kernel(const float* x, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = 2 * x[i];
}

at::Tensor twice_cuda(const at::Tensor& x) {
  at::Tensor out = at::empty(x.sizes(), x.options());
  int n = x.numel();
  twice_kernel<<<(n + 127) / 128, 128>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
  return out;
}

TORCH_LIBRARY(ck_full, m) { m.def("twice(Tensor x) -> Tensor"); }
TORCH_LIBRARY_IMPL(ck_full, CUDA, m) { m.impl("twice", &twice_cuda); }
"""


@pytest.mark.slow
@pytest.mark.skipif(not _has_nvcc(), reason="needs nvcc")
def test_a_cell_with_torch_library_blocks_takes_the_full_path_and_reloads(cells):
    library = cells.run(f"%%cuda_kernel --arch sm_80\n{FULL}", cell_id="ck-full").result
    assert library.build.cuda_mode == "split" and library.build.archs == ("sm_80",)
    assert opmagic.dispatch_table("ck_full::twice")["CUDA"].source.endswith("line 19")
    edited = cells.run(f"%%cuda_kernel --arch sm_80\n{FULL.replace('2 * x', '3 * x')}", "ck-full")
    assert library.closed and edited.result.operators[0].name == "ck_full::twice"
    error = cells.fail(f"%%cuda_kernel --op ck::x\n{FULL}")
    assert isinstance(error, UsageError)
    assert "--op do not apply to a cell with TORCH_LIBRARY" in str(error)
