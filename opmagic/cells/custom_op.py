"""``custom_op_from_source``: a custom operator from the Python source of one cell.

The source holds the operator's type-hinted function and, optionally, its companions,
written with decorators that exist while the source runs::

    def numpy_sin(x: torch.Tensor) -> torch.Tensor:      # the operator
        return torch.from_numpy(np.sin(x.numpy()))

    @fake                                                 # register_fake
    def _(x): return torch.empty_like(x)

    @setup_context                                        # register_autograd(backward,
    def _(ctx, inputs, output): ctx.save_for_backward(inputs[0])  # setup_context=...)

    @backward
    def _(ctx, grad): return grad * ctx.saved_tensors[0].cos()

    @kernel("cuda")                                       # register_kernel("cuda")
    def _(x): ...

    @vmap                                                 # register_vmap
    def _(info, in_dims, x): ...

    @torch_dispatch(MyMode)                               # register_torch_dispatch(MyMode)
    def _(mode, func, types, args, kwargs): ...

    autocast("cpu", torch.bfloat16)                       # register_autocast("cpu", ...)

The source runs first (the decorators only collect); the operator is made and its
companions registered once it ran without error, so a cell that fails registers nothing.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import linecache
import os
import re
import traceback
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

import torch

from .._torch import custom_op_state, dispatcher
from ..dispatch import DispatchTable, dispatch_table
from ..dispatch.ops import OpRef, is_identifier, overloads_of
from ..dispatch.sites import label_location
from ..display import Displayable
from ..errors import ArgumentTypeError, CellSourceError, ForeignOperatorError, OperatorNameError
from .history import CellSource
from .session import active_session, foreign_operator_message, registration_site

COMPANIONS = ("fake", "setup_context", "backward", "kernel", "vmap", "autocast", "torch_dispatch")
_UNBOUND = object()
_OPMAGIC = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the package


@dataclass(frozen=True)
class KernelRow:
    """One thing the cell registered for the operator, and where it was written."""

    key: str  # the dispatch key it serves ("CompositeExplicitAutograd", "Meta", "Autograd", ...)
    role: str  # "kernel", "fake impl", "backward", ...
    function: str  # the Python function behind it, or what the rule does
    where: str  # "cell [5], line 3"


@dataclass(eq=False)
class CustomOpResult(Displayable):
    """What ``%%custom_op`` made: the op, its kernels per key, its dispatch table, checks.

    The schema, the table and the kernels are read when the result is made: the summary
    shows the op as this cell made it, even once a later cell redefines it.
    """

    op: Any  # the CustomOpDef, also bound in the namespace under ``function``
    qualname: str
    function: str
    notes: tuple[str, ...] = ()
    checks: Displayable | None = None  # the report of --check, which %%custom_op adds
    table: DispatchTable = field(init=False, repr=False)  # read from the dispatcher
    kernels: tuple[KernelRow, ...] = field(init=False, repr=False)  # what serves each key

    def __post_init__(self) -> None:
        table = dispatch_table(self.op)
        assert isinstance(table, DispatchTable)
        self.table = table
        self.kernels = tuple(custom_op_kernels(self.op, table))

    @property
    def schema(self) -> str:
        """The operator's schema, e.g. ``mylib::numpy_sin(Tensor x) -> Tensor``."""
        return self.table.schema

    @property
    def dotted(self) -> str:
        """``mylib.numpy_sin``, the ``torch.ops`` spelling."""
        return self.qualname.replace("::", ".")


@dataclass
class _Companion:
    """A companion the cell declared, applied to the operator after the cell ran."""

    kind: str
    function: Callable | None
    arguments: tuple
    line: int


