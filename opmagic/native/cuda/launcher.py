"""Launching a quick-path kernel from Python: ``kernel[grid, block](*args)``.

The configuration mirrors CUDA's ``<<<grid, block, shared_mem, stream>>>``: grid and block
are an int or up to three ints, shared memory a byte count (default 0), the stream a
``torch.cuda.Stream``, a raw ``cudaStream_t`` int, or ``None`` for torch's current stream on
the tensors' device. Tensors are passed as their data pointers (after checking they are on
that GPU and that their dtype fits the pointer type; a kernel indexes them as flat arrays, so a
non-contiguous tensor is passed as a contiguous copy to a ``const T*`` parameter and refused by
any other); Python numbers are converted to each
parameter's C type, with a range check. The module is loaded on first launch per device,
through the CUDA driver (``cuda-bindings``), into torch's primary context.
"""

from __future__ import annotations

import contextlib
import ctypes
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ..._torch.cuda import current_raw_stream
from ...errors import ArgumentTypeError, ArgumentValueError, CudaLaunchError, NoGPUError
from .source import KernelParameter, KernelSignature
from .toolkit import gpu_unavailable_reason, running_gpu_arch


class KernelBinary(Protocol):
    """A compiled module for one architecture, as the driver loads it."""

    @property
    def data(self) -> bytes:
        """The CUBIN or PTX."""
        ...

    @property
    def arch(self) -> str:
        """``"sm_86"`` (CUBIN) or ``"compute_86"`` (PTX)."""
        ...

    @property
    def kind(self) -> str:
        """``"cubin"`` or ``"ptx"``."""
        ...


class KernelModule(Protocol):
    """What a launcher needs of the compiled source it belongs to (NVRTC's ``CudaKernels``):
    its name for messages, and the binary for a GPU's architecture."""

    @property
    def label(self) -> str:
        """The source's name for messages (``cell [3]``)."""
        ...

    @property
    def binary(self) -> KernelBinary:
        """The binary compiled for the default architecture."""
        ...

    def binary_for(self, arch: str | None) -> KernelBinary:
        """The binary for a GPU of architecture ``arch``."""
        ...

# C scalar types a launcher converts Python numbers to: (ctypes type, integral?)
_SCALARS: dict[str, tuple[Any, bool]] = {
    "bool": (ctypes.c_bool, True),
    "char": (ctypes.c_int8, True),
    "signed char": (ctypes.c_int8, True),
    "int8_t": (ctypes.c_int8, True),
    "unsigned char": (ctypes.c_uint8, True),
    "uint8_t": (ctypes.c_uint8, True),
    "short": (ctypes.c_int16, True),
    "int16_t": (ctypes.c_int16, True),
    "unsigned short": (ctypes.c_uint16, True),
    "uint16_t": (ctypes.c_uint16, True),
    "int": (ctypes.c_int32, True),
    "signed": (ctypes.c_int32, True),
    "signed int": (ctypes.c_int32, True),
    "int32_t": (ctypes.c_int32, True),
    "unsigned": (ctypes.c_uint32, True),
    "unsigned int": (ctypes.c_uint32, True),
    "uint32_t": (ctypes.c_uint32, True),
    "long": (ctypes.c_int64, True),
    "long int": (ctypes.c_int64, True),
    "long long": (ctypes.c_int64, True),
    "long long int": (ctypes.c_int64, True),
    "int64_t": (ctypes.c_int64, True),
    "ptrdiff_t": (ctypes.c_int64, True),
    "unsigned long": (ctypes.c_uint64, True),
    "unsigned long long": (ctypes.c_uint64, True),
    "uint64_t": (ctypes.c_uint64, True),
    "size_t": (ctypes.c_uint64, True),
    "float": (ctypes.c_float, False),
    "double": (ctypes.c_double, False),
    "__half": (ctypes.c_uint16, False),
    "half": (ctypes.c_uint16, False),
    "__nv_bfloat16": (ctypes.c_uint16, False),
    "nv_bfloat16": (ctypes.c_uint16, False),
}
# the tensor dtypes a pointer parameter accepts (base types not listed accept any tensor)
_POINTEES: dict[str, tuple[torch.dtype, ...]] = {
    "float": (torch.float32,),
    "double": (torch.float64,),
    "__half": (torch.float16,),
    "half": (torch.float16,),
    "__nv_bfloat16": (torch.bfloat16,),
    "nv_bfloat16": (torch.bfloat16,),
    "bool": (torch.bool,),
    "char": (torch.int8, torch.uint8),
    "signed char": (torch.int8,),
    "int8_t": (torch.int8,),
    "unsigned char": (torch.uint8,),
    "uint8_t": (torch.uint8,),
    "short": (torch.int16,),
    "int16_t": (torch.int16,),
    "int": (torch.int32,),
    "int32_t": (torch.int32,),
    "unsigned int": (torch.uint32,),
    "unsigned": (torch.uint32,),
    "uint32_t": (torch.uint32,),
    "long": (torch.int64,),
    "long long": (torch.int64,),
    "int64_t": (torch.int64,),
    "uint64_t": (torch.uint64,),
}
_MAX_DIMS = 3
_MAX_DIM = 2**31 - 1  # what CUDA's unsigned dimensions hold (grid x; the driver checks the rest)


