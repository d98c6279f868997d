"""The CUDA source scanner: kernels and their parameters, launches, host/device halves."""

from __future__ import annotations

import textwrap

from opmagic.native.blocks import scan_blocks
from opmagic.native.cuda.source import (
    find_launches,
    kernel_signatures,
    rewrite_launches,
    split_source,
)
from opmagic.native.tokens import tokenize

EXTENSION_CU = textwrap.dedent(
    """\
    #include <torch/library.h>
    #include <ATen/core/Tensor.h>
    #include <cuda_runtime.h>

    namespace ext {

    template <typename scalar_t>
    __global__ void add_kernel(const scalar_t* __restrict__ a, const scalar_t* b, scalar_t* out,
                               int64_t n) {
      auto i = blockIdx.x * blockDim.x + threadIdx.x;
      if (i < n) out[i] = a[i] + b[i];  // a comment with <<<chevrons>>> and "a { brace"
    }

    __device__ float square(float x) { return x * x; }
    __host__ __device__ inline float cube(float x) { return x * x * x; }
    struct Params { int n; float scale; };
    constexpr int kThreads = 256;
    int launches = 0;

    at::Tensor add_cuda(const at::Tensor& a, const at::Tensor& b) {
      auto out = at::empty_like(a);
      add_kernel<float><<<(a.numel() + kThreads - 1) / kThreads, kThreads, 0,
          nullptr>>>(a.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), a.numel());
      std::vector<std::vector<std::vector<int>>> nested;
      return out;
    }

    TORCH_LIBRARY_IMPL(ext, CUDA, m) {
      m.impl("add", &add_cuda);
    }

    }  // namespace ext
    """
)


def _line_of(text: str, needle: str) -> int:
    """1-based line of the first line containing ``needle``."""
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_kernels_are_found_with_their_parameters_lines_and_linkage():
    quick = (
        'extern "C" __global__ void scale(const float* __restrict__ x, float* y, unsigned int n,\n'
        "                                 double factor) {}\n"
        'extern "C" {\n__global__ void fill(__half* out, int64_t n) {}\n}\n'
    )
    scale, fill = kernel_signatures(quick)
    assert (scale.name, scale.line, scale.extern_c, scale.defined) == ("scale", 1, True, True)
    assert [(p.name, p.base, p.pointer) for p in scale.parameters] == [
        ("x", "float", True),
        ("y", "float", True),
        ("n", "unsigned int", False),
        ("factor", "double", False),
    ]
    assert (fill.name, fill.line, fill.extern_c) == ("fill", 4, True)
    assert [(p.base, p.pointer) for p in fill.parameters] == [("__half", True), ("int64_t", False)]
    (add,) = kernel_signatures(EXTENSION_CU)
    assert (add.qualified_name, add.template, add.extern_c) == ("ext::add_kernel", True, False)


def test_comments_strings_and_directives_are_not_code():
    tokens = tokenize('  #include <a.h>\n// x<<<1,1>>>()\nchar* s = "<<<";\n/* __global__ */')
    assert [t.kind for t in tokens][:1] == ["directive"]
    assert not [t for t in tokens if t.kind == "launch"]
    assert kernel_signatures("// __global__ void k() {}\n") == []


def test_launches_become_checked_launch_calls_on_the_same_lines():
    source = "  k<<<grid, 256>>>(a, b);\n  ns::t<float, 4><<<1, dim3(2, 2),\n    smem, s>>>(x);\n"
    launches = find_launches(source)
    assert [(launch.kernel, launch.line) for launch in launches] == [
        ("k", 1),
        ("ns::t<float, 4>", 2),
    ]
    rewritten = rewrite_launches(source)
    assert rewritten.splitlines() == [
        '  ::opmagic_cuda::launch<k>("k", grid, 256)(a, b);',
        '  ::opmagic_cuda::launch<ns::t<float, 4>>("ns::t<float, 4>", 1, dim3(2, 2),',
        "    smem, s)(x);",
    ]


def test_a_cu_splits_into_host_and_device_code_with_its_line_numbers():
    split = split_source(EXTENSION_CU)
    assert split.whole_reason is None, split.whole_reason
    lines = EXTENSION_CU.count("\n")
    assert split.host.count("\n") == split.device.count("\n") == lines
    host, device = split.host.splitlines(), split.device.splitlines()
    kernel_line = _line_of(EXTENSION_CU, "__global__ void add_kernel") - 1
    # the kernel: defined on the device side, declared on the host side
    assert "__global__ void add_kernel" in device[kernel_line]
    assert host[kernel_line + 1].rstrip().endswith("int64_t n) ;")  # declared, body gone
    assert "out[i] = a[i] + b[i]" not in split.host
    # torch's host headers, host functions and TORCH_LIBRARY blocks stay out of nvcc's input
    assert "torch/library.h" not in split.device and "cuda_runtime.h" in split.device
    assert "at::empty_like" not in split.device and "TORCH_LIBRARY_IMPL" not in split.device
    assert "int launches" not in split.device  # a host variable
    # device-only code stays out of g++'s; code for both sides is in both
    assert "square" in split.device and "square" not in split.host
    for shared in ("cube", "struct Params", "kThreads"):
        assert shared in split.host and shared in split.device
    # the launch is rewritten on its own line
    launch_line = _line_of(EXTENSION_CU, "add_kernel<float><<<") - 1
    assert host[launch_line].lstrip().startswith("::opmagic_cuda::launch<add_kernel<float>>(")
    assert split.launched == ("add_kernel<float>",)


def test_cells_the_split_cannot_handle_say_why():
    uses_torch = "__global__ void k(c10::Half* x) {}\nTORCH_LIBRARY(a, m) {}\n"
    assert "uses torch's C++ API" in split_source(uses_torch).whole_reason
    static = "static __global__ void k(float* x) {}\n"
    assert "internal linkage" in split_source(static).whole_reason
    anonymous = "namespace {\n__global__ void k(float* x) {}\n}\n"
    assert "internal linkage" in split_source(anonymous).whole_reason
    guarded = "#ifdef __CUDACC__\n__global__ void k(float* x) {}\n#endif\n"
    assert "__CUDACC__" in split_source(guarded).whole_reason
    symbol = "__constant__ float coeffs[4];\nvoid set() { cudaMemcpyToSymbol(coeffs, 0, 4); }\n"
    assert "device symbol coeffs" in split_source(symbol).whole_reason
    overloaded = "__global__ void k(float* x) {}\n__global__ void k(int* x) {}\n"
    assert "overloaded" in split_source(overloaded).whole_reason


def test_registration_blocks_choose_the_full_path():
    assert scan_blocks(EXTENSION_CU)
    assert not scan_blocks('extern "C" __global__ void k() {}\n// TORCH_LIBRARY\n')
