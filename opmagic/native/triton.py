"""Triton kernels of a cell: compiled for the GPU or run by Triton's interpreter, checked and
recorded at each launch, their errors reported at the cell's lines.

Without a GPU, a cell's ``@triton.jit`` kernels are made for Triton's interpreter, which
runs them on CPU tensors (chosen while the cell runs: no ``TRITON_INTERPRET`` needed before
``import triton``). The interpreter runs Python, so by itself it accepts kernels a GPU compile
rejects and reads or writes any address a kernel computes; each launch of an interpreted
cell kernel therefore first runs Triton's compiler front end for the launch's argument types
(what a GPU compile would report: an undefined name, a type error, an unsupported construct,
a block size that is not ``tl.constexpr``), and checks every load and store against the
memory of the launch's tensors (an out-of-bounds access raises before it happens, naming the
kernel, the line and the offsets). Launches on fake or meta tensors (FakeTensor tracing, the
op's fake impl) run nothing, as torch's ``wrap_triton`` does for compiled kernels. An
``@triton.autotune`` kernel runs each of its configs once and keeps the first (timing them
needs a GPU).

Every launch is noted for :func:`opmagic.trace` (:mod:`opmagic.dispatch.notes`): the trace
lists it under the operator call that made it, with its grid and meta-parameters.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import inspect
import linecache
import logging
import re
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from .._torch import triton as triton_internals
from ..dispatch import notes
from ..dispatch.sites import label_location
from ..display import Displayable
from ..errors import NoGPUError, TritonKernelError, TritonNotInstalledError
from .diagnostics import Diagnostic, excerpt_text, source_excerpt

INTERPRETER = "interpreter"
DEVICE = "device"
_log = logging.getLogger(__name__)
_HINTS = (
    (
        re.compile(r"must be of type `?tl\.constexpr|must have type `constexpr\[int\]`"),
        "shapes and block sizes must be known when the kernel compiles: annotate the "
        "parameter as tl.constexpr (BLOCK: tl.constexpr) and pass a Python int for it.",
    ),
    (
        re.compile(r"unsupported AST node type: (\w+)"),
        "a Triton kernel is a subset of Python: no try/except, with, lambda, classes, "
        "generators or calls to plain Python functions inside @triton.jit.",
    ),
    (
        re.compile(r"Cannot access global variable"),
        "a kernel reads only tl.constexpr globals (X = tl.constexpr(4)), its arguments and "
        "other @triton.jit functions.",
    ),
)
_ACCESS_WORDS = {"load": "reads", "store": "writes", "atomic": "updates"}


# ---------------------------------------------------------------- installing and choosing


def torch_triton_requirement() -> str | None:
    """The ``triton==X`` requirement of the installed torch wheel (its CUDA builds pin the
    version they were built with; CPU builds require none)."""
    try:
        requirements = importlib.metadata.requires("torch") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for requirement in requirements:
        spec = requirement.split(";", 1)[0].strip()
        if re.match(r"^(pytorch-)?triton\b", spec):
            return spec.replace(" ", "")
    return None


def install_command() -> str:
    """How to install the Triton this torch works with."""
    pinned = torch_triton_requirement()
    if pinned is not None:
        return f'pip install "{pinned}" (the version this torch wheel requires)'
    return (
        'pip install triton, or pip install "opmagic[triton]" (this torch pins no Triton '
        "version: it is a CPU build, and Triton's interpreter runs the kernels on CPU tensors)"
    )


def require_triton() -> None:
    """Import Triton, or raise :class:`TritonNotInstalledError` saying how to install it."""
    try:
        import triton  # noqa: F401
    except ModuleNotFoundError as error:
        if error.name != "triton":
            raise TritonNotInstalledError(
                f"Triton is installed but does not import: it needs {error.name!r}, which is "
                f"missing. Reinstall it with {install_command()}."
            ) from None
        raise TritonNotInstalledError(
            f"Triton is not installed in this Python ({sys.executable}). Install it with "
            f"{install_command()}, then run the cell again."
        ) from None
    except Exception as error:
        raise TritonNotInstalledError(
            f"Triton is installed but does not import ({type(error).__name__}: {error}). "
            f"Reinstall it with {install_command()}."
        ) from None


def gpu_unavailable_reason() -> str | None:
    """Why Triton cannot compile for a GPU here (``None`` when it can)."""
    if torch.version.cuda is None and torch.version.hip is None:
        return f"this torch ({torch.__version__}) is a CPU build"
    if not torch.cuda.is_available():
        return "no GPU is visible to torch (torch.cuda.is_available() is False)"
    return None


def choose_mode(interpret: bool | None) -> tuple[str, str]:
    """``(mode, why)``: Triton's interpreter or a device compile, for ``interpret`` True,
    False or ``None`` (the device when there is a GPU, else the interpreter)."""
    reason = gpu_unavailable_reason()
    if interpret:
        return INTERPRETER, "asked for"
    if reason is None:
        return DEVICE, f"compiled for {torch.cuda.get_device_name()}"
    if interpret is False:
        raise NoGPUError(
            f"interpret=False asks for kernels compiled for a GPU, but {reason}. Leave "
            "interpret unset to run them in Triton's interpreter on CPU tensors."
        )
    return INTERPRETER, f"{reason}: Triton's interpreter runs the kernels on CPU tensors"


@contextlib.contextmanager
def kernels_made_for(mode: str) -> Iterator[None]:
    """``@triton.jit`` inside makes kernels for ``mode`` (:data:`INTERPRETER` or
    :data:`DEVICE`), whatever ``TRITON_INTERPRET`` says. Interpreted where Triton has no
    driver, ``triton.runtime.driver.active`` answers for the CPU (:class:`InterpreterDevice`)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(triton_internals.interpreter_selected(mode == INTERPRETER))
        if mode == INTERPRETER and not triton_internals.has_active_driver():
            stack.enter_context(triton_internals.active_driver(InterpreterDevice()))
        yield


