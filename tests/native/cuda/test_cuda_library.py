"""The CUDA full path with the real nvcc and g++: build, load, register; errors at cell lines.

No GPU is needed to build, load and register; only launching needs one. Calling an op's CUDA
kernel directly (``redispatch`` to the CUDA key with CPU tensors) runs the host code up to
the launch, which then fails for want of a driver: that proves the host and device objects
link, the kernel handle is found and the launch is checked.
"""

from __future__ import annotations

import re
import textwrap

import pytest
import torch

import opmagic
from opmagic.errors import CompileError, MissingHeadersError, ToolchainError
from opmagic.native import compile_cuda_library
from opmagic.native.cuda.toolkit import find_cuda_toolkit, gpu_unavailable_reason

try:
    find_cuda_toolkit()
except ToolchainError as error:  # a machine without nvcc: the quick path still works
    pytest.skip(f"needs nvcc: {error}", allow_module_level=True)

pytestmark = pytest.mark.slow


def vector_ops(namespace: str, kernel_body: str = "out[i] = a[i] * b[i] + c;") -> str:
    """A CUDAExtension-style .cu: muladd (a kernel) and add (a template kernel)."""
    return textwrap.dedent(
        f"""\
        #include <torch/library.h>
        #include <ATen/core/Tensor.h>
        #include <ATen/ops/empty.h>

        __global__ void muladd_kernel(int n, const float* a, const float* b, float c, float* out) {{
          int i = blockIdx.x * blockDim.x + threadIdx.x;
          if (i < n) {kernel_body}
        }}

        template <typename scalar_t>
        __global__ void add_kernel(const scalar_t* a, const scalar_t* b, scalar_t* out, long n) {{
          long i = blockIdx.x * blockDim.x + threadIdx.x;
          if (i < n) out[i] = a[i] + b[i];
        }}

        at::Tensor muladd_cuda(const at::Tensor& a, const at::Tensor& b, double c) {{
          TORCH_CHECK(a.sizes() == b.sizes() && a.is_contiguous() && b.is_contiguous());
          at::Tensor out = at::empty(a.sizes(), a.options());
          int n = a.numel();
          muladd_kernel<<<(n + 255) / 256, 256>>>(n, a.data_ptr<float>(), b.data_ptr<float>(), c,
                                                 out.data_ptr<float>());
          return out;
        }}

        at::Tensor add_cuda(const at::Tensor& a, const at::Tensor& b) {{
          at::Tensor out = at::empty(a.sizes(), a.options());
          if (a.scalar_type() == at::kDouble) {{
            add_kernel<double><<<(a.numel() + 255) / 256, 256, 0, 0>>>(
                a.data_ptr<double>(), b.data_ptr<double>(), out.data_ptr<double>(), a.numel());
          }} else {{
            add_kernel<float><<<(a.numel() + 255) / 256, 256, 0, 0>>>(
                a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), a.numel());
          }}
          return out;
        }}

        TORCH_LIBRARY({namespace}, m) {{
          m.def("muladd(Tensor a, Tensor b, float c) -> Tensor");
          m.def("add(Tensor a, Tensor b) -> Tensor");
        }}

        TORCH_LIBRARY_IMPL({namespace}, CUDA, m) {{
          m.impl("muladd", &muladd_cuda);
          m.impl("add", &add_cuda);
        }}
        """
    )


def line_of(source: str, needle: str) -> int:
    """The 1-based line of ``source`` that contains ``needle``."""
    return next(n for n, text in enumerate(source.splitlines(), 1) if needle in text)


def cuda_kernel_of(op: object, *args: object) -> object:
    """Call an op's CUDA kernel directly (CPU tensors reach it: only the launch needs a GPU)."""
    return op.redispatch(torch._C.DispatchKeySet("CUDA"), *args)


def test_a_cu_builds_split_loads_and_registers_its_cuda_kernels(loaded, core_precompiled):
    source = vector_ops("cu_split")
    library = compile_cuda_library(source, label="cell [2]", first_line=2, progress=None)
    loaded.append(library)
    impl = line_of(source, "TORCH_LIBRARY_IMPL")
    build = library.build
    assert build.cuda_mode == "split" and build.precompiled and build.device_seconds > 0
    assert library.source_file.name == "cu_split.cu"  # the cell as written: the site
    assert [(k.op, k.key, k.line) for k in library.kernels] == [
        ("cu_split::add", "CUDA", impl),
        ("cu_split::muladd", "CUDA", impl),
    ]
    table = opmagic.dispatch_table("cu_split::muladd")
    assert table["CUDA"].kind == "kernel" and table["CUDA"].source == f"cell [2], line {impl + 1}"
    assert library.description.startswith("CUDA library cu_split")
    with pytest.raises(NotImplementedError, match="'CPU' backend"):
        torch.ops.cu_split.muladd(torch.ones(2), torch.ones(2), 1.0)
    if gpu_unavailable_reason() is not None:
        for op, args in (
            (torch.ops.cu_split.muladd.default, (torch.ones(2), torch.ones(2), 1.0)),
            (torch.ops.cu_split.add.default, (torch.ones(2), torch.ones(2))),
        ):
            with pytest.raises(RuntimeError, match=r"CUDA kernel \w+(<float>)? did not launch"):
                cuda_kernel_of(op, *args)


