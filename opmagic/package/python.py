"""``NAME/ops.py``: the Python of the exported cells, in cell order, as plain torch.library code.

Each exported cell contributes its top-level statements that define operators:

- imports, functions and classes, and every statement that registered something when the cell
  ran (the session recorded their lines: ``Library(...)``, ``lib.define``, ``register_fake``,
  a call of a function that registers);
- the assignments and imports those need, wherever in the session they were made (a
  ``import numpy as np`` in an earlier cell, a constant a kernel reads), found by the names
  the kept code reads (:mod:`symtable`);
- not: expressions that registered nothing (a call to try the op, ``print``), statements that
  need IPython (``%timeit`` lines become ``get_ipython()`` calls) or opmagic.

A ``%%custom_op`` (or ``%%triton_op``) cell becomes what opmagic made of it: the operator's
function decorated with ``torch.library.custom_op(...)`` as the cell's options said, its
companions (``@fake``, ``@backward``, ...) plain functions registered with the op's
``register_*`` methods after the cell's code, as they were after the cell ran.
"""

from __future__ import annotations

import ast
import builtins
import json
import re
import symtable
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..cells.custom_op import COMPANIONS, is_companion, operator_function
from ..cells.history import CellEntry, CellSource
from ..errors import CellSourceError, ExportError

PYTHON_KINDS = ("python", "custom_op", "triton_op")
_BUILTINS = frozenset(dir(builtins)) | {"__name__", "__file__", "__doc__", "__builtins__"}
_IPYTHON_NAMES = frozenset({"get_ipython", "display", "In", "Out", "exit", "quit"})
_REGISTER_METHOD = {
    "fake": "register_fake",
    "kernel": "register_kernel",
    "vmap": "register_vmap",
    "torch_dispatch": "register_torch_dispatch",
}
_MAKERS = {"custom_op": "torch.library.custom_op", "triton_op": "torch.library.triton_op"}


@dataclass(eq=False)
class _Statement:
    """One top-level statement of a cell, with what it binds and reads."""

    cell: CellEntry
    position: tuple[int, int]  # (cell order, line): where it ran in the session
    text: str
    bound: frozenset[str]
    free: frozenset[str]
    required: bool  # kept whatever it binds: it defines or registers
    registering: bool  # it registered something when the cell ran
    needs_ipython: bool
    needs_opmagic: bool
    line: int  # its first line in the cell's text (comments above it included)
    end: int  # its last line there
    definition: bool  # a function or class
    part: list[str] = field(repr=False, compare=False)  # the lines of the cell's text


@dataclass(frozen=True)
class PythonModule:
    """``ops.py``'s text, the top-level modules it imports, and what a reader should know."""

    text: str
    imports: frozenset[str]
    cells: tuple[str, ...]  # labels of the cells it has code of, in order
    notes: tuple[str, ...] = field(default=())


def python_module(
    package: str, exported: Iterable[CellEntry], history: Iterable[CellEntry]
) -> PythonModule | None:
    """``ops.py`` for the Python parts of ``exported``, with what they need from any cell of
    ``history`` that ran; ``None`` when no exported cell has Python."""
    exported = [e for e in exported if any(s.kind in PYTHON_KINDS for s in e.sources)]
    if not exported:
        return None
    statements: list[_Statement] = []
    for entry in exported:
        for source in entry.sources:
            if source.kind in PYTHON_KINDS:
                statements += _statements(entry, source, exported=True)
    exported_keys = {e.key for e in exported}
    donors = [
        statement
        for entry in history
        if entry.key not in exported_keys and entry.state in ("in effect", "nothing in effect")
        for source in entry.sources
        if source.kind == "python"
        for statement in _statements(entry, source, exported=False)
    ]
    kept, notes = _closure(statements, donors)
    kept.sort(key=lambda s: s.position)
    return PythonModule(_module_text(package, kept), _imported_modules(kept), _cells(kept), notes)