@dataclass
class _Collector:
    """The decorators a cell sees while it runs: they record companions and change nothing."""

    filename: str
    companions: list[_Companion] = field(default_factory=list)

    def names(self) -> dict[str, Any]:
        """The names injected into the cell's namespace while it runs."""
        return {name: getattr(self, name) for name in COMPANIONS}

    def fake(self, function: Callable) -> Callable:
        """``@fake``: the FakeTensor/meta implementation (``register_fake``)."""
        return self._record("fake", function)

    def setup_context(self, function: Callable) -> Callable:
        """``@setup_context``: saves what ``@backward`` needs (``register_autograd``)."""
        return self._record("setup_context", function)

    def backward(self, function: Callable) -> Callable:
        """``@backward``: the gradient formula (``register_autograd``)."""
        return self._record("backward", function)

    def vmap(self, function: Callable) -> Callable:
        """``@vmap``: the batching rule ``(info, in_dims, *args)`` (``register_vmap``)."""
        return self._record("vmap", function)

    def kernel(self, device_types: str | Iterable[str]) -> Callable[[Callable], Callable]:
        """``@kernel("cuda")``: a kernel for some device types (``register_kernel``)."""
        self._expect_arguments("kernel", device_types, '@kernel("cuda")')
        return lambda function: self._record("kernel", function, device_types)

    def torch_dispatch(self, cls: type) -> Callable[[Callable], Callable]:
        """``@torch_dispatch(Mode)``: the rule under a mode or tensor subclass."""
        self._expect_arguments("torch_dispatch", cls, "@torch_dispatch(MyMode)")
        if not isinstance(cls, type):
            line = _caller_line(self.filename)
            raise CellSourceError(
                f"{label_location(self.filename, line)}: @torch_dispatch takes a "
                f"TorchDispatchMode subclass or a tensor subclass, got {cls!r:.60}.",
                filename=self.filename,
                line=line,
            )
        return lambda function: self._record("torch_dispatch", function, cls)

    def autocast(self, device_type: str, cast_inputs: torch.dtype) -> None:
        """``autocast("cpu", torch.bfloat16)``: cast floating inputs under autocast."""
        line = _caller_line(self.filename)
        self.companions.append(_Companion("autocast", None, (device_type, cast_inputs), line))

    def _record(self, kind: str, function: Callable, *arguments: Any) -> Callable:
        """Remember a companion and the line it was written at; the function is unchanged."""
        code = getattr(function, "__code__", None)
        line = code.co_firstlineno if code is not None else _caller_line(self.filename)
        self.companions.append(_Companion(kind, function, arguments, line))
        return function

    def _expect_arguments(self, name: str, argument: Any, example: str) -> None:
        """``@kernel``/``@torch_dispatch`` used without their argument: say how to write it."""
        if callable(argument) and not isinstance(argument, (str, type)):
            raise CellSourceError(
                f"{label_location(self.filename, _caller_line(self.filename))}: @{name} takes "
                f"an argument; write {example}.",
                filename=self.filename,
                line=_caller_line(self.filename),
            )


def custom_op_from_source(
    source: str,
    name: str,
    *,
    mutates_args: Iterable[str] | str = (),
    device_types: str | Sequence[str] | None = None,
    schema: str | None = None,
    tags: Iterable[torch.Tag] = (),
    namespace: dict[str, Any] | None = None,
    filename: str | None = None,
) -> CustomOpResult:
    """Make the custom operator ``name`` (``"ns::name"``) from the function in ``source``.

    ``source`` runs in ``namespace`` (a fresh one when ``None``) with the companion
    decorators of this module's docstring; the operator function is the top-level function
    named like the operator, else the only top-level function that is neither a companion
    nor private (``_name``). The other keywords are ``torch.library.custom_op``'s.
    ``filename`` names the source in tracebacks and tables (IPython passes the cell's). The
    operator is bound in ``namespace`` under the function's name. Problems with the source
    raise :class:`CellSourceError` naming the line. To check the op, pass it to
    :func:`opmagic.check_op`.
    """
    _check_arguments(source, name, namespace, filename, schema)
    _check_names("mutates_args", mutates_args, "argument names or 'unknown'")
    if device_types is not None:
        _check_names("device_types", device_types, "device types such as 'cpu' or None")
    tags = tuple(tags) if isinstance(tags, Iterable) and not isinstance(tags, str) else tags
    if not isinstance(tags, tuple) or not all(isinstance(t, torch.Tag) for t in tags):
        raise ArgumentTypeError(
            f"custom_op_from_source: tags must be torch.Tag members, got {tags!r:.60}."
        )
    qualname = parse_operator_name(name)
    if filename is None:
        filename = source_file(f"<custom_op {qualname}>", source)
    namespace = {} if namespace is None else namespace

    def make_op(function: Callable) -> Any:
        """``torch.library.custom_op`` on the cell's function."""
        return torch.library.custom_op(
            qualname,
            mutates_args=mutates_args,
            device_types=device_types,
            schema=schema,
            tags=tuple(tags),
        )(function)

    op, function_name, notes = define_op_from_source(
        source, qualname, filename, namespace, make_op, mutates_args=mutates_args, schema=schema
    )
    options = {
        "mutates_args": mutates_args,
        "device_types": device_types,
        "schema": schema,
        "tags": tuple(tag.name for tag in tags),
    }
    note_op_source("custom_op", source, qualname, function_name, options)
    return CustomOpResult(op, qualname, function_name, notes)


