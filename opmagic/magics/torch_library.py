"""``%%torch_library``: compile the cell's C++ operator library, load it, show what it added.

A thin front on :func:`opmagic.compile_library`: options, progress in place, the
compile error shown beside the cell line, and hot reload through the session: which earlier
library a run replaces is the session's rule (:meth:`opmagic.Session.superseded`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from IPython.core.magic import cell_magic, magics_class
from IPython.core.magic_arguments import magic_arguments

from ..cachedir import ProgressCallback
from ..cells.history import CellSource
from ..cells.session import CellIdentity, active_session
from ..errors import CompileError, OpmagicError, RegistrationError
from ..native import BuildProgress, LoadedLibrary, compile_library, stderr_progress
from ..view.live import LiveOutput
from .arguments import (
    COMPARE_OPTIONS,
    DOCTOR_CELL_OPTIONS,
    build_keywords,
    build_options,
    parse_options,
    with_options,
)
from .compare import compare_cell
from .context import ShellMagics, magic_context
from .doctor import doctor_cell
from .session import running_cell_number

CELL_BODY_FIRST_LINE = 2  # line 1 of a %%torch_library cell is the magic line


class DisplayProgress:
    """Build progress as one notebook output, updated in place (then the result or error)."""

    def __init__(self) -> None:
        self.output = LiveOutput()

    def __call__(self, event: BuildProgress | str) -> None:
        """Show ``event`` in place of the last one: a build's progress, or a step's line
        (what :meth:`~opmagic.package.export.Export.verify` reports)."""
        self.output.text(str(event))

    def show(self, obj: Any) -> None:
        """Replace the progress output with ``obj`` (or add it when nothing was built)."""
        self.output.show(obj)

    def clear(self) -> None:
        """Empty the progress output (the result is shown as the cell's value instead)."""
        if self.output.handle is not None:
            self.output.text("")


def load_library_cell(
    shell: Any,
    cell: str,
    build: Callable[..., LoadedLibrary],
    kind: str = "torch_library",
    options: dict[str, Any] | None = None,
) -> LoadedLibrary:
    """Run ``build(replace=..., label=..., first_line=..., progress=...)`` for this cell.

    Hot reload goes through the session: the library this run replaces is the one
    :meth:`~opmagic.Session.superseded` names (the same cell's, or the one defining a
    namespace this cell defines, which the library's notes then name); the new library is
    tracked by the session, so ``%opmagic session`` lists it and ``%unload_ext`` (or a
    re-run) closes it. In a notebook, progress shows in place and a compile error beside its
    cell line. The session's history notes the cell as a ``kind`` cell (``%%torch_library``
    or ``%%cuda_kernel``) built with the library's options and ``options`` (CUDA's).
    """
    session = active_session()
    if session is None:
        raise OpmagicError("needs the opmagic session: run %load_ext opmagic first.")
    identity = CellIdentity.of_source(cell)
    previous = session.superseded(LoadedLibrary, identity)
    in_notebook = getattr(shell, "kernel", None) is not None
    progress: ProgressCallback = DisplayProgress() if in_notebook else stderr_progress

    def attempt() -> LoadedLibrary:
        return build(
            replace=previous,
            label=f"cell [{running_cell_number(shell)}]",
            first_line=CELL_BODY_FIRST_LINE,
            progress=progress,
        )

    try:
        try:
            library = attempt()
        except RegistrationError as error:
            # kernels of other cells (a fake impl) keep an operator whose kernel signatures
            # the edit changed: drop them, as redefining the operator does, and try again
            defined = {op.name.partition(".")[0] for op in previous.operators} if previous else ()
            if not (error.signature_changed and session.drop_registrations_on(defined)):
                raise
            library = attempt()
    except CompileError as error:
        if isinstance(progress, DisplayProgress):  # in a notebook: the errors at their lines,
            progress.show(error)  # the log folded; no traceback after it
            error.displayed = True
        raise
    try:
        library = dataclasses.replace(library, notes=(*library.notes, *session.displaced()))
        session.note_source(CellSource(kind, cell, options or {}, handle=library))
        return session.track(library, library.description, identity)
    except BaseException:  # Ctrl-C before the session holds it: nobody else could close it
        library.close()
        raise


@magics_class
class TorchLibraryMagics(ShellMagics):
    """The ``%%torch_library`` cell magic."""

    @magic_arguments()
    @with_options(build_options())
    @with_options(COMPARE_OPTIONS)
    @with_options(DOCTOR_CELL_OPTIONS)
    @cell_magic
    def torch_library(self, line: str, cell: str) -> LoadedLibrary:
        """Compile the cell (C++ with TORCH_LIBRARY / TORCH_LIBRARY_IMPL blocks, or their
        STABLE_TORCH_LIBRARY* forms for the LibTorch stable ABI), load it, and show the
        operators and kernels it registered.

        The cell is written as a real extension source, with its own #include lines; the
        ops are at torch.ops.NAMESPACE.* right after. Re-running the cell replaces what it
        registered before, including changed schemas. Builds are cached per user in
        $XDG_CACHE_HOME/opmagic. A compile error stops the run and shows each error at its
        cell line; a library that crashes or registers outside its blocks when tried in a
        child process is not loaded; either way the previous version of the cell stays.
        """
        with magic_context("%%torch_library"):
            args = parse_options(self.torch_library, line)
            build = functools.partial(compile_library, cell, **build_keywords(args))
            library = load_library_cell(self.shell, cell, build)
        compare_cell(self.shell, args.compare, library, "%%torch_library")
        return doctor_cell(self.shell, args, library, "%%torch_library")
