"""``cuda_kernel_from_source``: the quick path of ``%%cuda_kernel`` as a function.

The ``extern "C"`` kernels of a source are compiled with NVRTC and bound as launchers
(``vadd[grid, block](a, b, out, n)``). With ``op`` and ``launch`` the cell's kernels become
the CUDA kernel of an operator: ``launch`` is the body of that kernel, in Python, with the
operator's arguments in scope by name, the cell's kernels, ``torch`` and ``cdiv``::

    op="mylib::vadd", schema="(Tensor a, Tensor b) -> Tensor",
    launch="out = torch.empty_like(a); vadd[cdiv(a.numel(), 256), 256](a, b, out, a.numel()); "
           "return out"

The operator is defined from ``schema`` when it does not exist; an existing one (made by
``%%custom_op``, ``%%torch_library`` or ``torch.library``) gets the CUDA kernel added, through
``register_kernel("cuda", ...)`` for a custom op so that its autograd formula and fake impl
keep working. In a session (``%load_ext opmagic``) these registrations belong to the cell.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import linecache
import os
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .._torch import custom_op_state, dispatcher, library_hooks
from ..dispatch import DispatchTable, dispatch_table
from ..dispatch.sites import label_location
from ..display import Displayable
from ..errors import ArgumentTypeError, CellSourceError, ForeignOperatorError
from ..native.cuda.launcher import cdiv
from ..native.cuda.nvrtc import CudaKernels, compile_cuda_kernels
from .custom_op import parse_operator_name
from .session import active_session, registration_site

TORCH_NAMESPACES = ("aten", "prim", "prims", "quantized", "_")


@dataclass(eq=False)
class CudaOp:
    """The operator a quick-path cell made its kernels the CUDA kernel of."""

    qualname: str
    schema: str
    launch: str
    defined: bool  # defined here from the schema (else the kernel was added to an existing op)
    function: Callable  # the Python kernel registered for the CUDA key
    library: Any = None  # the Library holding the registrations (None: via custom_op)
    closed: bool = False
    table: DispatchTable = field(init=False, repr=False)  # as this cell left it

    def __post_init__(self) -> None:
        # read now: the cell's summary shows the op as it made it, whatever comes later
        table = dispatch_table(self.qualname)
        assert isinstance(table, DispatchTable)
        self.table = table

    def close(self) -> None:
        """Remove what this made (outside a session; a session removes it with its cell)."""
        if not self.closed and self.library is not None:
            library_hooks.destroy_library(self.library)
        self.closed = True


@dataclass(eq=False)
class CudaKernelResult(Displayable):
    """What a quick-path ``%%cuda_kernel`` cell made: its kernels and, with ``op``, the op."""

    kernels: CudaKernels
    op: CudaOp | None = None
    bound: tuple[str, ...] = field(default=())  # names bound in the namespace

    @property
    def description(self) -> str:
        """One line for ``%opmagic session``."""
        text = self.kernels.description
        return text + (f"; CUDA kernel of {self.op.qualname}" if self.op else "")

    def close(self) -> None:
        """Retire the launchers and, outside a session, remove the op's registrations."""
        self.kernels.close()
        if self.op is not None and active_session() is None:
            self.op.close()


