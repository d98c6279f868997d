"""The NVRTC quick path without a GPU: real compiles, errors at source lines, launcher checks."""

from __future__ import annotations

import ctypes

import pytest
import torch

from opmagic import cdiv, cuda_kernel_from_source
from opmagic.errors import (
    ArgumentTypeError,
    ArgumentValueError,
    BuildOptionError,
    CompileError,
    NoGPUError,
)
from opmagic.native.cuda import launcher, nvrtc
from opmagic.native.cuda.nvrtc import compile_cuda_kernels, nvrtc_target
from opmagic.native.cuda.source import KernelParameter
from opmagic.native.cuda.toolkit import gpu_unavailable_reason, parse_archs

from ..sources import VADD

pytest.importorskip("cuda.bindings.nvrtc", reason='needs pip install "opmagic[cuda]"')

no_gpu = pytest.mark.skipif(
    gpu_unavailable_reason() is None, reason="checks what happens without a GPU"
)


def test_kernels_compile_to_cubin_and_get_a_launcher_each():
    kernels = compile_cuda_kernels(VADD + VADD.replace("vadd", "vsub").replace("+ b", "- b"))
    assert list(kernels.kernels) == ["vadd", "vsub"]
    assert kernels.binary.kind == "cubin" and kernels.binary.data.startswith(b"\x7fELF")
    assert kernels.vadd.signature.parameters[3].base == "int"
    assert "vadd[grid, block](a, b, out, n)" in str(kernels)


def test_an_unchanged_source_comes_from_the_cache():
    compile_cuda_kernels(VADD, nvrtc_flags="-DCACHED=1")
    assert compile_cuda_kernels(VADD, nvrtc_flags="-DCACHED=1").cached


def test_cuda_headers_are_found_without_include_options():
    source = (
        "#include <cuda_fp16.h>\n"
        'extern "C" __global__ void half_scale(__half* x, __half s, int n) {\n'
        "  int i = threadIdx.x; if (i < n) x[i] = __hmul(x[i], s);\n}\n"
    )
    kernels = compile_cuda_kernels(source)
    assert [p.base for p in kernels.half_scale.signature.parameters] == ["__half", "__half", "int"]


def test_a_compile_error_points_at_the_cell_line():
    broken = VADD.replace("out[i] = a[i] + b[i]", "out[i] = a[i] + c[i]")
    with pytest.raises(CompileError) as raised:
        compile_cuda_kernels(broken, label="cell [4]", first_line=2)
    message = str(raised.value)
    assert message.startswith("NVRTC: compile error at cell [4], line 4:")
    assert 'identifier "c" is undefined' in message
    assert "> 4 |   if (i < n) out[i] = a[i] + c[i];" in message
    assert raised.value.diagnostics[0].user_line == 3


def test_a_kernel_whose_signature_does_not_parse_reports_its_compile_error():
    broken = VADD.replace("int n)", "int n")  # the parameter list is never closed
    with pytest.raises(CompileError) as raised:
        compile_cuda_kernels(broken, label="cell [4]", first_line=2)
    assert str(raised.value).startswith("NVRTC: compile error at cell [4], line 2:")
    assert "defines no kernel" not in str(raised.value)


def test_arch_and_flags_reach_nvrtc():
    ptx = compile_cuda_kernels(VADD, arch="compute_80", nvrtc_flags=["-DUNUSED=1"])
    assert ptx.binary.kind == "ptx" and b".target sm_80" in ptx.binary.data
    with pytest.raises(CompileError, match="NVRTC"):
        compile_cuda_kernels(VADD, nvrtc_flags="--no-such-option")
    with pytest.raises(BuildOptionError, match="one architecture at a time"):
        compile_cuda_kernels(VADD, arch="sm_80,sm_90")


def test_kernels_a_launcher_cannot_call_are_refused_at_their_line():
    with pytest.raises(BuildOptionError, match=r'line 2: kernel k is not extern "C"'):
        compile_cuda_kernels("\n__global__ void k(float* x) {}\n")
    struct = 'struct P { int n; };\nextern "C" __global__ void k(P p) {}\n'
    with pytest.raises(BuildOptionError, match="parameter p of kernel k has type 'P'"):
        compile_cuda_kernels(struct)
    with pytest.raises(BuildOptionError, match="defines no kernel"):
        compile_cuda_kernels("__device__ float f(float x) { return x; }\n")