def _statements(entry: CellEntry, source: CellSource, exported: bool) -> list[_Statement]:
    """The top-level statements of one cell part (a ``%%custom_op`` cell as exported)."""
    text, required_lines = source.text, set(entry.statement_lines)
    if source.kind in _MAKERS:
        text, required_lines = operator_cell(source, entry.label)
    try:
        tree = ast.parse(text)
    except SyntaxError:  # it ran, so only an IPython-only cell gets here (its code is gone)
        return []
    lines = text.splitlines()
    result = []
    for node in tree.body:
        start = _first_line(node)
        start = _with_comments_above(lines, start)
        end = node.end_lineno or node.lineno
        segment = "\n".join(lines[start - 1 : end])
        bound, free = _names(segment)
        registering = any(start <= line <= end for line in required_lines)
        definition = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        defining = definition or isinstance(node, (ast.Import, ast.ImportFrom))
        result.append(
            _Statement(
                cell=entry,
                position=(entry.order, start),
                text=segment,
                bound=frozenset(bound),
                free=frozenset(free),
                required=exported and (registering or defining),
                registering=exported and registering,
                needs_ipython=bool(free & _IPYTHON_NAMES),
                needs_opmagic=_uses_opmagic(node),
                line=start,
                end=end,
                definition=definition,
                part=lines,
            )
        )
    return result


def _first_line(node: ast.stmt) -> int:
    """A statement's first line, decorators included."""
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno, *(d.lineno for d in decorators)])


def _with_comments_above(lines: list[str], start: int) -> int:
    """``start`` moved up over the comment lines right above it (they belong to it)."""
    while start > 1 and lines[start - 2].lstrip().startswith("#"):
        start -= 1
    return start


def _uses_opmagic(node: ast.stmt) -> bool:
    """Whether a statement imports opmagic or reads the name ``opmagic``."""
    for child in ast.walk(node):
        if isinstance(child, ast.Import) and any(
            alias.name.split(".")[0] == "opmagic" for alias in child.names
        ):
            return True
        if isinstance(child, ast.ImportFrom) and (child.module or "").split(".")[0] == "opmagic":
            return True
        if isinstance(child, ast.Name) and child.id == "opmagic":
            return True
    return False


def _names(segment: str) -> tuple[set[str], set[str]]:
    """``(bound, free)``: the module-level names a statement binds, and the global names it
    (or a function it defines, when called) reads."""
    try:
        table = symtable.symtable(segment, "<statement>", "exec")
    except SyntaxError:
        return set(), set()
    bound: set[str] = set()
    free: set[str] = set()
    for symbol in table.get_symbols():
        name = symbol.get_name()
        if symbol.is_assigned() or symbol.is_imported() or symbol.is_namespace():
            bound.add(name)
        if symbol.is_referenced():
            free.add(name)
    stack = list(table.get_children())
    while stack:
        child = stack.pop()
        stack += child.get_children()
        for symbol in child.get_symbols():
            if symbol.is_global() and (symbol.is_referenced() or symbol.is_assigned()):
                free.add(symbol.get_name())
    free = {name for name in free if name not in bound or _reads_before_binding(name, segment)}
    return bound, free - _BUILTINS


def _reads_before_binding(name: str, segment: str) -> bool:
    """Whether a module-level statement that binds ``name`` also reads an earlier binding of
    it (``x = x + 1``, ``x += 1``)."""
    tree = ast.parse(segment)
    for node in ast.walk(tree):
        target = node.target if isinstance(node, ast.AugAssign) else None
        if isinstance(target, ast.Name) and target.id == name:
            return True
        if isinstance(node, ast.Assign):
            targets = {t.id for t in node.targets if isinstance(t, ast.Name)}
            reads = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
            if name in targets and name in reads:
                return True
    return False


