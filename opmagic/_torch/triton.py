"""Private Triton (and torch-Triton) internals opmagic's ``%%triton_op`` relies on.

One function per private call, no policy: :mod:`opmagic.native.triton` decides what to do
with them. Triton is imported only when one of these runs. Checked against triton 3.6 to 3.9
(torch 2.11's CUDA wheels pin 3.6.0, torch 2.13's 3.7.1).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

# Triton 3.9 warns once per process when a compile reads the FP-fusion default; the
# front-end check below is not the user's compile and must not spend (or show) that warning
_FP_FUSION_WARNING = r"TRITON_DEFAULT_FP_FUSION is unset"
# What the front-end check compiles for: the oldest target torch's CUDA wheels build for;
# the front end (Python AST to Triton IR) does not depend on it beyond the dtypes it allows
_CHECK_TARGET = ("cuda", 80, 32)


@contextlib.contextmanager
def interpreter_selected(interpret: bool) -> Iterator[None]:
    """``@triton.jit`` run inside makes interpreted (``True``) or compiled kernels, whatever
    ``TRITON_INTERPRET`` says; the knob (and the variable it mirrors) is restored after."""
    from triton import knobs

    with knobs.runtime.scope():
        knobs.runtime.interpret = interpret
        yield


def has_active_driver() -> bool:
    """Whether Triton finds the one device driver it needs (none on a machine with no GPU)."""
    from triton.runtime.driver import driver

    try:
        driver.active  # noqa: B018 (made on first use; raises when no backend is active)
    except RuntimeError:
        return False
    return True


@contextlib.contextmanager
def active_driver(stand_in: Any) -> Iterator[None]:
    """Within, ``triton.runtime.driver.active`` is ``stand_in``; Triton's own state after."""
    from triton.runtime.driver import driver

    previous = driver._active
    driver.set_active(stand_in)
    try:
        yield
    finally:
        driver._active = previous


def is_kernel(value: Any) -> bool:
    """Whether ``value`` is a Triton kernel object (``@triton.jit``, ``@triton.autotune``, ...);
    ``False`` without importing Triton when nothing imported it yet."""
    runtime = sys.modules.get("triton.runtime")
    kernel_class = getattr(runtime, "KernelInterface", None)
    return kernel_class is not None and isinstance(value, kernel_class)


def launched_kernel(kernel: Any) -> Any:
    """The JITFunction or InterpretedFunction whose ``run`` launches ``kernel`` (through the
    ``fn`` of ``@triton.autotune`` and ``@triton.heuristics`` wrappers)."""
    from triton.runtime.jit import JITFunction

    interpreted = _interpreted_class()
    while not isinstance(kernel, (JITFunction, interpreted)) and hasattr(kernel, "fn"):
        kernel = kernel.fn
    return kernel


def kernel_function(kernel: Any) -> Callable[..., Any]:
    """The Python function a Triton kernel object (or a wrapper of one) was made from."""
    return launched_kernel(kernel).fn


def is_interpreted(kernel: Any) -> bool:
    """Whether ``kernel`` runs in Triton's interpreter (``@triton.jit`` under interpretation)."""
    return isinstance(launched_kernel(kernel), _interpreted_class())


def annotate_constexprs_for_the_interpreter(kernel: Any) -> None:
    """Annotate with ``tl.constexpr`` itself the parameters of an interpreted kernel annotated
    with a string such as ``"tl.constexpr"`` (as PyTorch's documentation writes them), in the
    function the interpreter runs (its rewrite of the kernel's source): the compiler takes
    both spellings, the interpreter only the class (it would pass such a block size as a
    tensor, which ``tl.arange`` refuses)."""
    from triton.language import constexpr

    annotations = launched_kernel(kernel).rewrite().__annotations__
    for name, annotation in list(annotations.items()):
        if isinstance(annotation, str) and "constexpr" in annotation:
            annotations[name] = constexpr