def cuda_kernel_from_source(
    source: str,
    *,
    op: str | None = None,
    launch: str | Callable | None = None,
    schema: str | None = None,
    arch: str | None = None,
    nvrtc_flags: Sequence[str] | str = (),
    include_dirs: Sequence[str | os.PathLike] = (),
    namespace: dict[str, Any] | None = None,
    filename: str | None = None,
    label: str | None = None,
    first_line: int = 1,
) -> CudaKernelResult:
    """Compile the ``extern "C"`` kernels of ``source`` (NVRTC) and bind a launcher per kernel.

    ``namespace``: where the launchers are bound under the kernels' names. ``op`` (``ns::name``)
    with ``launch`` (the Python body of the op's CUDA kernel, or a function taking the op's
    arguments) makes them the op's CUDA kernel; ``schema`` (``"(Tensor a) -> Tensor"``)
    defines the op if it does not exist. ``arch``, ``nvrtc_flags``, ``include_dirs``: see
    :func:`~opmagic.native.cuda.nvrtc.compile_cuda_kernels`. ``filename`` and ``first_line`` say
    where the source is (IPython's cell file, whose line 1 holds the magic and its launch spec).
    Errors raise :class:`~opmagic.errors.CompileError` or :class:`CellSourceError` at the line.
    """
    if namespace is not None and not isinstance(namespace, dict):
        raise ArgumentTypeError(
            f"cuda_kernel_from_source: namespace must be a dict (where the launchers are bound) "
            f"or None, got {type(namespace).__name__}."
        )
    kernels = compile_cuda_kernels(
        source,
        arch=arch,
        nvrtc_flags=nvrtc_flags,
        include_dirs=include_dirs,
        label=label,
        first_line=first_line,
    )
    result = CudaKernelResult(kernels)
    if op is not None or launch is not None or schema is not None:
        if op is None or launch is None:
            raise CellSourceError(
                f"{kernels.where(None)}: --op NS::NAME and --launch SPEC go together: the launch "
                "spec says how the op's arguments become the kernel's (see %%cuda_kernel?).",
                line=1,
            )
        result.op = register_cuda_op(kernels, op, launch, schema=schema, filename=filename)
    if namespace is not None:
        namespace.update(kernels.kernels)
        result.bound = tuple(kernels.kernels)
    return result


def register_cuda_op(
    kernels: CudaKernels,
    op: str,
    launch: str | Callable,
    *,
    schema: str | None = None,
    filename: str | None = None,
) -> CudaOp:
    """Make ``launch`` (a spec over ``kernels``, or a function) the CUDA kernel of ``op``.

    See the module docstring. ``filename``: the cell's file, whose line 1 holds the spec
    (registrations and tracebacks point there).
    """
    qualname = parse_operator_name(op)
    namespace, name = qualname.split("::", 1)
    place = label_location(filename, 1) if filename else kernels.where(None)
    if namespace in TORCH_NAMESPACES:
        raise ForeignOperatorError(
            f"{place}: {qualname} is torch's own operator; a CUDA kernel for it would replace "
            "torch's for every program in this process. Use a namespace of your own."
        )
    existing = dispatcher.find_schema(qualname, "")
    if existing is None and schema is None:
        raise CellSourceError(
            f"{place}: {qualname} does not exist yet: give its schema, e.g. --schema "
            '"(Tensor a, Tensor b) -> Tensor".',
            filename=filename,
            line=1,
        )
    new_schema = _parsed_schema(qualname, schema, place, filename) if schema else None
    if existing is not None and new_schema is not None and str(new_schema) != str(existing):
        raise CellSourceError(
            f"{place}: {qualname} exists with the schema {existing}; --schema says "
            f"{new_schema}. Drop --schema to add the CUDA kernel to it, or choose another name.",
            filename=filename,
            line=1,
        )
    target = existing if existing is not None else new_schema
    function = (
        launch
        if callable(launch)
        else _launch_function(kernels, qualname, launch, target, place, filename)
    )
    session = active_session()
    opdef = custom_op_state.custom_op_def(qualname)
    # a definition this session made with torch.library (this cell's previous run, say) is
    # made again: the session adopts it unchanged and lets its previous owner go
    define = existing is None or (
        new_schema is not None
        and opdef is None
        and session is not None
        and session.owns_definition(qualname)
    )
    site = registration_site(filename, 1) if filename and session else None
    with site if site is not None else contextlib.nullcontext():
        library = None
        if opdef is not None:
            opdef.register_kernel("cuda", function)
        else:
            library = torch.library.Library(namespace, "FRAGMENT")
            if define:
                library.define(str(target).split("::", 1)[1])
            # a re-run registers before its previous run lets go (a failing run keeps it);
            # torch 2.11 refuses a second Python kernel for the key unless told to override
            library.impl(name, function, "CUDA", allow_override=True)
    return CudaOp(
        qualname,
        str(target),
        launch if isinstance(launch, str) else getattr(launch, "__name__", repr(launch)),
        define,
        function,
        library,
    )


