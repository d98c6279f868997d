"""``opmagic.export``: the running session's operators as an installable package.

What goes in (:mod:`.selection`), the C++/CUDA files and their extensions (:mod:`.native`),
``ops.py`` (:mod:`.python`), the tests (:mod:`.tests`), the build files (:mod:`.layout`); the
result, :class:`Export`, says what was written and what was left out, and
:meth:`Export.verify` proves the package by installing it (:mod:`.verify`).
"""

from __future__ import annotations

import functools
import keyword
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .._torch import dispatcher
from ..cells.history import CellEntry
from ..cells.session import active_session
from ..dispatch import DispatchTable, dispatch_table
from ..display import Displayable
from ..errors import ArgumentTypeError, ExportError, is_list_of_values
from .layout import (
    MANIFEST,
    abi_of,
    dependencies,
    init_py,
    is_export,
    manifest,
    pyproject,
    readme,
    setup_py,
    write_package,
)
from .native import NativeSource, native_sources
from .python import PYTHON_KINDS, PythonModule, python_module
from .result import Verification
from .selection import LeftOut, select
from .tests import SAMPLES_FILE, TEST_FILE, Operator, generated_tests
from .verify import ProgressCallback, verify_package

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_VERSION = re.compile(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?")
# what the package's tests and its verification import besides torch and its requirements
_TOOLS = ("opmagic", "pytest", "_pytest", "pluggy", "pip", "setuptools", "wheel", "packaging")
_ABI_WORDS = {
    "stable": "stable ABI: an abi3 wheel for this torch and later ones",
    "classic": "classic C++ ABI: a wheel for this torch version",
    "python": "pure Python",
}
_KIND_WORDS = {
    "python": "Python",
    "custom_op": "%%custom_op",
    "triton_op": "%%triton_op",
    "torch_library": "%%torch_library",
    "cuda_kernel": "%%cuda_kernel",
}


@dataclass(frozen=True)
class ExportedCell:
    """A cell the package holds: what it was, where it went, what to know about it."""

    label: str
    kind: str  # "%%custom_op mylib::f", "%%torch_library", "Python", ...
    files: tuple[str, ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Export(Displayable):
    """A package written by :func:`export`: a snapshot of what it holds and where.

    ``operators``: each with its schema, cell and file; ``cells``: the exported cells;
    ``left_out``: the others with the reason; ``tests``: ``(kind, cases)`` of the generated
    tests; ``notes``: what to know (names ops.py reads that no cell defines, checks that made
    no test). :meth:`verify` builds, installs and tests it.
    """

    directory: Path
    name: str
    version: str
    abi: str  # "stable", "classic" or "python"
    operators: tuple[Operator, ...]
    cells: tuple[ExportedCell, ...]
    left_out: tuple[LeftOut, ...]
    files: tuple[str, ...]
    tests: tuple[tuple[str, int], ...]
    notes: tuple[str, ...]

    @property
    def abi_description(self) -> str:
        """What the wheel will be, in words."""
        return _ABI_WORDS[self.abi]

    def verify(self, progress: ProgressCallback | None = None) -> Verification:
        """Build the wheel, install it in a fresh environment where opmagic is not importable,
        run the generated tests there, and (stable ABI) audit the libraries' symbols; the
        wheel is kept in ``DIRECTORY/dist``. ``progress`` is told each step as it starts."""
        return verify_package(self.directory, progress)


def export(
    directory: str | os.PathLike,
    name: str,
    *,
    version: str = "0.1.0",
    cells: Iterable[int] | None = None,
    overwrite: bool = False,
) -> Export:
    """Write the running session's operators to ``directory`` as the package ``name``.

    Every cell whose operators are in effect goes in, in cell order: C++/CUDA cells as
    ``NAME/csrc/`` files built by ``setup.py`` (stable-ABI ones as an abi3 wheel), Python cells
    (``%%custom_op``, plain ``torch.library``) as ``NAME/ops.py``; the checks run in the
    session become ``tests/``. ``cells``: only these cells (by In [n] number). ``overwrite``
    replaces an earlier export in ``directory`` (never another directory). It builds with
    ``pip wheel --no-build-isolation .`` and works without opmagic; :meth:`Export.verify`
    proves it. Raises :class:`~opmagic.errors.ExportError` and writes nothing for a
    directory it may not write, a bad name or version, nothing to export, or clashing cells.
    """
    directory, cells = _checked_arguments(directory, name, version, cells, overwrite)
    _check_directory(directory, overwrite)
    session = active_session()
    if session is None:
        raise ExportError(
            "Nothing to export: no opmagic session is running. Load the extension "
            "(%load_ext opmagic) and define operators in cells, then export."
        )
    history = session.history()
    selection = select(history, cells)
    natives = native_sources(selection.cells)
    python = python_module(name, selection.cells, history)
    operators = _operators(selection.cells, natives, python)
    runs = [
        run
        for entry in history
        if entry.state in ("in effect", "nothing in effect")
        for run in entry.checks
    ]
    tests = generated_tests(name, operators, runs)
    requirements, dependency_notes = dependencies(name, natives, python)
    abi = abi_of(natives)
    exported = tuple(_exported_cell(entry, natives, python, name) for entry in selection.cells)
    about = "PyTorch operators " + ", ".join(op.qualname for op in operators[:4])
    about += " and more" if len(operators) > 4 else ""
    files: dict[str, bytes | str] = {
        "pyproject.toml": pyproject(name, version, requirements, bool(natives), about),
        "README.md": readme(
            name,
            version,
            abi,
            operators,
            [(c.label, c.kind, ", ".join(c.files)) for c in exported],
            tests.counts,
        ),
        MANIFEST: manifest(
            name,
            version,
            abi,
            operators,
            natives,
            [{"cell": c.label, "kind": c.kind, "files": list(c.files)} for c in exported],
        ),
        f"{name}/__init__.py": init_py(name, version, natives, python is not None),
        f"tests/{TEST_FILE}": tests.module,
        f"tests/{SAMPLES_FILE}": tests.samples,
    }
    if natives:
        files["setup.py"] = setup_py(name, natives)
    for source in natives:
        files[f"{name}/{source.path}"] = source.text
    if python is not None:
        files[f"{name}/ops.py"] = python.text
    write_package(directory, files, replace=overwrite)
    notes = [*(python.notes if python else ()), *dependency_notes, *tests.notes]
    notes += [
        f"cell {source.label} includes headers from {', '.join(source.include_dirs)}: the "
        "package builds where that is; copy the headers into its csrc/ to ship them"
        for source in natives
        if source.include_dirs
    ]
    notes += [f"cell {e.label}: {u}" for e in history for u in e.unkept]
    return Export(
        directory=directory,
        name=name,
        version=version,
        abi=abi,
        operators=tuple(operators),
        cells=exported,
        left_out=selection.left_out,
        files=tuple(sorted(files)),
        tests=tuple(tests.counts.items()),
        notes=tuple(dict.fromkeys(notes)),
    )


def _checked_arguments(
    directory: object, name: object, version: object, cells: object, overwrite: object
) -> tuple[Path, list[int] | None]:
    """The arguments of :func:`export`, checked: a clear error for each bad one."""
    if not isinstance(directory, (str, os.PathLike)) or isinstance(directory, bytes):
        raise ArgumentTypeError(
            f"export: directory must be a path (str or pathlib.Path), got {directory!r:.60}."
        )
    if not isinstance(name, str):
        raise ArgumentTypeError(f"export: name must be a str, got {name!r:.60}.")
    if not isinstance(version, str):
        raise ArgumentTypeError(
            f"export: version must be a str such as '0.1.0', got {version!r:.60}."
        )
    if not isinstance(overwrite, bool):
        raise ArgumentTypeError(f"export: overwrite must be True or False, got {overwrite!r:.60}.")
    numbers = None
    if cells is not None:
        if not is_list_of_values(cells):
            raise ArgumentTypeError(
                f"export: cells must be cell numbers, e.g. [3, 5], got {cells!r:.60}."
            )
        numbers = list(cells)
        if not all(type(n) is int and n > 0 for n in numbers):
            raise ArgumentTypeError(
                f"export: cells must be cell numbers (the n of In [n]), got {numbers!r:.60}."
            )
    check_name(name)
    if not _VERSION.fullmatch(version):
        raise ExportError(
            f"The version {version!r} is not a version pip accepts (PEP 440): write it as "
            "0.1.0, 1.2 or 2.0rc1."
        )
    path = Path(os.fspath(directory)).expanduser().absolute()
    return path, numbers


def check_name(name: str) -> None:
    """A package name: a Python identifier that no module torch (or the tests) need has."""
    if not _NAME.fullmatch(name) or keyword.iskeyword(name):
        raise ExportError(
            f"The package name {name!r} is not a Python identifier (letters, digits and _, not "
            "starting with a digit, not a keyword): it is what `import NAME` imports. Use e.g. "
            "my_ops."
        )
    taken = _needed_modules()
    if name in taken or name.lower() in {module.lower() for module in taken}:
        raise ExportError(
            f"The package name {name!r} would shadow the module {name} that torch (or Python, "
            "or the package's tests) needs: installing it would break them. Choose another "
            "name, e.g. my_ops."
        )


@functools.cache
def _needed_modules() -> frozenset[str]:
    """Modules a package must not be named like: the standard library's, torch's, its
    requirements', and the tools that build and test the package (read once: installed
    distributions take a moment to list)."""
    import importlib.metadata

    modules = set(sys.stdlib_module_names) | {"torch", "torchgen", "functorch", *_TOOLS}
    wanted = {"torch"}
    for requirement in importlib.metadata.requires("torch") or ():
        if "extra ==" not in requirement:
            wanted.add(re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower())
    for module, distributions in importlib.metadata.packages_distributions().items():
        if any(d.lower().replace("_", "-") in wanted for d in distributions):
            modules.add(module)
    return frozenset(modules | {w.replace("-", "_") for w in wanted})


def _check_directory(directory: Path, overwrite: bool) -> None:
    """The directory must be new, empty, or (with ``overwrite``) an earlier export."""
    if not directory.exists():
        if directory.parent.exists() and not directory.parent.is_dir():
            raise ExportError(f"{directory.parent} is a file: export into a directory.")
        return
    if not directory.is_dir():
        raise ExportError(f"{directory} is a file, not a directory: choose another place.")
    if not any(directory.iterdir()):
        return
    if not overwrite:
        raise ExportError(
            f"{directory} exists and is not empty: pass overwrite=True (%export_ops "
            "--overwrite) to replace an earlier export there, or choose another directory."
        )
    if not is_export(directory):
        raise ExportError(
            f"{directory} is not an earlier export (no {MANIFEST} of opmagic's in it): "
            "overwrite=True replaces only those. Choose another directory."
        )


def _operators(
    cells: Sequence[CellEntry], natives: Sequence[NativeSource], python: PythonModule | None
) -> list[Operator]:
    """Every operator the package defines, in cell order, with its schema now."""
    operators: list[Operator] = []
    for entry in cells:
        for source in natives:
            if source.label == entry.label:
                operators += [
                    _operator(name, entry.label, source.path, source.cuda)
                    for name, _ in source.operators
                ]
        if python is not None and entry.label in python.cells:
            triton = {s.options.get("name") for s in entry.sources if s.kind == "triton_op"}
            operators += [
                _operator(name, entry.label, "ops.py", False, name.partition(".")[0] in triton)
                for kind, name in sorted(entry.defines)
                if kind == "def"
            ]
    return [op for op in operators if op.schema]


def _operator(name: str, cell: str, source: str, cuda_only: bool, triton: bool = False) -> Operator:
    """An operator as it is now: its schema, and whether it has a fake."""
    qualname, _, overload = name.partition(".")
    schema = dispatcher.find_schema(qualname, overload)
    table = dispatch_table(name) if schema is not None else None
    has_fake = False
    if isinstance(table, DispatchTable):
        meta = table["Meta"]
        has_fake = meta.kind == "kernel" or meta.alias == "CompositeImplicitAutograd"
    text = str(schema) if schema is not None else ""
    return Operator(name, text, cell, source, has_fake, cuda_only, triton)


def _exported_cell(
    entry: CellEntry, natives: Sequence[NativeSource], python: PythonModule | None, name: str
) -> ExportedCell:
    """How one exported cell went into the package."""
    kinds, files, notes = [], [], []
    for source in entry.sources:
        words = _KIND_WORDS.get(source.kind, source.kind)
        if source.kind in ("custom_op", "triton_op"):
            words += f" {source.options.get('name')}"
        kinds.append(words)
    for native in natives:
        if native.label == entry.label:
            files.append(f"{name}/{native.path}")
            notes.append("stable ABI" if native.stable else native.why_classic or "classic ABI")
            if native.explicit:
                shown = [line.removeprefix("#include ") for line in native.explicit]
                notes.append(f"made explicit: {', '.join(shown)}")
    if (
        python is not None
        and entry.label in python.cells
        and any(s.kind in PYTHON_KINDS for s in entry.sources)
    ):
        files.append(f"{name}/ops.py")
    if entry.failed_rerun:
        notes.append(entry.failed_rerun + " (this earlier run is exported)")
    return ExportedCell(entry.label, ", ".join(dict.fromkeys(kinds)), tuple(files), tuple(notes))
