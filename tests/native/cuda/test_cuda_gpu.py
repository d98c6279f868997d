"""Both CUDA paths running on a GPU, against torch's own ops. Skipped without a GPU.

On a GPU machine (NVIDIA driver, a CUDA build of torch, nvcc of the same CUDA major version,
``pip install -e ".[test,cuda]"``): ``python -m pytest -q -m gpu``.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from opmagic.native import compile_cuda_kernels, compile_cuda_library
from opmagic.native.cuda import launcher
from opmagic.native.cuda.toolkit import gpu_unavailable_reason, running_gpu_arch

from ..sources import VADD

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(gpu_unavailable_reason() is not None, reason=str(gpu_unavailable_reason())),
]

# a .cu as written for a setup.py CUDAExtension: torch's CUDA headers, the current stream
EXTENSION_CU = textwrap.dedent(
    """\
    #include <ATen/Operators.h>
    #include <torch/all.h>
    #include <torch/library.h>
    #include <ATen/cuda/CUDAContext.h>
    #include <cuda.h>
    #include <cuda_runtime.h>

    namespace gpu_ext {

    __global__ void muladd_kernel(int numel, const float* a, const float* b, float c,
                                  float* result) {
      int idx = blockIdx.x * blockDim.x + threadIdx.x;
      if (idx < numel) result[idx] = a[idx] * b[idx] + c;
    }

    template <typename scalar_t>
    __global__ void add_kernel(const scalar_t* a, const scalar_t* b, scalar_t* out, int64_t n) {
      int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
      if (i < n) out[i] = a[i] + b[i];
    }

    at::Tensor mymuladd_cuda(const at::Tensor& a, const at::Tensor& b, double c) {
      TORCH_CHECK(a.sizes() == b.sizes());
      TORCH_CHECK(a.dtype() == at::kFloat && b.dtype() == at::kFloat);
      TORCH_INTERNAL_ASSERT(a.device().type() == at::DeviceType::CUDA);
      at::Tensor a_contig = a.contiguous();
      at::Tensor b_contig = b.contiguous();
      at::Tensor result = torch::empty(a_contig.sizes(), a_contig.options());
      int numel = a_contig.numel();
      muladd_kernel<<<(numel + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
          numel, a_contig.data_ptr<float>(), b_contig.data_ptr<float>(), c,
          result.data_ptr<float>());
      return result;
    }

    at::Tensor myadd_cuda(const at::Tensor& a, const at::Tensor& b) {
      at::Tensor out = torch::empty_like(a);
      AT_DISPATCH_FLOATING_TYPES(a.scalar_type(), "myadd_cuda", [&] {
        add_kernel<scalar_t><<<(a.numel() + 255) / 256, 256, 0,
                               at::cuda::getCurrentCUDAStream()>>>(
            a.data_ptr<scalar_t>(), b.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), a.numel());
      });
      return out;
    }

    TORCH_LIBRARY(gpu_ext, m) {
      m.def("mymuladd(Tensor a, Tensor b, float c) -> Tensor");
      m.def("myadd(Tensor a, Tensor b) -> Tensor");
    }

    TORCH_LIBRARY_IMPL(gpu_ext, CUDA, m) {
      m.impl("mymuladd", &mymuladd_cuda);
      m.impl("myadd", &myadd_cuda);
    }

    }  // namespace gpu_ext
    """
)


def _other_arch() -> str:
    """An architecture whose machine code this GPU cannot run (another major version)."""
    major = int(running_gpu_arch()[3:-1])
    return "sm_80" if major >= 9 else "sm_90"


@pytest.mark.slow
@pytest.mark.parametrize("whole", [False, True], ids=["split", "whole"])
def test_the_extension_cu_matches_torch(loaded, whole):
    library = compile_cuda_library(EXTENSION_CU, whole=whole, progress=None)
    loaded.append(library)
    assert library.build.cuda_mode == ("whole" if whole else "split")
    assert library.build.archs == (running_gpu_arch(),)  # the running GPU's by default
    a, b = torch.randn(10_000, device="cuda"), torch.randn(10_000, device="cuda")
    torch.testing.assert_close(torch.ops.gpu_ext.mymuladd(a, b, 0.5), a * b + 0.5)
    torch.testing.assert_close(torch.ops.gpu_ext.myadd(a, b), a + b)
    a64, b64 = a.double(), b.double()
    torch.testing.assert_close(torch.ops.gpu_ext.myadd(a64, b64), a64 + b64)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # getCurrentCUDAStream() is the caller's stream
        result = torch.ops.gpu_ext.mymuladd(a, b, 2.0)
    stream.synchronize()
    torch.testing.assert_close(result, a * b + 2.0)


@pytest.mark.slow
def test_a_full_path_kernel_built_for_another_gpu_fails_to_launch_loudly(loaded):
    other = _other_arch()
    library = compile_cuda_library(
        EXTENSION_CU.replace("gpu_ext", "gpu_ext_arch"), arch=other, progress=None
    )
    loaded.append(library)
    a = torch.ones(4, device="cuda")
    with pytest.raises(RuntimeError, match=rf"did not launch.*built for {other}"):
        torch.ops.gpu_ext_arch.mymuladd(a, a, 1.0)


def test_quick_path_launchers_match_torch():
    kernels = compile_cuda_kernels(VADD)
    assert kernels.binary.kind == "cubin" and kernels.binary.arch == running_gpu_arch()
    a, b = torch.randn(5000, device="cuda"), torch.randn(5000, device="cuda")
    out = torch.empty_like(a)
    kernels.vadd[(5000 + 255) // 256, 256](a, b, out, 5000)
    torch.testing.assert_close(out, a + b)
    stream = torch.cuda.Stream()
    out.zero_()
    kernels.vadd[20, 256, 0, stream](a, b, out, 5000)
    stream.synchronize()
    torch.testing.assert_close(out, a + b)
    with torch.cuda.stream(stream):  # a launch without a stream takes torch's current one
        assert launcher._current_raw_stream(0) == stream.cuda_stream
        out.zero_()
        kernels.vadd[20, 256](a, b, out, 5000)
    stream.synchronize()
    torch.testing.assert_close(out, a + b)
    assert launcher._current_raw_stream(0) == torch.cuda.current_stream().cuda_stream


def test_non_contiguous_tensors_are_copied_for_const_pointers_and_refused_otherwise():
    vadd = compile_cuda_kernels(VADD).vadd  # (const float* a, const float* b, float* out, n)
    a = torch.randn(64, 32, device="cuda").t()  # transposed: read in memory order, it is wrong
    b = torch.randn(32, 64, device="cuda")
    grad = torch.ones((), device="cuda").expand(32, 64)  # one element in memory
    out = torch.empty(32, 64, device="cuda")
    vadd[8, 256](a, grad, out, 2048)
    torch.testing.assert_close(out, a + 1)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    for launch_stream in (stream, stream.cuda_stream):  # the copies are made on that stream
        out = torch.zeros(32, 64, device="cuda")
        stream.wait_stream(torch.cuda.current_stream())
        vadd[8, 256, 0, launch_stream](a, b, out, 2048)
        stream.synchronize()
        torch.testing.assert_close(out, a + b)
    with pytest.raises(ValueError, match=r"argument out \(float \*\): the tensor is not contig"):
        vadd[8, 256](b, b, torch.empty(64, 32, device="cuda").t(), 2048)


def test_shared_memory_half_scalars_and_2d_grids():
    source = textwrap.dedent(
        """\
        #include <cuda_fp16.h>
        extern "C" __global__ void block_sums(const float* x, float* sums, int n) {
          extern __shared__ float partial[];
          int i = blockIdx.x * blockDim.x + threadIdx.x;
          partial[threadIdx.x] = i < n ? x[i] : 0.0f;
          __syncthreads();
          for (int s = blockDim.x / 2; s > 0; s /= 2) {
            if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
            __syncthreads();
          }
          if (threadIdx.x == 0) sums[blockIdx.x] = partial[0];
        }
        extern "C" __global__ void scale_half(__half* x, __half factor, int rows, int cols) {
          int r = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
          if (r < rows && c < cols) x[r * cols + c] = __hmul(x[r * cols + c], factor);
        }
        """
    )
    kernels = compile_cuda_kernels(source)
    x = torch.randn(1000, device="cuda")
    sums = torch.empty(4, device="cuda")
    kernels.block_sums[4, 256, 256 * 4](x, sums, 1000)
    torch.testing.assert_close(sums.sum(), x.sum(), rtol=1e-4, atol=1e-4)
    h = torch.randn(3, 100, device="cuda", dtype=torch.float16)
    expected = h * 2
    kernels.scale_half[(1, 3), 128](h, 2.0, 3, 100)
    torch.testing.assert_close(h, expected)


def test_quick_path_mismatches_say_what_to_do():
    a = torch.ones(4, device="cuda")
    with pytest.raises(TypeError, match=r"a float\* reads torch.float32"):
        compile_cuda_kernels(VADD).vadd[1, 32](a.double(), a, a, 4)
    other = compile_cuda_kernels(VADD.replace("vadd", "vadd_other"), arch=_other_arch())
    with pytest.raises(RuntimeError, match=r"do not load on cuda:0.*--arch sm_"):
        other.vadd_other[1, 32](a, a, a, 4)
    with pytest.raises(RuntimeError, match="did not launch with grid"):
        compile_cuda_kernels(VADD).vadd[1, 4096](a, a, a, 4)