def note_op_source(
    kind: str, source: str, qualname: str, function: str, options: dict[str, Any]
) -> None:
    """Tell the session (if any) that the running cell made ``qualname`` from ``source`` (its
    ``function`` and companions) with ``options``: what the export writes for the cell."""
    session = active_session()
    if session is not None:
        session.note_source(
            CellSource(kind, source, {"name": qualname, "function": function, **options})
        )


def source_file(name: str, source: str) -> str:
    """Put ``source`` in the line cache under ``name`` (tracebacks and messages read it there)
    and return ``name``: the file name of a source that has none of its own."""
    linecache.cache[name] = (len(source), None, source.splitlines(keepends=True), name)
    return name


def define_op_from_source(
    source: str,
    qualname: str,
    filename: str,
    namespace: dict[str, Any],
    make_op: Callable[[Callable], Any],
    *,
    mutates_args: Iterable[str] | str,
    schema: str | None,
    schema_option: bool = True,
    running: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
) -> tuple[Any, str, tuple[str, ...]]:
    """Run a cell's ``source`` and make its function the operator ``qualname``: what every
    cell front end of a Python operator shares (``%%custom_op``, ``%%triton_op``).

    The source runs in ``namespace`` inside ``running()`` with the companion decorators of
    this module's docstring; ``make_op(function)`` makes the operator (at the function's cell
    line, for the session), then the companions are registered (``schema_option``: whether
    the front end takes a schema in place of type hints, which messages then suggest).
    Returns ``(op, the function's name, notes)``, the op bound in ``namespace`` under that
    name; a failure raises :class:`CellSourceError` at its cell line, the name keeping its
    previous value.
    """
    namespace.setdefault("__builtins__", __builtins__)
    _refuse_foreign(qualname)
    tree = _parse(source, filename)
    function_node = operator_function(tree, qualname, filename)
    if schema is None:
        _require_type_hints(function_node, filename)
    code = _compile(tree, source, filename)
    previous = namespace.get(function_node.name, _UNBOUND)
    collector = _Collector(filename)
    try:
        with running():
            _run(code, filename, namespace, collector, qualname)
        function = namespace[function_node.name]
        where = label_location(filename, function_node.lineno)
        if not inspect.isfunction(function):
            raise CellSourceError(
                f"{where}: after the cell ran, {function_node.name} is a "
                f"{type(function).__name__}, not the function defined here: a later line of the "
                "cell binds the name again. Rename that other binding.",
                filename=filename,
                line=function_node.lineno,
            )
        if schema is None:
            _infer_schema(
                function, mutates_args, where, filename, function_node.lineno, schema_option
            )
        else:
            _check_schema_fits(function, schema, qualname, where, filename, function_node.lineno)
        notes = _replacement_notes(qualname)
        line = function.__code__.co_firstlineno
        with registration_site(filename, line), _reported(filename, line):
            op = make_op(function)
        _apply_companions(op, collector.companions, filename)
        session = active_session()
        if session is not None:
            notes += tuple(session.displaced())
    except BaseException:  # the name keeps what it meant before the cell
        if previous is _UNBOUND:
            namespace.pop(function_node.name, None)
        else:
            namespace[function_node.name] = previous
        raise
    namespace[function_node.name] = op
    return op, function_node.name, notes


def _check_arguments(source: Any, name: Any, namespace: Any, filename: Any, schema: Any) -> None:
    """Arguments of :func:`custom_op_from_source` of the wrong type, named."""
    expected = (
        ("source", source, str, "the cell's Python source"),
        ("name", name, str, "'namespace::name'"),
        ("namespace", namespace, (dict, type(None)), "a dict or None"),
        ("filename", filename, (str, type(None)), "a str or None"),
        ("schema", schema, (str, type(None)), "a str such as '(Tensor x) -> Tensor', or None"),
    )
    for what, value, kind, takes in expected:
        if not isinstance(value, kind):
            raise ArgumentTypeError(
                f"custom_op_from_source: {what} must be {takes}, got {type(value).__name__} "
                f"{value!r:.60}."
            )