def check_signature(kernel: KernelSignature) -> str | None:
    """Why a launcher cannot pass this kernel's arguments, or ``None``."""
    for parameter in kernel.parameters:
        if not parameter.pointer and parameter.base not in _SCALARS:
            return (
                f"parameter {parameter.name} of kernel {kernel.name} has type "
                f"{parameter.type!r}, which a launcher cannot pass from Python (it passes "
                "pointers and arithmetic scalars: int, unsigned, int64_t, size_t, float, double, "
                "bool, __half, ...). Pass it through a pointer, or use the nvcc full path."
            )
    return None


@dataclass(frozen=True)
class LaunchConfig:
    """``<<<grid, block, shared_mem, stream>>>`` of one launch."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int = 0
    stream: Any = None  # None: torch's current stream on the launch's device


class CudaKernel:
    """A compiled quick-path kernel: ``kernel[grid, block](*args)`` launches it.

    ``kernel[grid, block, shared_mem, stream](*args)`` sets dynamic shared memory (bytes)
    and the stream; ``kernel.launch(grid, block, *args, shared_mem=0, stream=None)`` is the
    same as a method call.
    """

    def __init__(self, signature: KernelSignature, module: KernelModule) -> None:
        self.signature = signature
        self.module = module
        self.closed = False
        self._functions: dict[int, Any] = {}  # device index -> CUfunction

    @property
    def name(self) -> str:
        """The kernel's C name."""
        return self.signature.name

    def __repr__(self) -> str:
        params = ", ".join(f"{p.type} {p.name}" for p in self.signature.parameters)
        return f"<CUDA kernel {self.name}({params}) from {self.module.label}>"

    def __getitem__(self, config: Any) -> _Configured:
        """``kernel[grid, block]``, ``kernel[grid, block, shared_mem]`` or with a stream."""
        parts = config if isinstance(config, tuple) else (config,)
        if not 2 <= len(parts) <= 4:
            raise ArgumentTypeError(
                f"Launch {self.name} as {self.name}[grid, block](...) or "
                f"{self.name}[grid, block, shared_mem, stream](...), as in <<<...>>>."
            )
        grid, block, *rest = parts
        return _Configured(self, _config(self.name, grid, block, *rest))

    def launch(
        self,
        grid: int | Sequence[int],
        block: int | Sequence[int],
        *args: Any,
        shared_mem: int = 0,
        stream: Any = None,
    ) -> None:
        """Launch the kernel with ``args`` (see the class docstring)."""
        self.run(_config(self.name, grid, block, shared_mem, stream), args)

    def run(self, config: LaunchConfig, args: Sequence[Any]) -> None:
        """Launch with a configuration already checked."""
        if self.closed:
            raise CudaLaunchError(
                f"Kernel {self.name} of {self.module.label} was replaced by a newer run of its "
                "cell: use the new one (the name in your namespace points at it)."
            )
        reason = _gpu_reason()
        if reason is not None:
            raise NoGPUError(
                f"Cannot launch kernel {self.name}. {reason} The kernel compiled "
                f"({self.module.binary.arch}); run it on a machine with an NVIDIA GPU, its "
                "driver and a CUDA build of torch."
            )
        parameters = self.signature.parameters
        if len(args) != len(parameters):
            names = ", ".join(p.name for p in parameters)
            raise ArgumentTypeError(
                f"Kernel {self.name} takes {len(parameters)} arguments ({names}); got {len(args)}."
            )
        device = _device_of(args)
        copies: list[torch.Tensor] = []  # contiguous copies, alive until the launch is queued

        def contiguous(tensor: torch.Tensor) -> torch.Tensor:
            with _on_stream(config.stream, device):  # ordered on the launch's stream
                copies.append(tensor.contiguous())
            return copies[-1]

        values = [
            _argument(self.name, p, a, device, contiguous)
            for p, a in zip(parameters, args, strict=True)
        ]
        pointers = (ctypes.c_void_p * max(len(values), 1))(*map(ctypes.addressof, values))
        function = self._function(device)
        stream = config.stream
        if stream is None:
            stream = current_raw_stream(device)
        elif isinstance(stream, torch.cuda.Stream):
            stream = stream.cuda_stream
        driver = _driver()
        (result,) = driver.cuLaunchKernel(
            function,
            *config.grid,
            *config.block,
            config.shared_mem,
            driver.CUstream(int(stream)),
            ctypes.addressof(pointers),
            0,
        )
        if result != driver.CUresult.CUDA_SUCCESS:
            raise CudaLaunchError(_launch_failure(self.name, config, result))

    def _function(self, device: int) -> Any:
        """The kernel in the module loaded for ``device`` (loaded on first use)."""
        function = self._functions.get(device)
        if function is None:
            driver = _driver()
            _make_context_current(device)
            binary = self.module.binary_for(running_gpu_arch(device))
            module = _check(
                driver.cuModuleLoadData(binary.data),
                lambda result: _load_failure(binary.arch, binary.kind, device, result),
            )
            function = _check(
                driver.cuModuleGetFunction(module, self.name.encode()),
                lambda result: f"kernel {self.name} is not in its module ({result.name})",
            )
            self._functions[device] = function
        else:
            _make_context_current(device)
        return function