def test_an_unchanged_cu_is_a_cache_hit_and_an_edited_one_replaces_it(loaded):
    first = compile_cuda_library(vector_ops("cu_reload"), progress=None)
    loaded.append(first)
    again = compile_cuda_library(vector_ops("cu_reload"), replace=first, progress=None)
    loaded.append(again)
    assert again.build.cached and again.build.cuda_mode == "split" and first.closed
    edited = compile_cuda_library(
        vector_ops("cu_reload", "out[i] = a[i] * b[i] - c;"), replace=again, progress=None
    )
    loaded.append(edited)
    assert not edited.build.cached and again.closed
    assert opmagic.dispatch_table("cu_reload::muladd")["CUDA"].kind == "kernel"


def test_a_kernel_error_points_at_the_cell_line(build_cache):
    broken = vector_ops("cu_device_error", "out[i] = a[i] * missing + c;")
    with pytest.raises(CompileError) as raised:
        compile_cuda_library(broken, label="cell [5]", first_line=2, progress=None)
    message = str(raised.value)
    line = line_of(broken, "missing") + 1
    assert message.startswith(f"libcu_device_error.so: compile error at cell [5], line {line}:")
    assert 'identifier "missing" is undefined' in message
    assert "nvcc" in raised.value.command  # the kernels compiled without torch's headers


def test_a_host_code_error_points_at_the_cell_line(build_cache):
    broken = vector_ops("cu_host_error").replace("int n = a.numel();", "int n = undefined_count;")
    with pytest.raises(CompileError) as raised:
        compile_cuda_library(broken, label="cell [6]", first_line=2, progress=None)
    message = str(raised.value)
    assert f"compile error at cell [6], line {line_of(broken, 'undefined_count') + 1}:" in message
    assert "'undefined_count' was not declared" in message


def test_a_link_error_is_named(build_cache):
    with pytest.raises(CompileError) as raised:
        compile_cuda_library(
            vector_ops("cu_link_error"), extra_ldflags=["-lno_such_library"], progress=None
        )
    message = str(raised.value)
    assert message.startswith("libcu_link_error.so: link error at cu_link_error.cu:")
    # bfd or gold: "cannot find -l...", lld: "unable to find library -l..."; said once
    assert re.search(r"(cannot find|unable to find library) -lno_such_library", message)
    assert "1 error;" in message


@pytest.mark.skipif(torch.version.cuda is not None, reason="a CUDA build of torch has these")
def test_torch_cuda_api_on_a_cpu_torch_checks_the_kernels_and_says_what_is_missing(build_cache):
    source = "#include <c10/cuda/CUDAStream.h>\n" + vector_ops("cu_cpu_torch").replace(
        "<<<(n + 255) / 256, 256>>>",
        "<<<(n + 255) / 256, 256, 0, c10::cuda::getCurrentCUDAStream()>>>",
    )
    with pytest.raises(MissingHeadersError) as raised:
        compile_cuda_library(source, progress=None)
    message = str(raised.value)
    assert message.startswith("The kernels compiled (nvcc, sm_80 sm_90 compute_90)")
    assert "is a CPU build" in message and "c10/cuda/impl/cuda_cmake_macros.h" in message
    broken = source.replace("out[i] = a[i] * b[i] + c;", "out[i] = a[i] * q;")
    with pytest.raises(CompileError, match='identifier "q" is undefined'):
        compile_cuda_library(broken, progress=None)  # the kernels' errors come first


def test_a_cell_the_split_cannot_handle_is_compiled_whole(loaded):
    source = vector_ops("cu_whole").replace(
        "__global__ void muladd_kernel(int n",
        "static __global__ void muladd_kernel(int n",
    )
    library = compile_cuda_library(source, arch="sm_80", progress=None)
    loaded.append(library)
    assert library.build.cuda_mode == "whole"
    assert "internal linkage" in library.build.note
    assert {k.op for k in library.kernels} == {"cu_whole::add", "cu_whole::muladd"}
    if gpu_unavailable_reason() is not None:
        with pytest.raises(RuntimeError, match="CUDA kernel muladd_kernel did not launch"):
            cuda_kernel_of(torch.ops.cu_whole.muladd.default, torch.ones(2), torch.ones(2), 1.0)