def _check_names(what: str, value: Any, takes: str) -> None:
    """``value`` is one name (a str) or an iterable of names (a collection's are checked)."""
    collection = isinstance(value, (list, tuple, set, frozenset))
    if isinstance(value, str) or (
        isinstance(value, Iterable)
        and not isinstance(value, (bytes, dict))
        and (not collection or all(isinstance(item, str) for item in value))
    ):
        return
    raise ArgumentTypeError(f"custom_op_from_source: {what} must be {takes}, got {value!r:.60}.")


def parse_operator_name(name: str) -> str:
    """``ns::name`` checked to be a new custom operator's name."""
    namespace, separator, op_name = name.strip().partition("::")
    example = "Write NAMESPACE::NAME with Python identifiers, e.g. mylib::numpy_sin."
    if not separator:
        raise OperatorNameError(f"{name!r} is not an operator name: it has no '::'. {example}")
    for part, what in ((namespace, "namespace"), (op_name, "name")):
        if not is_identifier(part):
            raise OperatorNameError(
                f"{name!r} is not an operator name: the {what} {part!r} is not a Python "
                f"identifier. {example} (custom_op makes the default overload; there is no "
                "'.overload' part.)"
            )
    return f"{namespace}::{op_name}"


def custom_op_kernels(op: Any, table: DispatchTable | None = None) -> list[KernelRow]:
    """What the op's definition and companions registered, per dispatch key, with sources.

    ``table`` is the op's dispatch table when the caller has it already.
    """
    parts = custom_op_state.custom_op_parts(op)
    found = table if table is not None else dispatch_table(op)
    assert isinstance(found, DispatchTable)  # a custom op has one overload
    registered = {r.key: r for r in found.registrations if r.active}
    rows = []
    for device, fn in parts["device_kernels"].items():
        key = dispatcher.dispatch_key_for_device(device) if device else "CompositeExplicitAutograd"
        rows.append(_function_row(key, "kernel", custom_op_state.unwrap_registered_function(fn)))
    if parts["fake"] is not None:
        rows.append(_function_row("Meta", "fake impl", parts["fake"]))
    elif custom_op_state.custom_op_can_fake_trivially(op._opoverload):
        rows.append(KernelRow("Meta", "fake impl", "(generated: returns nothing)", ""))
    else:
        rows.append(KernelRow("Meta", "fake impl", "(none: FakeTensor/meta calls fail)", ""))
    if parts["backward"] is not None:
        rows.append(_function_row("Autograd", "backward", parts["backward"]))
        if parts["setup_context"] is not None:
            rows.append(_function_row("Autograd", "setup_context", parts["setup_context"]))
    else:
        rows.append(KernelRow("Autograd", "backward", "(none: backward raises)", ""))
    if parts["vmap"] is not None:
        rows.append(_function_row("FuncTorchBatched", "vmap rule", parts["vmap"]))
    for device, dtype in parts["autocast"].items():
        key = "Autocast" + dispatcher.dispatch_key_for_device(device)
        site = registered[key].source if key in registered else ""
        rows.append(KernelRow(key, "autocast", f"casts to {dtype}", site))
    for cls, fn in parts["torch_dispatch"].items():
        rows.append(_function_row("Python", f"rule under {cls.__name__}", fn))
    if "BackendSelect" in registered:
        rows.append(KernelRow("BackendSelect", "device router", "(from the device argument)", ""))
    return rows


def _function_row(key: str, role: str, fn: Any) -> KernelRow:
    """A kernel row naming a Python function and the cell line it was written at."""
    code = getattr(fn, "__code__", None)
    name = getattr(fn, "__name__", repr(fn))
    where = label_location(code.co_filename, code.co_firstlineno) if code is not None else ""
    return KernelRow(key, role, name, where)