class InterpreterDevice:
    """Triton's active driver while a cell's kernels are made for the interpreter on a machine
    with no GPU driver: the device is the CPU, as Triton's tutorials ask first
    (``DEVICE = triton.runtime.driver.active.get_active_torch_device()``); what only a GPU
    driver knows (``utils.get_device_properties``, a benchmarker) says why it is missing."""

    def get_active_torch_device(self) -> torch.device:
        """The device interpreted kernels run on."""
        return torch.device("cpu")

    def __getattr__(self, name: str) -> Any:
        # an AttributeError, so that Triton's own getattr(driver, name, default) still works
        reason = gpu_unavailable_reason() or "Triton finds no active driver"
        raise AttributeError(
            f"triton.runtime.driver.active.{name}: this cell's kernels run in Triton's "
            f"interpreter on CPU tensors, and there is no GPU driver to ask ({reason}). "
            "Replace what it would answer with fixed values (e.g. a number of programs), or "
            "run the cell where there is a GPU."
        )


def keep_interpreted_op_whole(op: Any) -> None:
    """A ``triton_op`` whose kernels are interpreted stays one call under functionalization
    (AOTAutograd, ``torch.compile``, ``opcheck``): torch decomposes a triton_op into its
    launcher there so that compilers see its kernels, but ``wrap_triton`` cannot make
    interpreted launches traceable, so the decomposed graph would lose them."""
    triton_internals.opaque_under_functionalization(op)


# ---------------------------------------------------------------- a cell's kernels


@dataclass(frozen=True)
class TritonLaunch(Displayable):
    """One launch of a Triton kernel, as a trace lists it under the call that made it."""

    kernel: str
    where: str  # where the kernel is written: "cell [3], line 2"
    grid: tuple[int, ...] | str  # the programs launched (or why the grid is unknown)
    meta: tuple[tuple[str, Any], ...]  # tl.constexpr arguments and launch options
    arguments: tuple[tuple[str, str], ...]  # the other arguments, described
    mode: str  # INTERPRETER or DEVICE