def _closure(
    statements: list[_Statement], donors: list[_Statement]
) -> tuple[list[_Statement], tuple[str, ...]]:
    """The required statements, and what binds the names they read (from the same cells or
    any other that ran), until every name read is bound; names no statement binds are noted.
    """
    for statement in statements:
        if statement.registering and statement.needs_opmagic:
            raise ExportError(
                f"cell {statement.cell.label}, line {statement.line} registers through opmagic "
                f"({_first_words(statement.text)}): the package cannot import "
                "opmagic. Write it with torch.library (or a %%custom_op cell), then export."
            )
    usable = [s for s in [*statements, *donors] if not (s.needs_ipython or s.needs_opmagic)]
    kept = [s for s in statements if s.required and s in usable]
    dropped = [
        f"cell {s.cell.label}, line {s.line} needs "
        f"{'IPython' if s.needs_ipython else 'opmagic'} ({_first_words(s.text)}): left out of "
        "ops.py"
        for s in statements
        if s.required and s not in usable and not _imports_only_opmagic(s)
    ]
    chosen = {id(s) for s in kept}
    unresolved: dict[str, str] = {}
    pending = list(kept)
    while pending:
        statement = pending.pop()
        for name in sorted(statement.free):
            if _is_bound_for(name, statement, kept):
                continue
            binder = _binder(name, statement, usable)
            if binder is None:
                unresolved.setdefault(name, statement.cell.label)
            elif id(binder) not in chosen:
                chosen.add(id(binder))
                kept.append(binder)
                pending.append(binder)
    notes = tuple(dropped) + tuple(
        f"ops.py reads {name} (cell {label}), which no exported code defines: "
        + (
            "it is IPython's, not available in a package"
            if name in _IPYTHON_NAMES
            else "define or import it in a cell, then export again"
        )
        for name, label in sorted(unresolved.items())
    )
    return kept, notes


def _imports_only_opmagic(statement: _Statement) -> bool:
    """``import opmagic`` (or ``from opmagic import ...``): nothing to say of leaving it out."""
    return statement.needs_opmagic and statement.text.lstrip().startswith(
        ("import opmagic", "from opmagic")
    )


def _first_words(text: str) -> str:
    """The first code line of a statement, shortened."""
    code = [line.strip() for line in text.splitlines() if not line.lstrip().startswith("#")]
    first = code[0] if code else ""
    return first if len(first) <= 60 else first[:57] + "..."


def _is_bound_for(name: str, user: _Statement, kept: list[_Statement]) -> bool:
    """Whether ops.py's own ``import torch`` or a kept statement binds ``name`` (before
    ``user``, or anywhere for names read inside functions: they are looked up when called)."""
    return name == "torch" or any(name in s.bound and s is not user for s in kept)


def _binder(name: str, user: _Statement, usable: list[_Statement]) -> _Statement | None:
    """The statement whose binding of ``name`` ``user`` saw: the last one before it in the
    session, else the first one after it."""
    binders = sorted(
        (s for s in usable if name in s.bound and s is not user), key=lambda s: s.position
    )
    before = [s for s in binders if s.position < user.position]
    if before:
        return before[-1]
    return binders[0] if binders else None


def _cells(kept: list[_Statement]) -> tuple[str, ...]:
    """Labels of the cells the statements come from, in order, once each."""
    return tuple(dict.fromkeys(s.cell.label for s in kept))


def _imported_modules(kept: list[_Statement]) -> frozenset[str]:
    """Top-level modules the kept statements import (the package's other dependencies)."""
    modules = set()
    for statement in kept:
        for node in ast.walk(ast.parse(statement.text)):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    return frozenset(modules)


def _module_text(package: str, kept: list[_Statement]) -> str:
    """ops.py: a docstring, ``import torch``, then the statements grouped by cell."""
    cells = ", ".join(_cells(kept))
    text = (
        f'"""The Python operators of {package}, exported by opmagic from a notebook session '
        f"(cells {cells}).\n\n"
        f"Importing {package} loads its compiled libraries first (if any), then this module.\n"
        '"""\n\nimport torch  # noqa: F401\n'
    )
    previous = None
    for statement in kept:
        if previous is None or statement.cell is not previous.cell:
            text += f"\n\n# ---- cell {statement.cell.label}{_cell_title(statement.cell)}\n"
        else:
            text += "\n" * _blank_lines(previous, statement)
        text += statement.text.strip("\n") + "\n"
        previous = statement
    return text