def _parsed_schema(qualname: str, schema: str, place: str, filename: str | None) -> Any:
    """The FunctionSchema of ``--schema`` (with or without the op's name in front)."""
    name = qualname.split("::", 1)[1]
    text = schema.strip()
    text = f"{qualname}{text}" if text.startswith("(") else f"{qualname.split('::')[0]}::{text}"
    try:
        parsed = dispatcher.parse_schema(text)
    except RuntimeError as error:
        raise CellSourceError(
            f"{place}: the schema {schema!r} does not parse: {str(error).splitlines()[0]}",
            filename=filename,
            line=1,
        ) from None
    if parsed.name != qualname or parsed.overload_name:
        raise CellSourceError(
            f"{place}: the schema names {parsed.name}, not {qualname}; write it as "
            f'"(Tensor a) -> Tensor" (the name comes from --op {name}).',
            filename=filename,
            line=1,
        )
    return parsed


def _launch_function(
    kernels: CudaKernels,
    qualname: str,
    spec: str,
    schema: Any,
    place: str,
    filename: str | None,
) -> Callable:
    """The op's CUDA kernel: ``spec`` as the body of a function of the schema's arguments."""
    positional = [a.name for a in schema.arguments if not a.kwarg_only]
    keyword = [a.name for a in schema.arguments if a.kwarg_only]
    signature = ", ".join(positional + (["*", *keyword] if keyword else []))
    function_name = f"{qualname.split('::', 1)[1]}_cuda"
    spec = textwrap.dedent(spec).strip()
    if "\n" in spec:
        code = f"def {function_name}({signature}):\n" + textwrap.indent(spec, "    ")
    else:
        code = f"def {function_name}({signature}): {spec}"  # on the magic's line: cell line 1
    if filename is None:
        filename = f"<cuda_kernel {qualname}>"
        linecache.cache[filename] = (len(code), None, code.splitlines(keepends=True), filename)
    try:
        tree = ast.parse(code, filename)
    except SyntaxError as error:
        raise CellSourceError(
            f"{place}: the launch spec is not Python: {error.msg}\n    {spec}",
            filename=filename,
            line=1,
        ) from None
    scope: dict[str, Any] = {
        "__builtins__": builtins,
        "torch": torch,
        "cdiv": cdiv,
        **kernels.kernels,
    }
    _check_spec(tree, scope, positional + keyword, bool(schema.returns), qualname, place, filename)
    exec(compile(tree, filename, "exec"), scope)
    return scope[function_name]


def _check_spec(
    tree: ast.Module,
    scope: dict[str, Any],
    arguments: list[str],
    returns: bool,
    qualname: str,
    place: str,
    filename: str | None,
) -> None:
    """Names the spec uses must exist, and it must return what the schema returns."""
    function = tree.body[0]
    assert isinstance(function, ast.FunctionDef)
    assigned = set(arguments) | {
        node.id
        for node in ast.walk(function)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)
    }
    known = assigned | set(scope) | set(dir(builtins))
    unknown = sorted(
        {
            node.id
            for node in ast.walk(function)
            if isinstance(node, ast.Name)
            and isinstance(node.ctx, ast.Load)
            and node.id not in known
        }
    )
    if unknown:
        kernels = ", ".join(k for k in scope if k not in ("__builtins__", "torch", "cdiv"))
        raise CellSourceError(
            f"{place}: the launch spec uses {', '.join(unknown)}, which is neither an argument "
            f"of {qualname} ({', '.join(arguments) or 'none'}), a kernel of the cell ({kernels}), "
            "nor torch or cdiv.",
            filename=filename,
            line=1,
        )
    has_return = any(isinstance(n, ast.Return) and n.value is not None for n in ast.walk(function))
    if returns and not has_return:
        raise CellSourceError(
            f"{place}: {qualname} returns a value, but the launch spec has no return: end it "
            "with e.g. '; return out'.",
            filename=filename,
            line=1,
        )


__all__ = ["CudaKernelResult", "CudaOp", "cuda_kernel_from_source", "register_cuda_op"]