@dataclass(eq=False)
class CellKernel:
    """A Triton kernel a cell defined, with its launches routed through :meth:`launch`."""

    name: str  # the name the cell bound it to
    kernel: Any  # what the cell bound: a JITFunction, InterpretedFunction, Autotuner, ...
    filename: str
    line: int  # its first line (the ``@triton.jit``), as the cell numbers its lines
    interpreted: bool
    _checked: set[tuple] = field(default_factory=set, repr=False)

    @property
    def where(self) -> str:
        """``cell [3], line 2``: where the kernel is written (its first decorator)."""
        return label_location(self.filename, self.line)

    @property
    def function(self) -> Callable[..., Any]:
        """The kernel's Python function."""
        return triton_internals.kernel_function(self.kernel)

    def forget(self) -> None:
        """Drop what Triton compiled (or rewrote) for this kernel, and the checks made."""
        triton_internals.forget_compiled(self.kernel)
        self._checked.clear()

    def launch(self, run: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """One launch (Triton's ``run(*args, grid=..., warmup=..., **kwargs)``): skipped on
        tensors without data, checked, noted, and its Triton errors put at cell lines."""
        if self.interpreted and _holds_no_data(args, kwargs):
            return None
        grid, warmup = kwargs.pop("grid"), kwargs.pop("warmup")
        if self.interpreted and not warmup:
            self._check_front_end(args, kwargs)
        if not warmup and notes.recording():
            notes.note(self._described(grid, args, kwargs))
        try:
            if not self.interpreted or warmup:
                return run(*args, grid=grid, warmup=warmup, **kwargs)
            triton_internals.annotate_constexprs_for_the_interpreter(self.kernel)
            bounds = _Bounds(self)
            with (
                triton_internals.device_functions_interpreted(),
                triton_internals.interpreter_memory_hooks(bounds.arguments, bounds.access),
            ):
                return run(*args, grid=grid, warmup=warmup, **kwargs)
        except triton_internals.compilation_error_class() as error:
            raise _compile_error(self, error) from None
        except triton_internals.interpreter_error_class() as error:
            cause = error.__cause__
            if isinstance(cause, TritonKernelError):
                raise cause.with_traceback(None) from None
            raise _runtime_error(self, cause or error) from None

    def _check_front_end(self, args: tuple, kwargs: dict[str, Any]) -> None:
        """Triton's compiler front end on this launch's argument types, once per types."""
        key = _specialization(self.function, args, kwargs)
        if key in self._checked:
            return
        self._checked.add(key)
        try:
            triton_internals.front_end_check(self.function, args, kwargs)
        except triton_internals.compilation_error_class() as error:
            self._checked.discard(key)
            raise _compile_error(self, error) from None
        except Exception as error:  # not the kernel's fault: the interpreter still runs it
            _log.debug("Triton front-end check of %s skipped: %r", self.name, error)

    def _described(self, grid: Any, args: tuple, kwargs: dict[str, Any]) -> TritonLaunch:
        """The launch as the trace shows it."""
        signature = inspect.signature(self.function)
        parameters = signature.parameters
        known = {k: v for k, v in kwargs.items() if k in parameters}
        bound = signature.bind_partial(*args, **known)
        bound.apply_defaults()
        values = dict(bound.arguments)
        constexprs = _constexpr_names(self.function)
        meta = [(name, values[name]) for name in values if name in constexprs]
        meta += [(name, value) for name, value in kwargs.items() if name not in parameters]
        shown = tuple(
            (name, _short(value)) for name, value in values.items() if name not in constexprs
        )
        try:
            programs = grid({**values, **kwargs}) if callable(grid) else grid
            programs = tuple(int(n) for n in programs)
        except Exception as error:
            programs = f"(the grid function raised {type(error).__name__}: {error})"
        mode = INTERPRETER if self.interpreted else DEVICE
        return TritonLaunch(self.name, self.where, programs, tuple(meta), shown, mode)


@dataclass(eq=False)
class TritonKernels:
    """The Triton kernels one run of a cell defined; a session closes it with the run."""

    kernels: tuple[CellKernel, ...]
    mode: str
    closed: bool = False

    @property
    def description(self) -> str:
        """One line for ``%opmagic session``."""
        names = ", ".join(k.name for k in self.kernels) or "none"
        return f"Triton kernels ({self.mode}): {names}"

    def close(self) -> None:
        """Free what Triton compiled for the kernels (the next run of the cell makes new ones)."""
        if not self.closed:
            self.closed = True
            for kernel in self.kernels:
                kernel.forget()
                _live.discard(kernel)


_live: weakref.WeakSet[CellKernel] = weakref.WeakSet()


def instrument_cell_kernels(namespace: dict[str, Any], filename: str, mode: str) -> TritonKernels:
    """Route the launches of the Triton kernels that code compiled as ``filename`` bound in
    ``namespace`` through :meth:`CellKernel.launch`; kernels of other cells that call kernels
    of the same names forget what they compiled (the next launch compiles against these)."""
    from triton.runtime import KernelInterface

    kernels = []
    for name, value in namespace.items():
        if not isinstance(value, KernelInterface):
            continue
        function = triton_internals.kernel_function(value)
        code = getattr(function, "__code__", None)
        if code is None or code.co_filename != filename:
            continue
        interpreted = triton_internals.is_interpreted(value)
        if interpreted:  # without a GPU, autotuning runs each config once and keeps the first
            for autotuner in triton_internals.autotuners(value):
                triton_internals.time_configs_by_running_once(autotuner)
        kernel = CellKernel(name, value, filename, function.__code__.co_firstlineno, interpreted)
        triton_internals.intercept_run(value, kernel.launch)
        kernels.append(kernel)
    names = {kernel.name for kernel in kernels}
    for other in list(_live):
        if names & referenced_names(other.function):
            other.forget()
    _live.update(kernels)
    return TritonKernels(tuple(kernels), mode)


def def_line(function: Callable[..., Any]) -> int:
    """The line of a function's ``def`` (its code starts at its first decorator)."""
    code = function.__code__
    lines = linecache.getlines(code.co_filename)
    for number in range(code.co_firstlineno, len(lines) + 1):
        if re.match(r"\s*(async\s+)?def\s", lines[number - 1]):
            return number
    return code.co_firstlineno


def referenced_names(function: Callable[..., Any]) -> set[str]:
    """The global names a kernel reads, and those of the kernels it calls, transitively."""
    from triton.runtime import KernelInterface

    names: set[str] = set()
    pending = [function]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if id(current) in seen or not hasattr(current, "__code__"):
            continue
        seen.add(id(current))
        used = _code_names(current.__code__)
        names |= used
        for name in used:
            value = current.__globals__.get(name)
            if isinstance(value, KernelInterface):
                pending.append(triton_internals.kernel_function(value))
    return names


def _code_names(code: Any) -> set[str]:
    """The names a code object and the code objects nested in it read."""
    names = set(code.co_names)
    for constant in code.co_consts:
        if hasattr(constant, "co_names"):
            names |= _code_names(constant)
    return names


# ---------------------------------------------------------------- errors at cell lines


def _compile_error(kernel: CellKernel, error: Exception) -> TritonKernelError:
    """A ``CompilationError`` (a nested one is a helper's) as one error at the cell line of
    the innermost function at fault, the calls that led there after it."""
    chain = []
    current: BaseException | None = error
    compilation_error = triton_internals.compilation_error_class()
    while isinstance(current, compilation_error):
        chain.append(triton_internals.compilation_error_parts(current))
        current = current.__cause__
    message = next((text for *_, text in reversed(chain) if text), "")
    message = message or str(error).strip().splitlines()[-1]
    # where in the user's functions: Triton's own library (tl.zeros, ...) has no cell lines
    places = [
        place
        for src, line, column, _ in chain
        if (place := _place(kernel, src, line, column))[0] is not None
    ]
    filename, line, column, name = places[-1] if places else (None, None, None, kernel.name)
    callers = [
        f"  called from {caller} ({label_location(file, at)})"
        for file, at, _, caller in reversed(places[:-1])
    ]
    return _kernel_error(kernel, name, filename, line, column, message, callers)


def _place(
    kernel: CellKernel, src: str | None, line: int | None, column: int | None
) -> tuple[str | None, int | None, int | None, str]:
    """``(filename, line, column, function name)`` of a compile error's position, from the
    position Triton gives relative to the ``def`` of the function its ``src`` holds."""
    match = re.search(r"^\s*def\s+(\w+)", src or "", re.M)
    name = match[1] if match else kernel.name
    function = _function_named(kernel.function, name)
    if function is None or line is None:
        return None, None, None, name
    start = def_line(function)
    filename = function.__code__.co_filename
    indent = linecache.getline(filename, start)
    indent_width = len(indent) - len(indent.lstrip())
    column = None if column is None else column + indent_width + 1  # counted from 1, as GCC's
    return filename, start + line - 1, column, name


def _function_named(function: Callable[..., Any], name: str) -> Callable[..., Any] | None:
    """The kernel itself or a kernel it calls, transitively, by function name."""
    from triton.runtime import KernelInterface

    if function.__name__ == name:
        return function
    for global_name in referenced_names(function):
        value = function.__globals__.get(global_name)
        if isinstance(value, KernelInterface):
            inner = triton_internals.kernel_function(value)
            if inner.__name__ == name:
                return inner
    return None


def _runtime_error(kernel: CellKernel, error: BaseException) -> TritonKernelError:
    """An exception the interpreter raised inside a kernel, at the innermost line of a
    kernel of a cell in its traceback."""
    frames = [frame for frame, _ in _traceback_frames(error)]
    filename, line, name = kernel.filename, kernel.line, kernel.name
    for frame in reversed(frames):
        if frame.f_code.co_filename in _kernel_files():
            filename, line, name = frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name
            break
    message = f"{type(error).__name__}: {error}"
    return _kernel_error(kernel, name, filename, line, None, message, [])


def _traceback_frames(error: BaseException) -> Iterator[tuple[Any, int]]:
    """``(frame, line)`` of an exception's traceback, outermost first."""
    traceback = error.__traceback__
    while traceback is not None:
        yield traceback.tb_frame, traceback.tb_lineno
        traceback = traceback.tb_next


def _kernel_files() -> set[str]:
    """The files (cells) the live cell kernels were written in."""
    return {kernel.filename for kernel in list(_live)}


def _kernel_error(
    kernel: CellKernel,
    name: str,
    filename: str | None,
    line: int | None,
    column: int | None,
    message: str,
    callers: list[str],
) -> TritonKernelError:
    """The one message of a kernel's error: where, what, the lines, a hint, the callers."""
    place = f"{name} ({label_location(filename, line)})" if filename and line else name
    lines = [f"Triton kernel {place}: {message}"]
    if filename and line:
        source = "".join(linecache.getlines(filename))
        diagnostic = Diagnostic(
            "error", message, filename, line, column, user_line=line, in_source=column is not None
        )
        lines += excerpt_text(source_excerpt(source, diagnostic, 1, 1))
    hint = next((text for pattern, text in _HINTS if pattern.search(message)), None)
    if hint:
        lines.append(f"  hint: {hint}")
    lines += callers
    lines.append("Fix the kernel and run its cell again.")
    return TritonKernelError("\n".join(lines), kernel=kernel.name, filename=filename, line=line)


# ---------------------------------------------------------------- out-of-bounds accesses


@dataclass
class _Tensor:
    """The memory one tensor argument of a launch may be accessed in."""

    name: str
    start: int  # its storage's first byte
    end: int  # one past its storage's last byte
    data: int  # the tensor's own first byte
    numel: int
    dtype: str


class _Bounds:
    """Checks an interpreted launch's accesses against its tensor arguments' memory."""

    def __init__(self, kernel: CellKernel) -> None:
        self.kernel = kernel
        self.tensors: list[_Tensor] = []
        self.starts: Any = None
        self.ends: Any = None

    def arguments(self, args: tuple, kwargs: dict[str, Any]) -> None:
        """The launch's host arguments: every tensor among them gives a valid range."""
        import numpy

        names = list(inspect.signature(self.kernel.function).parameters)
        named = [*zip(names, args, strict=False), *kwargs.items()]
        self.tensors = sorted(
            (t for name, value in named for t in _tensors(name, value)), key=lambda t: t.start
        )
        self.starts = numpy.array([t.start for t in self.tensors], dtype=numpy.uint64)
        self.ends = numpy.array([t.end for t in self.tensors], dtype=numpy.uint64)

    def access(
        self, kind: str, addresses: Any, lanes: Any, size: int, program: tuple[int, ...]
    ) -> None:
        """Raise before a load, store or atomic touches memory outside every tensor."""
        import numpy

        addresses = numpy.asarray(addresses, dtype=numpy.uint64)
        if lanes is not None:
            active = numpy.broadcast_to(numpy.asarray(lanes, dtype=bool), addresses.shape)
            addresses = addresses[active]
        addresses = addresses.ravel()
        if not addresses.size:
            return
        index = numpy.searchsorted(self.starts, addresses, side="right").astype(numpy.int64) - 1
        found = index >= 0
        ends = self.ends[numpy.maximum(index, 0)] if self.tensors else numpy.zeros_like(addresses)
        inside = found & (addresses + numpy.uint64(size) <= ends)
        if inside.all():
            return
        raise self._error(kind, addresses[~inside], index[~inside], size, program)

    def _error(
        self, kind: str, addresses: Any, index: Any, size: int, program: tuple[int, ...]
    ) -> TritonKernelError:
        """The out-of-bounds error: the kernel, the line, the tensor and the offsets."""
        filename, line, name = _access_site(self.kernel)
        verb = _ACCESS_WORDS[kind]
        count = len(addresses)
        lanes = f"{count} element{'s' if count != 1 else ''}"
        if index[0] >= 0:
            tensor = self.tensors[int(index[0])]
            offsets = sorted({(int(a) - tensor.data) // size for a in addresses})
            shown = _ranges(offsets)
            what = (
                f"{verb} {lanes} past the memory of {tensor.name} ({tensor.dtype}, "
                f"{tensor.numel} elements): offsets {shown} from {tensor.name}"
            )
        else:
            what = f"{verb} {lanes} before the memory of every tensor argument"
        message = (
            f"out-of-bounds {kind} in program {program}: it {what}. Mask the access "
            "(mask=offsets < n) or launch fewer programs."
        )
        return _kernel_error(self.kernel, name, filename, line, None, message, [])


def _tensors(name: str, value: Any) -> Iterator[_Tensor]:
    """The tensors an argument holds (a tuple's, a ``triton.reinterpret`` wrapper's)."""
    if isinstance(value, (tuple, list)):
        for index, item in enumerate(value):
            yield from _tensors(f"{name}[{index}]", item)
        return
    tensor = getattr(value, "base", value) if not isinstance(value, torch.Tensor) else value
    if not isinstance(tensor, torch.Tensor):
        return
    storage = tensor.untyped_storage()
    start = storage.data_ptr()
    yield _Tensor(
        name,
        start,
        start + storage.nbytes(),
        tensor.data_ptr(),
        tensor.numel(),
        str(tensor.dtype).removeprefix("torch."),
    )


def _access_site(kernel: CellKernel) -> tuple[str, int, str]:
    """``(filename, line, function)`` of the kernel line making the access now."""
    files = _kernel_files() | {kernel.filename}
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename in files:
            return frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name
        frame = frame.f_back
    return kernel.filename, kernel.line, kernel.name


def _ranges(values: list[int]) -> str:
    """``100..127`` or ``3, 7, 9..12`` (at most five runs, then how many more)."""
    runs: list[list[int]] = []
    for value in values:
        if runs and value == runs[-1][1] + 1:
            runs[-1][1] = value
        else:
            runs.append([value, value])
    shown = [f"{a}..{b}" if a != b else str(a) for a, b in runs[:5]]
    if len(runs) > 5:
        shown.append(f"and {len(runs) - 5} more runs")
    return ", ".join(shown)


# ---------------------------------------------------------------- small helpers


def _holds_no_data(args: tuple, kwargs: dict[str, Any]) -> bool:
    """Whether a tensor argument is fake or meta (tracing: the launch computes nothing)."""
    values: Iterable[Any] = (*args, *kwargs.values())
    return any(
        isinstance(value, torch.Tensor) and triton_internals.holds_no_data(value)
        for value in values
    )


def _constexpr_names(function: Callable[..., Any]) -> set[str]:
    """The parameters annotated ``tl.constexpr`` (the annotation or its spelling)."""
    names = set()
    for name, parameter in inspect.signature(function).parameters.items():
        annotation = parameter.annotation
        spelled = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
        if str(spelled).endswith("constexpr"):
            names.add(name)
    return names


def _specialization(function: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> tuple:
    """What a compile depends on among launch arguments: tensors' dtypes and alignment,
    integers' size class, every tl.constexpr value (exactly) and the launch options."""
    constexprs = _constexpr_names(function)
    names = list(inspect.signature(function).parameters)
    named = [*zip(names, args, strict=False), *sorted(kwargs.items())]
    return tuple((name, _argument_key(value, name in constexprs)) for name, value in named)


def _argument_key(value: Any, exact: bool) -> Any:
    """One argument's part of :func:`_specialization`."""
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype), value.data_ptr() % 16 == 0)
    if exact or not isinstance(value, (int, float)) or isinstance(value, bool):
        return ("value", repr(value))
    if isinstance(value, int):
        return ("int", value == 1, value % 16 == 0, -(2**31) <= value < 2**31)
    return ("float",)


def _short(value: Any) -> str:
    """An argument in a few characters: tensors as ``float32[1000]``."""
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        device = "" if value.device.type == "cpu" else f"@{value.device}"
        return f"{dtype}[{','.join(map(str, value.shape))}]{device}"
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


__all__ = [
    "DEVICE",
    "INTERPRETER",
    "CellKernel",
    "TritonKernels",
    "TritonLaunch",
    "choose_mode",
    "gpu_unavailable_reason",
    "install_command",
    "instrument_cell_kernels",
    "keep_interpreted_op_whole",
    "kernels_made_for",
    "require_triton",
]