def _blank_lines(previous: _Statement, statement: _Statement) -> int:
    """Blank lines between two statements of a cell: as many as the cell had between them
    (at most two), else two around a function or class and one otherwise."""
    between = statement.part[previous.end : statement.line - 1]
    if statement.part is previous.part and not any(line.strip() for line in between):
        return min(len(between), 2)
    return 2 if previous.definition or statement.definition else 1


def _cell_title(entry: CellEntry) -> str:
    """``: %%custom_op mylib::f`` for a cell that made an operator."""
    made = [s for s in entry.sources if s.kind in _MAKERS]
    return "".join(f": %%{s.kind} {s.options.get('name')}" for s in made)


# ---------------------------------------------------------------- %%custom_op cells


def operator_cell(source: CellSource, label: str) -> tuple[str, set[int]]:
    """A ``%%custom_op``/``%%triton_op`` cell as plain torch.library code, and the lines of
    the statements that define and register the op (kept whatever else is dropped).

    The op's function gets ``@torch.library.custom_op(...)`` (or ``triton_op``); each
    companion loses its decorator (and, when named ``_`` or named twice, gets a name of its
    own); ``autocast(...)`` lines go; the ``register_*`` calls follow the cell's code.
    """
    qualname = source.options["name"]
    where = f"cell {label}"
    try:
        tree = ast.parse(source.text)
        function = operator_function(tree, qualname, where)
    except (SyntaxError, CellSourceError) as error:  # it ran: only a changed source gets here
        raise ExportError(f"{where}: cannot read the cell's operator again: {error}") from None
    lines = source.text.splitlines()
    counts: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            counts[node.name] = counts.get(node.name, 0) + 1
    registrations: list[str] = []
    autograd: dict[str, str] = {}
    removed: set[int] = set()
    handled: set[int] = set()  # ids of companion nodes handled here
    op = function.name
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
            companion := _companion_of(node, where)
        ) is not None:
            kind, arguments, decorator = companion
            handled |= {id(decorator), id(getattr(decorator, "func", decorator))}
            removed |= set(range(decorator.lineno, (decorator.end_lineno or decorator.lineno) + 1))
            name = node.name
            if name == "_" or counts.get(name, 0) > 1 or name in COMPANIONS:
                name = _fresh_name(f"_{op}_{kind}", counts)
                lines[node.lineno - 1] = re.sub(
                    rf"\bdef\s+{re.escape(node.name)}\b",
                    f"def {name}",
                    lines[node.lineno - 1],
                    count=1,
                )
            if kind in ("setup_context", "backward"):
                autograd[kind] = name
            else:
                method = _REGISTER_METHOD[kind]
                registrations.append(f"{op}.{method}({''.join(a + ', ' for a in arguments)}{name})")
        elif (call := _autocast_call(node)) is not None:
            handled |= {id(call), id(call.func)}
            removed |= set(range(node.lineno, (node.end_lineno or node.lineno) + 1))
            cast = ", ".join(ast.get_source_segment(source.text, a) or "" for a in call.args)
            registrations.append(f"{op}.register_autocast({cast})")
    _refuse_other_companion_uses(tree, handled, where)
    if "setup_context" in autograd and "backward" not in autograd:
        raise ExportError(f"{where}: @setup_context without @backward (the cell could not run).")
    if "backward" in autograd:
        setup = autograd.get("setup_context")
        registrations.append(
            f"{op}.register_autograd({autograd['backward']}"
            + (f", setup_context={setup})" if setup else ")")
        )
    first = _first_line(function)
    maker = f"@{_MAKERS[source.kind]}({_maker_arguments(source)})"
    body = [line for number, line in enumerate(lines, 1) if number not in removed]
    insert_at = first - 1 - sum(1 for n in removed if n < first)
    body.insert(insert_at, maker)
    required = set(range(insert_at + 1, insert_at + 3))
    if registrations:
        body.append("")
        body.append(f"# what %%{source.kind} registered once the cell ran:")
        start = len(body) + 1
        body += registrations
        required |= set(range(start, len(body) + 1))
    return "\n".join(body) + "\n", required