def intercept_run(kernel: Any, around: Callable[..., Any]) -> None:
    """Route every launch of ``kernel`` (``kernel[grid](...)``, autotuner runs, torch's
    ``wrap_triton``) through ``around(run, *args, grid=..., warmup=..., **kwargs)``, where
    ``run`` is the launch itself (Triton's ``run`` method, shadowed on the instance)."""
    target = launched_kernel(kernel)
    run = type(target).run.__get__(target)
    target.run = functools.partial(around, run)


def autotuners(kernel: Any) -> list[Any]:
    """The ``@triton.autotune`` layers of a kernel object, outermost first."""
    from triton.runtime.autotuner import Autotuner

    found = []
    while hasattr(kernel, "fn") and not isinstance(kernel, _interpreted_class()):
        if isinstance(kernel, Autotuner):
            found.append(kernel)
        kernel = kernel.fn
    return found


def time_configs_by_running_once(autotuner: Any) -> None:
    """Make an autotuner "time" each config by running it once, all equally fast, so that it
    keeps the first (timing needs a GPU; the interpreter can only run them)."""

    def run_once(kernel_call: Callable[[], None], quantiles: Any) -> list[float]:
        kernel_call()
        return [0.0 for _ in quantiles]

    autotuner._do_bench = run_once
    autotuner.__dict__.pop("do_bench", None)  # where 3.9's cached_property keeps its answer


def forget_compiled(kernel: Any) -> None:
    """Drop what Triton keeps compiled for ``kernel``: a JITFunction's binaries per device and
    the dependency hash that selects them (so that the next launch compiles against the
    current helpers), or the interpreter's rewritten function."""
    target = launched_kernel(kernel)
    if isinstance(target, _interpreted_class()):
        type(target).rewritten_fn.pop(target.fn, None)
    else:
        target.device_caches.clear()
        target.hash = None


