// opmagic CUDA launch helper, force-included (after the registration preamble) into the host
// code of every %%cuda_kernel full-path build.
//
// opmagic rewrites each `kernel<<<grid, block, shared, stream>>>(args...)` of a cell into
//   ::opmagic_cuda::launch<kernel>("kernel", grid, block, shared, stream)(args...)
// which launches through cudaLaunchKernel and throws when the launch fails, so a kernel that
// cannot run (built for another GPU architecture, too many threads, no driver) raises an error
// in Python instead of silently doing nothing.
//
// The host code may be compiled by g++ (with the precompiled torch headers) while the kernels
// are compiled by nvcc in another object: then kernel_handle<K>() is defined by that object
// (opmagic links each one to an accessor the device object exports), and the CUDA keywords
// below expand to nothing so that g++ reads the kernels' declarations.

#ifndef OPMAGIC_CUDA_LAUNCH_H
#define OPMAGIC_CUDA_LAUNCH_H

#include <cuda_runtime_api.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#ifndef __CUDACC__
#ifndef __global__
#define __global__
#endif
#ifndef __device__
#define __device__
#endif
#ifndef __host__
#define __host__
#endif
#ifndef __forceinline__
#define __forceinline__ inline
#endif
#ifndef __launch_bounds__
#define __launch_bounds__(...)
#endif
#ifndef __grid_constant__
#define __grid_constant__
#endif
#endif  // __CUDACC__

#ifndef OPMAGIC_CUDA_ARCHS
#define OPMAGIC_CUDA_ARCHS "?"
#endif

namespace opmagic_cuda {

// The runtime's handle of a kernel (its host stub's address).
template <auto Kernel>
const void* kernel_handle();

#ifdef __CUDACC__
// Compiled by nvcc together with the kernels: the handle is the kernel's own address.
template <auto Kernel>
const void* kernel_handle() {
  return reinterpret_cast<const void*>(Kernel);
}
#endif

inline std::string launch_failure(const char* name, cudaError_t status) {
  std::string message = std::string("CUDA kernel ") + name +
      " did not launch: " + cudaGetErrorString(status) + " (" + cudaGetErrorName(status) + ").";
  int device = 0;
  cudaDeviceProp properties;
  if (status == cudaErrorNoKernelImageForDevice && cudaGetDevice(&device) == cudaSuccess &&
      cudaGetDeviceProperties(&properties, device) == cudaSuccess) {
    message += " It was built for " OPMAGIC_CUDA_ARCHS "; this GPU is sm_" +
        std::to_string(properties.major) + std::to_string(properties.minor) +
        ": rebuild with --arch sm_" + std::to_string(properties.major) +
        std::to_string(properties.minor) + " (or leave --arch out to target this GPU).";
  } else if (
      status == cudaErrorInsufficientDriver || status == cudaErrorNoDevice ||
      status == cudaErrorInitializationError) {
    message += " No usable NVIDIA GPU and driver: run this on a machine with one.";
  }
  return message;
}

// A kernel with its launch configuration; calling it with the kernel's arguments launches it.
template <typename... Params>
struct Launch {
  const void* handle;
  const char* name;
  dim3 grid;
  dim3 block;
  size_t shared;
  cudaStream_t stream;

  template <typename... Args>
  void operator()(Args&&... args) const {
    static_assert(
        sizeof...(Args) == sizeof...(Params),
        "a kernel launch passes as many arguments as the kernel has parameters");
    // each argument converted to its parameter's type, as in a call
    std::tuple<std::decay_t<Params>...> values(std::forward<Args>(args)...);
    const cudaError_t status = std::apply(
        [this](auto&... value) {
          void* pointers[] = {static_cast<void*>(&value)..., nullptr};
          return cudaLaunchKernel(handle, grid, block, pointers, shared, stream);
        },
        values);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();  // the error is reported here; do not leave it to the next call
      throw std::runtime_error(launch_failure(name, status));
    }
  }
};

// `launch<kernel>("kernel", grid, block[, shared[, stream]])(args...)`: what `<<<...>>>` becomes.
// The configuration is taken as `<<<>>>` takes it: a literal 0 is a null stream, a
// c10::cuda::CUDAStream converts to its cudaStream_t.
template <auto Kernel, typename... Params>
Launch<Params...> launch_of(void (*)(Params...), const char* name, dim3 grid, dim3 block,
                            size_t shared, cudaStream_t stream) {
  return Launch<Params...>{kernel_handle<Kernel>(), name, grid, block, shared, stream};
}

template <auto Kernel>
auto launch(
    const char* name, dim3 grid, dim3 block, size_t shared = 0, cudaStream_t stream = nullptr) {
  return launch_of<Kernel>(Kernel, name, grid, block, shared, stream);
}

}  // namespace opmagic_cuda

#endif  // OPMAGIC_CUDA_LAUNCH_H