def _refuse_foreign(qualname: str) -> None:
    """Only operators this session defined (or custom ops, without a session) are redefined."""
    namespace, name = qualname.split("::", 1)
    if not overloads_of(OpRef(namespace, name, None)):
        return
    session = active_session()
    owned = (
        session.owns_definition(qualname)
        if session is not None
        else custom_op_state.custom_op_def(qualname) is not None
    )
    if not owned:
        message = (
            session.redefinition_refused(qualname)
            if session is not None
            else foreign_operator_message(qualname)
        )
        raise ForeignOperatorError(message)


def _parse(source: str, filename: str) -> ast.Module:
    """The cell's syntax tree; a syntax error names its cell line."""
    try:
        return ast.parse(source, filename)
    except (RecursionError, MemoryError) as error:
        raise _too_deep(error, source, filename) from None
    except SyntaxError as error:
        raise _syntax_error(error, filename) from error
    except UnicodeEncodeError as error:  # a lone surrogate, which a notebook's JSON can hold
        line = source.count("\n", 0, error.start) + 1
        raise CellSourceError(
            f"{label_location(filename, line)}: the source is not UTF-8 text: it holds "
            f"{source[error.start]!r}, a lone surrogate no file can hold. Remove it.",
            filename=filename,
            line=line,
        ) from None


def _compile(tree: ast.Module, source: str, filename: str) -> CodeType:
    """The cell's code; what only the compiler finds (``global x`` after ``x`` is bound, an
    expression too deep for it) names its cell line as :func:`_parse` does."""
    try:
        return compile(tree, filename, "exec", dont_inherit=True)
    except (RecursionError, MemoryError) as error:
        raise _too_deep(error, source, filename) from None
    except SyntaxError as error:
        raise _syntax_error(error, filename) from error


def _syntax_error(error: SyntaxError, filename: str) -> CellSourceError:
    """A syntax error, at its cell line."""
    line = error.lineno or 1
    return CellSourceError(
        f"{label_location(filename, line)}: SyntaxError: {error.msg}\n"
        f"    {(error.text or '').strip()}",
        filename=filename,
        line=line,
    )


def operator_function(tree: ast.Module, qualname: str, filename: str) -> ast.FunctionDef:
    """The top-level function of a cell's syntax tree that becomes the operator ``qualname``
    (the export finds it again in the cell's source)."""
    op_name = qualname.split("::", 1)[1]
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    named = [node for node in functions if node.name == op_name]
    if named:
        return named[-1]
    candidates = [
        node
        for node in functions
        if not node.name.startswith("_") and not any(map(is_companion, node.decorator_list))
    ]
    # a decorator makes a function something else (a @triton.jit kernel, a benchmark made by
    # @triton.testing.perf_report): the operator's function is a plain one, where there is one
    plain = [node for node in candidates if not node.decorator_list]
    candidates = plain or candidates
    if len(candidates) == 1:
        return candidates[0]
    where = label_location(filename, 1)
    if not candidates:
        raise CellSourceError(
            f"{where}: the cell defines no function to make {qualname} from. Write the "
            f"operator as a top-level function with type hints, e.g.\n"
            f"    def {op_name}(x: torch.Tensor) -> torch.Tensor:\n        ...",
            filename=filename,
            line=1,
        )
    listed = ", ".join(f"{node.name} (line {node.lineno})" for node in candidates)
    raise CellSourceError(
        f"{where}: the cell defines several functions that could be {qualname}: {listed}. "
        f"Name the operator's function {op_name}, or start helpers' names with an "
        "underscore (_helper).",
        filename=filename,
        line=1,
    )