def front_end_check(function: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> None:
    """Run Triton's compiler front end (Python AST to Triton IR) on ``function`` for these
    launch arguments, without a GPU: raises the ``CompilationError`` a device compile would.

    Interpreted helper kernels the function calls are compiled as JIT functions too (on
    copies of their functions, in copies of their globals): the user's objects are untouched.
    """
    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    kernel = _jit_twin(function, {})
    target = GPUTarget(*_CHECK_TARGET)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", _FP_FUSION_WARNING)
        bound, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = kernel._pack_args(
            backend, kwargs, bound, specialization, options
        )
        source = ASTSource(kernel, signature, constexprs, attrs)
        context = ir.context()
        ir.load_dialects(context)
        backend.load_dialects(context)
        codegen = backend.get_codegen_implementation(options)
        source.make_ir(target, options, codegen, backend.get_module_map(), context)


def _jit_twin(function: Callable[..., Any], twins: dict[int, dict[str, Any]]) -> Any:
    """A JITFunction of a copy of ``function`` whose globals hold JIT twins of the interpreted
    kernels the original's globals hold (``twins``: the copied globals, by the original's id)."""
    from triton.runtime.jit import JITFunction

    scope = twins.get(id(function.__globals__))
    if scope is None:
        scope = twins[id(function.__globals__)] = dict(function.__globals__)
        interpreted = _interpreted_class()
        for name, value in list(scope.items()):
            if isinstance(value, interpreted):
                scope[name] = _jit_twin(value.fn, twins)
    twin = types.FunctionType(
        function.__code__,
        scope,
        function.__name__,
        function.__defaults__,
        function.__closure__,
    )
    twin.__kwdefaults__ = function.__kwdefaults__
    twin.__annotations__ = dict(function.__annotations__)
    twin.__qualname__ = function.__qualname__
    twin.__module__ = function.__module__ or "__main__"  # exec'd without a __name__
    return JITFunction(twin)


def compilation_error_class() -> type[Exception]:
    """The exception Triton's compiler raises for a kernel it cannot compile; its ``src`` is
    the kernel's source from ``def``, its ``node`` the AST node at fault (lines counted from
    that ``def``), and a nested one (a helper's) is its ``__cause__``."""
    from triton.compiler.errors import CompilationError

    return CompilationError


def compilation_error_parts(error: Any) -> tuple[str | None, int | None, int | None, str]:
    """``(src, line, column, message)`` of a ``CompilationError``: the line counted from the
    kernel's ``def`` line (1), the column from 0, the message without Triton's excerpt."""
    node = error.node
    line = getattr(node, "lineno", None)
    column = getattr(node, "col_offset", None)
    # Triton puts the repr of the exception that stopped it in the message: name it instead
    cause = error.__cause__ or (error.__context__ if error.__suppress_context__ else None)
    if cause is not None and not isinstance(cause, compilation_error_class()):
        return error.src, line, column, f"{type(cause).__name__}: {cause}"
    return error.src, line, column, str(error.error_message or "")


def interpreter_error_class() -> type[Exception]:
    """The exception Triton's interpreter wraps a kernel's exception in (``__cause__``)."""
    from triton.runtime.interpreter import InterpreterError

    return InterpreterError


@contextlib.contextmanager
def interpreter_memory_hooks(
    on_arguments: Callable[[tuple, dict[str, Any]], None],
    on_access: Callable[[str, Any, Any, int, tuple[int, int, int]], None],
) -> Iterator[None]:
    """While inside, each interpreted launch reports its host arguments (the tensors whose
    memory the kernel may touch) to ``on_arguments(args, kwargs)``, and every load, store and
    atomic reports, before it touches memory, ``on_access(kind, addresses, mask, item_size,
    program)``: numpy arrays of byte addresses and of lanes that access (``None``: all), the
    element size in bytes, and the ``(x, y, z)`` program id."""
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    executor = interpreter.GridExecutor
    originals = {
        (executor, "_init_args_hst"): executor._init_args_hst,
        **{
            (builder, name): getattr(builder, name)
            for name in (
                "create_masked_load",
                "create_masked_store",
                "create_atomic_rmw",
                "create_atomic_cas",
            )
        },
    }

    def arguments(self: Any, args_dev: Any, kwargs: Any) -> Any:
        host = originals[(executor, "_init_args_hst")](self, args_dev, kwargs)
        on_arguments(*host)
        return host

    def access(name: str, kind: str, pointers: int, mask: int | None) -> Callable[..., Any]:
        def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
            handle = args[pointers]
            lanes = args[mask].data if mask is not None else None
            size = handle.get_element_ty().primitive_bitwidth // 8
            on_access(kind, handle.data, lanes, size, tuple(self.grid_idx))
            return originals[(builder, name)](self, *args, **kwargs)

        return checked

    patches = {
        (executor, "_init_args_hst"): arguments,
        (builder, "create_masked_load"): access("create_masked_load", "load", 0, 1),
        (builder, "create_masked_store"): access("create_masked_store", "store", 0, 2),
        (builder, "create_atomic_rmw"): access("create_atomic_rmw", "atomic", 1, 3),
        (builder, "create_atomic_cas"): access("create_atomic_cas", "atomic", 0, None),
    }
    for (owner, name), patch in patches.items():
        setattr(owner, name, patch)
    try:
        yield
    finally:
        for (owner, name), original in originals.items():
            setattr(owner, name, original)


@contextlib.contextmanager
def device_functions_interpreted() -> Iterator[None]:
    """While inside, the ``@triton.jit`` functions an interpreted kernel calls run in the
    interpreter with Triton's language patched for the call only.

    Compiled ones too: Triton's own library (``tl.max``, ``tl.sum``, ...) is made of compiled
    JIT functions when ``TRITON_INTERPRET`` was unset as triton was imported, and those refuse
    to be called outside a compiled kernel. And the interpreter's own device-function call
    leaves ``triton.language`` patched for the interpreter after it returns, which breaks the
    next compile (the front-end check) in the process.
    """
    from triton.runtime import interpreter
    from triton.runtime.jit import JITFunction

    interpreted = _interpreted_class()
    originals = {JITFunction: JITFunction.__call__, interpreted: interpreted.__call__}

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        function = self
        if not isinstance(self, interpreted):
            function = self.__dict__.get("_opmagic_interpreted")
            if function is None:
                function = self.__dict__["_opmagic_interpreted"] = interpreted(self.fn)
        scope = interpreter._patch_lang(function.fn)
        try:
            return function.rewrite()(*args, **kwargs)
        finally:
            scope.restore()

    for owner in originals:
        owner.__call__ = call
    try:
        yield
    finally:
        for owner, original in originals.items():
            owner.__call__ = original


def holds_no_data(tensor: Any) -> bool:
    """Whether a tensor has no data a kernel could compute on: a meta tensor, a FakeTensor, or
    a wrapper (FunctionalTensor, ...) of fakes."""
    from torch._subclasses.fake_tensor import is_fake

    return bool(tensor.is_meta or is_fake(tensor))


def opaque_under_functionalization(opdef: Any) -> None:
    """Keep a ``triton_op`` whole under functionalization (AOTAutograd, ``torch.compile``):
    its rule for FunctionalTensorMode runs the launcher, whose kernel launches only torch's
    ``wrap_triton`` makes traceable, which it does not do for interpreted kernels."""
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    def opaque(mode: Any, op: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return mode.__torch_dispatch__(op, types, args, kwargs)

    opdef.register_torch_dispatch(FunctionalTensorMode, opaque)


def sync_op_kernels(qualname: str, launcher: Callable[..., Any] | None) -> None:
    """torch's registry of the Triton kernels of ``triton_op`` operators (what AOTAutograd's
    cache key reads) made to match the operator registered now: the kernels ``launcher``
    launches, or no entry when there is no launcher (the op is gone or not a triton_op)."""
    import sys

    module = sys.modules.get("torch._library.triton")
    if module is None:  # no triton_op was ever made in this process
        return
    if launcher is None:
        module.triton_ops_to_kernels.pop(qualname, None)
    else:
        module.triton_ops_to_kernels[qualname] = module.get_inner_triton_kernels(launcher)


def launched_kernels(launcher: Callable[..., Any]) -> list[Any]:
    """The Triton kernels a ``triton_op``'s launcher launches: what torch's own scan finds
    (``triton_op`` records it for compiled kernels: through ``wrap_triton``, local names and
    helper functions) or, as that scan does not recognise interpreted kernels, the kernels
    among the globals the launcher's code reads."""
    from torch._library.triton import get_inner_triton_kernels

    found = get_inner_triton_kernels(launcher)
    if found:
        return found
    try:
        from triton.runtime import KernelInterface
    except ImportError:  # no Triton: the launcher launches nothing that could run
        return []
    referenced = inspect.getclosurevars(launcher)
    values = {**referenced.globals, **referenced.nonlocals}
    return [value for value in values.values() if isinstance(value, KernelInterface)]


def triton_op_launcher(registered: Any) -> Callable[..., Any] | None:
    """The user's launcher behind a kernel ``torch.library.triton_op`` registered (its
    ``backend_fn`` closes over the function it decorated, and ``custom_op`` may wrap that in
    closures over ``fn`` in turn), or ``None`` for a kernel of another kind."""
    while callable(registered):
        code = getattr(registered, "__code__", None)
        if code is None or "fn" not in code.co_freevars:
            return None
        inner = registered.__closure__[code.co_freevars.index("fn")].cell_contents
        if code.co_filename.replace("\\", "/").endswith("torch/_library/triton.py"):
            return inner
        registered = inner
    return None


@functools.cache
def _interpreted_class() -> type:
    """Triton's ``InterpretedFunction`` (imported once)."""
    from triton.runtime.interpreter import InterpretedFunction

    return InterpretedFunction