def test_architectures_parse_and_unknown_ones_fall_back_to_ptx(monkeypatch):
    assert parse_archs("86, 8.9,compute_90,sm_90a") == ("sm_86", "sm_89", "compute_90", "sm_90a")
    with pytest.raises(BuildOptionError, match="Unknown GPU architecture"):
        parse_archs("ampere")
    monkeypatch.setattr(nvrtc, "supported_archs", lambda: [75, 80, 86, 90])
    assert nvrtc_target("sm_86") == "sm_86"
    assert nvrtc_target("sm_120") == "compute_90"  # a GPU newer than NVRTC: PTX it can JIT
    with pytest.raises(BuildOptionError, match="cannot compile for sm_70"):
        nvrtc_target("sm_70")


def test_launch_configurations_are_checked_before_anything_runs():
    vadd = compile_cuda_kernels(VADD).vadd
    with pytest.raises(TypeError, match=r"as vadd\[grid, block\]"):
        vadd[1]
    with pytest.raises(TypeError, match="block is a positive int or up to three"):
        vadd[1, 0]
    with pytest.raises(TypeError, match="shared memory is a number of bytes"):
        vadd[1, 32, -1]
    assert vadd[(2, 3), 32, 0].config.grid == (2, 3, 1)


@no_gpu
def test_without_a_gpu_a_launch_says_so_plainly():
    vadd = compile_cuda_kernels(VADD).vadd
    with pytest.raises(NoGPUError, match="No GPU can run kernels here") as raised:
        vadd[1, 32](torch.ones(2), torch.ones(2), torch.empty(2), 2)
    assert "The kernel compiled (sm_80)" in str(raised.value)


def test_scalars_are_converted_to_their_parameters_c_types():
    def convert(base: str, value: object) -> object:
        return launcher._argument("k", KernelParameter("x", base, base, False), value, 0)

    assert isinstance(convert("unsigned int", 7), ctypes.c_uint32)
    assert convert("float", 2).value == 2.0 and isinstance(convert("float", 2), ctypes.c_float)
    assert convert("__half", 1.0).value == 0x3C00  # IEEE half bits of 1.0
    assert convert("__nv_bfloat16", 1.0).value == 0x3F80
    with pytest.raises(ArgumentValueError, match="does not fit a int"):
        convert("int", 2**40)
    with pytest.raises(TypeError, match="pass an int, got the float"):
        convert("int64_t", 1.5)
    with pytest.raises(TypeError, match="pass a Python number"):
        convert("float", torch.ones(1))


def test_pointer_arguments_must_be_tensors_on_the_launch_device():
    pointer = KernelParameter("a", "const float *", "float", True)
    assert launcher._argument("k", pointer, None, 0).value is None
    assert launcher._argument("k", pointer, 4096, 0).value == 4096  # a raw device address
    with pytest.raises(ValueError, match="the tensor is on cpu; the kernel reads memory of cuda:0"):
        launcher._argument("k", pointer, torch.ones(2), 0)
    with pytest.raises(TypeError, match="pass a CUDA tensor"):
        launcher._argument("k", pointer, [1.0], 0)


def test_a_non_contiguous_tensor_is_copied_for_a_const_pointer_and_refused_otherwise():
    # autograd's gradient of sum() is an expanded tensor (one element in memory): passed as
    # its data pointer, the GPU machine's kernel read past it
    const = KernelParameter("x", "const float* __restrict__", "float", True)
    written = KernelParameter("out", "float *", "float", True)
    assert launcher.reads_only(const)
    assert launcher.reads_only(KernelParameter("x", "float const *", "float", True))
    assert not launcher.reads_only(written)
    assert not launcher.reads_only(KernelParameter("x", "float * const", "float", True))
    assert not launcher.reads_only(KernelParameter("x", "const float **", "float", True))
    assert launcher.non_contiguous_problem(const, torch.ones(()).expand(1000)) is None
    problem = launcher.non_contiguous_problem(written, torch.ones(3, 4).t())
    assert "not contiguous (shape (4, 3), strides (1, 4))" in problem
    assert "declare the parameter const" in problem


def test_arguments_of_the_wrong_type_are_named():
    with pytest.raises(BuildOptionError, match="first_line must be a positive line number"):
        compile_cuda_kernels(VADD, first_line="1")
    with pytest.raises(BuildOptionError, match="label must be a string or None"):
        compile_cuda_kernels(VADD, label=3)
    with pytest.raises(BuildOptionError, match="arch must be a str such as 'sm_86'"):
        parse_archs(86)
    with pytest.raises(ArgumentTypeError, match="cdiv takes two integers, the second not 0"):
        cdiv(10, 0)
    with pytest.raises(ArgumentTypeError, match="namespace must be a dict"):
        cuda_kernel_from_source(VADD, namespace="x")