def is_companion(decorator: ast.expr) -> bool:
    """Whether a decorator is one of the companion decorators (``@fake``, ``@kernel(...)``)."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(target, ast.Name) and target.id in COMPANIONS


def _require_type_hints(node: ast.FunctionDef, filename: str) -> None:
    """Every parameter and the return value need annotations for schema inference."""
    arguments = node.args
    if arguments.vararg or arguments.kwarg:
        raise CellSourceError(
            f"{label_location(filename, node.lineno)}: {node.name}() takes *args or **kwargs; "
            "an operator needs named, type-hinted parameters. List them one by one.",
            filename=filename,
            line=node.lineno,
        )
    params = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    missing = [f"parameter {p.arg}" for p in params if p.annotation is None]
    if node.returns is None:
        missing.append("the return value")
    if missing:
        raise CellSourceError(
            f"{label_location(filename, node.lineno)}: {node.name}() needs type hints to "
            f"become an operator; missing for {', '.join(missing)}. Annotate them (e.g. "
            "x: torch.Tensor, -> torch.Tensor, -> None), or pass --schema.",
            filename=filename,
            line=node.lineno,
        )


def _run(
    code: CodeType,
    filename: str,
    namespace: dict[str, Any],
    collector: _Collector,
    qualname: str,
) -> None:
    """Run the cell with the companion decorators in scope, restoring shadowed names."""
    injected = collector.names()
    shadowed = {name: namespace[name] for name in injected if name in namespace}
    namespace.update(injected)
    try:
        exec(code, namespace)
    except CellSourceError:
        raise
    except (Exception, SystemExit) as error:  # sys.exit() in a cell ends the cell, not the kernel
        raise _cell_error(error, filename, qualname) from error
    finally:
        for name in injected:
            if namespace.get(name) is injected[name]:
                del namespace[name]
        namespace.update(shadowed)


def _too_deep(error: BaseException, source: str, filename: str) -> CellSourceError:
    """The error for a cell Python cannot parse or compile for its size or nesting (pointing
    at its longest line: Python does not say which)."""
    lines = source.splitlines() or [""]
    line = max(range(len(lines)), key=lambda index: len(lines[index])) + 1
    return CellSourceError(
        f"{label_location(filename, line)}: the code is too deeply nested or too long an "
        f"expression for Python to compile ({type(error).__name__}). Split the expression into "
        "steps (intermediate variables, or sum() over a list).",
        filename=filename,
        line=line,
    )


def _check_schema_fits(
    function: Callable, schema: str, qualname: str, where: str, filename: str, line: int
) -> None:
    """``schema``'s arguments against the function's parameters: they must be as many, and
    the keyword-only ones the same (the op passes its arguments to the function so)."""
    try:
        parsed = dispatcher.parse_schema(f"{qualname}{schema.strip()}")
        signature = inspect.signature(function)
    except (RuntimeError, ValueError, TypeError):
        return  # torch.library.custom_op reports a schema that does not parse
    parameters = list(signature.parameters.values())
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters):
        return
    keyword_only = [p.name for p in parameters if p.kind is p.KEYWORD_ONLY]
    schema_keyword_only = [a.name for a in parsed.arguments if a.kwarg_only]
    if len(parameters) == len(parsed.arguments) and keyword_only == schema_keyword_only:
        return
    arguments = ", ".join(f"{a.type} {a.name}" for a in parsed.arguments)
    params = ", ".join(str(p) for p in parameters)
    raise CellSourceError(
        f"{where}: the schema {schema.strip()!r} does not fit {function.__name__}(): it has "
        f"{len(parsed.arguments)} argument(s) ({arguments}), the function "
        f"{len(parameters)} parameter(s) ({params}), keyword-only ones included. Make them "
        "match, or leave out --schema to infer it from the type hints.",
        filename=filename,
        line=line,
    )


def _cell_error(error: BaseException, filename: str, qualname: str) -> CellSourceError:
    """One message for a Python error in the cell, pointing at the cell's line.

    When the error comes from a helper the cell called, the message shows the cell's call
    chain, outermost first, each frame at its cell line (and where outside the cell it
    was raised), so the line that started it is there as well as the line that raised.
    """
    frames = traceback.extract_tb(error.__traceback__)
    own = [f for f in frames if f.filename == filename]
    line = own[-1].lineno if own and own[-1].lineno else 1
    state = (
        f"the previous {qualname} is still registered"
        if custom_op_state.custom_op_def(qualname) is not None
        else f"{qualname} was not registered"
    )
    if len(own) <= 1:
        chain = [f"    {linecache.getline(filename, line).strip()}"]
    else:
        chain = [
            f"    {label_location(filename, f.lineno or 1)}"
            + (f", in {f.name}" if f.name != "<module>" else "")
            + f": {linecache.getline(filename, f.lineno or 1).strip()}"
            for f in own
        ]
    # where outside the cell it was raised: a library's line, never opmagic's own
    outside = [f for f in frames if f.filename != filename and not f.filename.startswith(_OPMAGIC)]
    if frames and frames[-1].filename != filename and own and outside:
        raised = outside[-1]
        chain.append(
            f"    (raised in {raised.name}, {label_location(raised.filename, raised.lineno or 1)})"
        )
    return CellSourceError(
        f"{label_location(filename, line)}: {type(error).__name__}: {error}\n"
        + "\n".join(chain)
        + f"\nFix the cell and run it again; {state}.",
        filename=filename,
        line=line,
    )


def _infer_schema(
    function: Callable,
    mutates_args: Any,
    where: str,
    filename: str,
    line: int,
    schema_option: bool = True,
) -> None:
    """Infer the schema as custom_op will, to report a failure at the function's line
    (``schema_option``: whether the fix may be to give the schema instead)."""
    try:
        torch.library.infer_schema(function, mutates_args=mutates_args)
    except ValueError as error:
        reason = str(error).removeprefix("infer_schema(func): ")
        reason = re.sub(r" The valid types are: .*?\. Got func", " Got func", reason, flags=re.S)
        fix = (
            "Correct --mutates-args or the function's parameters."
            if "mutates_args" in reason
            else "Use the types torch.library supports (Tensor, int, float, bool, str, "
            "torch.device, torch.dtype, and Optional/Sequence of them)"
            + (" or pass --schema '(Tensor x) -> Tensor'." if schema_option else ".")
        )
        raise CellSourceError(
            f"{where}: cannot infer a schema for {function.__name__}(): {reason}. {fix}",
            filename=filename,
            line=line,
        ) from error


def _replacement_notes(qualname: str) -> tuple[str, ...]:
    """What re-defining the operator replaces, when it was defined before: the cell whose
    definition it is, as the session names it, else where its function was written."""
    opdef = custom_op_state.custom_op_def(qualname)
    if opdef is None:
        return ()
    session = active_session()
    where = session.definition_site(qualname) if session is not None else None
    code = getattr(custom_op_state.custom_op_function(opdef), "__code__", None)
    if where is None and code is not None:
        where = label_location(code.co_filename, code.co_firstlineno)
    return (f"replaces the previous {qualname}" + (f" from {where}" if where else ""),)


def _apply_companions(op: Any, companions: list[_Companion], filename: str) -> None:
    """Register the collected companions on the new operator, each at its own line."""
    autograd = {c.kind: c for c in companions if c.kind in ("backward", "setup_context")}
    if "setup_context" in autograd and "backward" not in autograd:
        line = autograd["setup_context"].line
        raise CellSourceError(
            f"{label_location(filename, line)}: @setup_context needs a @backward in the same "
            "cell (register_autograd takes both).",
            filename=filename,
            line=line,
        )
    for companion in companions:
        if companion.kind == "setup_context":
            continue
        with registration_site(filename, companion.line), _reported(filename, companion.line):
            _register(op, companion, autograd.get("setup_context"))


def _register(op: Any, companion: _Companion, setup_context: _Companion | None) -> None:
    """Register one companion with the torch.library method it stands for."""
    fn, arguments = companion.function, companion.arguments
    if companion.kind == "fake":
        op.register_fake(fn)
    elif companion.kind == "backward":
        op.register_autograd(fn, setup_context=setup_context.function if setup_context else None)
    elif companion.kind == "kernel":
        op.register_kernel(arguments[0], fn)
    elif companion.kind == "vmap":
        op.register_vmap(fn)
    elif companion.kind == "torch_dispatch":
        op.register_torch_dispatch(arguments[0], fn)
    else:
        op.register_autocast(*arguments)


@contextlib.contextmanager
def _reported(filename: str, line: int) -> Iterator[None]:
    """Turn an error torch raises while registering into a CellSourceError at ``line``."""
    try:
        yield
    except CellSourceError:
        raise
    except Exception as error:
        raise CellSourceError(
            f"{label_location(filename, line)}: {type(error).__name__}: {error}",
            filename=filename,
            line=line,
        ) from error


def _caller_line(filename: str) -> int:
    """The line of the innermost frame running the cell's code."""
    for frame in reversed(traceback.extract_stack()):
        if frame.filename == filename and frame.lineno:
            return frame.lineno
    return 1


__all__ = [
    "COMPANIONS",
    "CustomOpResult",
    "KernelRow",
    "custom_op_from_source",
    "custom_op_kernels",
    "define_op_from_source",
    "is_companion",
    "note_op_source",
    "operator_function",
    "parse_operator_name",
    "source_file",
]