@dataclass(frozen=True)
class _Configured:
    """A kernel with its launch configuration: call it with the kernel's arguments."""

    kernel: CudaKernel
    config: LaunchConfig

    def __call__(self, *args: Any) -> None:
        """Launch."""
        self.kernel.run(self.config, args)


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for ints: the number of blocks of ``b`` threads covering ``a`` items."""
    try:
        return -(-int(a) // int(b))
    except (TypeError, ValueError, ZeroDivisionError, OverflowError):
        message = f"cdiv takes two integers, the second not 0; got {a!r:.40}, {b!r:.40}."
        raise ArgumentTypeError(message) from None


def _config(
    name: str, grid: Any, block: Any, shared_mem: Any = 0, stream: Any = None
) -> LaunchConfig:
    """A checked launch configuration."""
    if not isinstance(shared_mem, int) or isinstance(shared_mem, bool) or shared_mem < 0:
        raise ArgumentTypeError(f"{name}: shared memory is a number of bytes, got {shared_mem!r}.")
    return LaunchConfig(_dims(name, "grid", grid), _dims(name, "block", block), shared_mem, stream)


def _dims(name: str, what: str, value: Any) -> tuple[int, int, int]:
    """``(x, y, z)`` from an int or up to three ints, each at least 1."""
    parts = list(value) if isinstance(value, (tuple, list, torch.Size)) else [value]
    if not 1 <= len(parts) <= _MAX_DIMS or not all(
        isinstance(p, int) and not isinstance(p, bool) and 1 <= p <= _MAX_DIM for p in parts
    ):
        raise ArgumentTypeError(
            f"{name}: {what} is a positive int or up to three (x, y, z), each at most "
            f"{_MAX_DIM}, got {value!r:.80}."
        )
    return tuple([*parts, 1, 1][:_MAX_DIMS])


def _device_of(args: Sequence[Any]) -> int:
    """The CUDA device of the tensor arguments (else torch's current device)."""
    for value in args:
        if isinstance(value, torch.Tensor) and value.is_cuda:
            return value.device.index if value.device.index is not None else 0
    return torch.cuda.current_device()


def _on_stream(stream: Any, device: int) -> Any:
    """A context making a launch's stream (``None``: the current one) torch's current stream."""
    if stream is None:
        return contextlib.nullcontext()
    if not isinstance(stream, torch.cuda.Stream):
        stream = torch.cuda.ExternalStream(int(stream), device=device)
    return torch.cuda.stream(stream)


def reads_only(parameter: KernelParameter) -> bool:
    """Whether a kernel cannot write through a pointer parameter (``const T*``)."""
    pointee = parameter.type.split("*", 1)[0]
    return parameter.type.count("*") == 1 and "const" in pointee.split()


def _argument(
    kernel: str,
    parameter: KernelParameter,
    value: Any,
    device: int,
    contiguous: Callable[[torch.Tensor], torch.Tensor] = torch.Tensor.contiguous,
) -> Any:
    """A Python argument as the ctypes value of its C parameter.

    ``contiguous`` copies a non-contiguous tensor that a ``const T*`` parameter takes.
    """
    where = f"kernel {kernel}, argument {parameter.name} ({parameter.type})"
    if parameter.pointer:
        if value is None:
            return ctypes.c_void_p(0)
        if isinstance(value, int) and not isinstance(value, bool):
            return ctypes.c_void_p(value)  # a raw device address
        if not isinstance(value, torch.Tensor):
            raise ArgumentTypeError(
                f"{where}: pass a CUDA tensor (or a device address), got {value!r}."
            )
        if not value.is_cuda or (value.device.index or 0) != device:
            raise ArgumentValueError(
                f"{where}: the tensor is on {value.device}; the kernel reads memory of cuda:"
                f"{device}. Move it there (tensor.to('cuda:{device}'))."
            )
        allowed = _POINTEES.get(parameter.base)
        if allowed is not None and value.dtype not in allowed:
            raise ArgumentTypeError(
                f"{where}: the tensor is {value.dtype}; a {parameter.base}* reads "
                f"{' or '.join(str(d) for d in allowed)}. Convert it (tensor.to({allowed[0]}))."
            )
        if not value.is_contiguous():
            problem = non_contiguous_problem(parameter, value)
            if problem is not None:
                raise ArgumentValueError(f"{where}: {problem}")
            value = contiguous(value)
        return ctypes.c_void_p(value.data_ptr())
    ctype, integral = _SCALARS[parameter.base]
    if isinstance(value, torch.Tensor) or not isinstance(value, (int, float, bool)):
        raise ArgumentTypeError(f"{where}: pass a Python number, got {type(value).__name__}.")
    if integral:
        if isinstance(value, float):
            raise ArgumentTypeError(f"{where}: pass an int, got the float {value!r}.")
        converted = ctype(value)
        if parameter.base != "bool" and converted.value != value:
            raise ArgumentValueError(f"{where}: {value} does not fit a {parameter.base}.")
        return converted
    if parameter.base in ("__half", "half"):
        return ctype(struct.unpack("<H", struct.pack("<e", float(value)))[0])
    if "bfloat16" in parameter.base:
        bits = int(torch.tensor(float(value), dtype=torch.bfloat16).view(torch.int16).item())
        return ctype(bits & 0xFFFF)
    return ctype(float(value))


def non_contiguous_problem(parameter: KernelParameter, tensor: torch.Tensor) -> str | None:
    """Why a non-contiguous tensor cannot be passed to a pointer parameter, or ``None`` when a
    contiguous copy can stand in for it (the kernel cannot write through the pointer).

    A kernel indexes a pointer's memory as one flat array: a transposed, sliced or expanded
    tensor (autograd's gradient of ``sum()`` is one) would be read in the wrong order, or past
    its memory.
    """
    if reads_only(parameter):
        return None
    return (
        f"the tensor is not contiguous (shape {tuple(tensor.shape)}, strides "
        f"{tuple(tensor.stride())}), and the kernel indexes its memory as one flat array and "
        "may write through this pointer. Pass a contiguous tensor (tensor.contiguous(), copying "
        "the result back if it must land in this one), or declare the parameter const if the "
        "kernel only reads it (the launcher then passes a contiguous copy)."
    )


_DRIVER: Any = None
_GPU_READY = False  # a GPU ran kernels here: it stays usable for the life of the process


def _driver() -> Any:
    """``cuda.bindings.driver`` (its import is deferred until a kernel launches)."""
    global _DRIVER
    if _DRIVER is None:
        from cuda.bindings import driver

        _DRIVER = driver
    return _DRIVER


def _gpu_reason() -> str | None:
    """:func:`gpu_unavailable_reason`, asked until it is ``None`` (each launch asked it: a few
    microseconds of the ~30 a launch took on an H100)."""
    global _GPU_READY
    if _GPU_READY:
        return None
    reason = gpu_unavailable_reason()
    _GPU_READY = reason is None
    return reason


def _check(returned: tuple, describe: Any) -> Any:
    """The value of a driver call's ``(result, value)``; raises with ``describe(result)``."""
    driver = _driver()
    result, value = returned
    if result != driver.CUresult.CUDA_SUCCESS:
        raise CudaLaunchError(describe(result))
    return value


_CONTEXTS: dict[int, Any] = {}  # device index -> torch's primary context


def _make_context_current(device: int) -> None:
    """Make the device's primary context (the one torch uses) current on this thread."""
    driver = _driver()
    context = _CONTEXTS.get(device)
    if context is None:
        torch.cuda.init()
        handle = _check(driver.cuDeviceGet(device), lambda r: f"cuDeviceGet failed ({r.name})")
        context = _check(
            driver.cuDevicePrimaryCtxRetain(handle),
            lambda r: f"the primary context of cuda:{device} cannot be used ({r.name})",
        )
        _CONTEXTS[device] = context
    current = _check(driver.cuCtxGetCurrent(), lambda r: f"cuCtxGetCurrent failed ({r.name})")
    if int(current) != int(context):
        (result,) = driver.cuCtxSetCurrent(context)
        if result != driver.CUresult.CUDA_SUCCESS:
            raise CudaLaunchError(f"cannot make cuda:{device}'s context current ({result.name})")


def _load_failure(arch: str, kind: str, device: int, result: Any) -> str:
    """Why a module does not load on a device, and what to do."""
    driver = _driver()
    gpu = running_gpu_arch(device)
    text = f"The kernels ({kind} for {arch}) do not load on cuda:{device} ({gpu}): {result.name}."
    if result == driver.CUresult.CUDA_ERROR_NO_BINARY_FOR_GPU:
        text += f" Compile them for this GPU: --arch {gpu} (or leave --arch out)."
    elif result in (
        driver.CUresult.CUDA_ERROR_UNSUPPORTED_PTX_VERSION,
        driver.CUresult.CUDA_ERROR_INVALID_PTX,
    ):
        _, version = driver.cuDriverGetVersion()
        text += (
            f" The PTX comes from a newer NVRTC than this driver (CUDA {version // 1000}."
            f"{version % 1000 // 10}) can JIT-compile: compile to machine code for this GPU "
            f"(--arch {gpu}, or leave --arch out), or install the nvidia-cuda-nvrtc that "
            "matches the driver."
        )
    return text


def _launch_failure(name: str, config: LaunchConfig, result: Any) -> str:
    """Why a launch failed, with the configuration."""
    text = (
        f"CUDA kernel {name} did not launch with grid {config.grid}, block {config.block}, "
        f"shared memory {config.shared_mem} bytes: {result.name}."
    )
    driver = _driver()
    if result == driver.CUresult.CUDA_ERROR_INVALID_VALUE:
        text += " A block has at most 1024 threads, a grid's y and z at most 65535 blocks."
    elif result == driver.CUresult.CUDA_ERROR_OUT_OF_RESOURCES:
        text += " Use fewer threads per block (the kernel needs too many registers)."
    return text
