"""``%%torch_library``: compile the cell's C++ operator library, load it, show what it added.

A thin front on :func:`opmagic.compile_library`: options, progress in place, the
compile error shown beside the cell line, and hot reload: re-running a cell replaces the
library that cell loaded before.

Which earlier library a run replaces: the one the same cell loaded, by the notebook's
cell id (Jupyter sends one with every execution). Without a cell id (a terminal IPython,
``run_cell`` without ``cell_id``), a cell is identified by what it defines: the namespaces
of its ``TORCH_LIBRARY`` blocks, else its ``TORCH_LIBRARY_IMPL`` (namespace, key) pairs
and ``TORCH_LIBRARY_FRAGMENT`` namespaces.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from ..cells.session import active_session
from ..errors import BuildOptionError, CompileError
from ..native import DEFAULT_OPT_LEVEL, BuildProgress, LoadedLibrary, compile_library
from ..native.progress import stderr_progress
from .compare import COMPARE_OPTION, compare_cell
from .session import running_cell_number

_BLOCK = re.compile(r"\bTORCH_LIBRARY(?P<kind>_FRAGMENT|_IMPL)?\s*\((?P<args>[^)]*)\)")
CELL_BODY_FIRST_LINE = 2  # line 1 of a %%torch_library cell is the magic line


def cell_identity(source: str) -> tuple:
    """What a cell without a cell id is recognised by across runs (see the module doc)."""
    defined, pieces = [], []
    for match in _BLOCK.finditer(source):
        args = [a.strip() for a in match["args"].split(",")]
        if match["kind"] is None:
            defined.append(args[0])
        elif match["kind"] == "_IMPL" and len(args) == 3:
            pieces.append((args[0], args[1]))
        else:
            pieces.append((args[0], "FRAGMENT"))
    if defined:
        return ("defines", tuple(sorted(set(defined))))
    return ("registers", tuple(sorted(set(pieces))))


class _DisplayProgress:
    """Build progress as one notebook output, updated in place (then the result or error)."""

    def __init__(self) -> None:
        self.handle: Any = None

    def __call__(self, event: BuildProgress) -> None:
        """Show ``event``, creating the output on the first report."""
        bundle = {"text/plain": str(event)}
        if self.handle is None:
            self.handle = display(bundle, raw=True, display_id=True)
        else:
            self.handle.update(bundle, raw=True)

    def show(self, obj: Any) -> None:
        """Replace the progress output with ``obj`` (or add it when nothing was built)."""
        if self.handle is None:
            display(obj)
        else:
            self.handle.update(obj)


class LibraryCells:
    """Hot reload for cell magics that load libraries: the library each cell loaded last.

    A run replaces the library the same cell loaded (found by the notebook's cell id, else by
    :func:`cell_identity`); the new library is tracked by the session, so ``%opmagic session``
    lists it and ``%unload_ext`` closes it at the latest.
    """

    shell: Any  # the IPython shell (Magics has it)

    def _follow_cells(self) -> None:
        """Start following cell runs (call from ``__init__``)."""
        self.libraries: dict[tuple, LoadedLibrary] = {}
        self._cell_id: str | None = None
        self.shell.events.register("pre_run_cell", self._remember_cell)

    def _remember_cell(self, info: Any) -> None:
        """``pre_run_cell`` hook: the id of the cell about to run (None outside notebooks)."""
        self._cell_id = getattr(info, "cell_id", None)

    def _cell_key(self, cell: str) -> tuple:
        """What identifies the running cell across runs."""
        return ("cell", self._cell_id) if self._cell_id else cell_identity(cell)

    def _previous(self, key: tuple) -> LoadedLibrary | None:
        """The library this run replaces: the same cell's, or (no cell id) one defining the
        same TORCH_LIBRARY namespace, which can have only one definition anyway."""
        if key in self.libraries or key[0] != "defines":
            return self.libraries.get(key)
        wanted = set(key[1])
        return next(
            (
                library
                for other, library in self.libraries.items()
                if other[0] == "defines" and wanted & set(other[1])
            ),
            None,
        )

    def _load(self, cell: str, magic: str, build: Callable[..., LoadedLibrary]) -> LoadedLibrary:
        """Run ``build(replace=..., label=..., first_line=..., progress=...)`` for this cell:
        progress in place in a notebook, the compile error shown there, then bookkeeping."""
        key = self._cell_key(cell)
        shell = self.shell
        in_notebook = getattr(shell, "kernel", None) is not None
        progress = _DisplayProgress() if in_notebook else stderr_progress
        try:
            library = build(
                replace=self._previous(key),
                label=f"cell [{running_cell_number(shell)}]",
                first_line=CELL_BODY_FIRST_LINE,
                progress=progress,
            )
        except CompileError as error:
            if in_notebook:
                progress.show(error)
            raise
        except BuildOptionError as error:
            raise BuildOptionError(f"{magic}: {error}") from None
        self.libraries = {k: v for k, v in self.libraries.items() if not v.closed}
        self.libraries[key] = library
        session = active_session()
        if session is not None:  # listed by %opmagic session; closed at unload at the latest
            session.track(library, library.description)
        return library

    def close(self) -> None:
        """Unregister every library the magic loaded and stop following cell runs.

        For ``%unload_ext``: afterwards the dispatcher holds nothing from these cells.
        """
        for library in reversed(list(self.libraries.values())):
            library.close()
        self.libraries.clear()
        self.shell.events.unregister("pre_run_cell", self._remember_cell)


@magics_class
class TorchLibraryMagics(Magics, LibraryCells):
    """The ``%%torch_library`` cell magic and the libraries it has loaded, per cell."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self._follow_cells()

    @magic_arguments()
    @argument("-n", "--name", help="library name (lib<NAME>.so); default: the first namespace")
    @argument(
        "-O",
        "--opt",
        dest="opt_level",
        default=DEFAULT_OPT_LEVEL,
        help=f"optimisation level 0, 1, 2, 3, s or g (default {DEFAULT_OPT_LEVEL})",
    )
    @argument(
        "-I",
        "--include",
        dest="include_dirs",
        action="append",
        default=[],
        metavar="DIR",
        help="add an include directory (repeatable); headers there are tracked for rebuilds",
    )
    @argument(
        "--cflags",
        default="",
        metavar="FLAGS",
        help='extra compiler flags, one string: --cflags="-DFOO=1 -march=native"',
    )
    @argument(
        "--ldflags",
        default="",
        metavar="FLAGS",
        help='extra linker flags, one string: --ldflags="-L/opt/lib -lfoo"',
    )
    @argument(
        "--no-pch",
        dest="precompiled_headers",
        action="store_false",
        help="do not use precompiled torch headers (slower; to rule them out)",
    )
    @argument("-f", "--force", action="store_true", help="rebuild even if a cached build exists")
    @argument("-v", "--verbose", action="store_true", help="print the compiler commands and output")
    @COMPARE_OPTION
    @cell_magic
    def torch_library(self, line: str, cell: str) -> LoadedLibrary:
        """Compile the cell (C++ with TORCH_LIBRARY / TORCH_LIBRARY_IMPL blocks), load it,
        and show the operators and kernels it registered.

        The cell is written as a real extension source, with its own #include lines; the
        ops are at torch.ops.NAMESPACE.* right after. Re-running the cell replaces what it
        registered before, including changed schemas. Builds are cached per user in
        $XDG_CACHE_HOME/opmagic. A compile error stops the run and points at the cell line;
        the previous version of the cell stays loaded.
        """
        args = parse_argstring(self.torch_library, line)
        library = self._load(
            cell,
            "%%torch_library",
            functools.partial(
                compile_library,
                cell,
                name=args.name,
                extra_cflags=args.cflags,
                extra_ldflags=args.ldflags,
                include_dirs=args.include_dirs,
                opt_level=args.opt_level,
                precompiled_headers=args.precompiled_headers,
                force=args.force,
                verbose=args.verbose,
            ),
        )
        return compare_cell(self.shell, args.compare, library, "%%torch_library")