def _companion_of(
    node: ast.FunctionDef | ast.AsyncFunctionDef, where: str
) -> tuple[str, list[str], ast.expr] | None:
    """``(kind, argument sources, decorator)`` of a top-level function's companion decorator."""
    found = [d for d in node.decorator_list if is_companion(d)]
    if not found:
        return None
    if len(found) > 1:
        raise ExportError(
            f"{where}, line {node.lineno}: {node.name} has two companion decorators; give each "
            "its own function."
        )
    decorator = found[0]
    if isinstance(decorator, ast.Call):
        kind = decorator.func.id  # type: ignore[attr-defined]
        arguments = [ast.unparse(a) for a in decorator.args]
        arguments += [f"{k.arg}={ast.unparse(k.value)}" for k in decorator.keywords]
        return kind, arguments, decorator
    return decorator.id, [], decorator  # type: ignore[attr-defined]


def _autocast_call(node: ast.stmt) -> ast.Call | None:
    """The call of a top-level ``autocast("cpu", torch.bfloat16)`` line, else None."""
    if (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == "autocast"
    ):
        return node.value
    return None


def _refuse_other_companion_uses(tree: ast.Module, handled: set[int], where: str) -> None:
    """Companions written anywhere but as a top-level decorator (or ``autocast`` line) are
    not exported: say where. (Inside a function the names are the user's own again: the
    companions exist only while the cell runs.)"""
    for node in _module_level_nodes(tree):
        if (
            isinstance(node, ast.Name)
            and node.id in COMPANIONS
            and isinstance(node.ctx, ast.Load)
            and id(node) not in handled
        ):
            raise ExportError(
                f"{where}, line {node.lineno}: {node.id} is used inside a block; the export "
                "writes companions (@fake, @backward, ..., autocast(...)) written at the top "
                "level of the cell only. Move it to the top level and run the cell again."
            )


def _module_level_nodes(tree: ast.AST) -> Iterable[ast.AST]:
    """Every node that runs when the cell runs: function and lambda bodies left out (their
    decorators, defaults and annotations kept)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            kw_defaults = [d for d in node.args.kw_defaults if d is not None]  # None: no default
            stack += [*node.decorator_list, *node.args.defaults, *kw_defaults]
        elif isinstance(node, ast.Lambda):
            stack += [*node.args.defaults]
        else:
            stack += list(ast.iter_child_nodes(node))


def _fresh_name(base: str, taken: dict[str, int]) -> str:
    """``base``, or ``base_2``, ... : a name the cell does not use yet (then taken)."""
    name, number = base, 1
    while name in taken:
        number += 1
        name = f"{base}_{number}"
    taken[name] = 1
    return name


def _maker_arguments(source: CellSource) -> str:
    """``"ns::name", mutates_args=(...)``, and the other options the cell gave."""
    options = source.options
    parts = [_literal(options["name"]), f"mutates_args={_literal(options.get('mutates_args'))}"]
    if source.kind == "custom_op":
        if options.get("device_types") is not None:
            parts.append(f"device_types={_literal(options['device_types'])}")
        if options.get("schema"):
            parts.append(f"schema={_literal(options['schema'])}")
        tags = options.get("tags") or ()
        if tags:
            parts.append("tags=(" + "".join(f"torch.Tag.{t}, " for t in tags).rstrip(" ") + ")")
    return ", ".join(parts)


def _literal(value: str | Iterable[str] | None) -> str:
    """A string (double-quoted) or a collection of strings (a tuple) as Python source."""
    if isinstance(value, str):
        return json.dumps(value)
    items = [json.dumps(item) for item in value or ()]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def standard_library(module: str) -> bool:
    """Whether a top-level module comes with Python."""
    return module in sys.stdlib_module_names
