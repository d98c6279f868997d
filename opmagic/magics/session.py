"""The IPython side of the session: cell events, ``cell [n], line k`` labels, ``%opmagic``.

``%load_ext opmagic`` starts an :class:`IPythonSession`: each cell run is bracketed by
IPython's ``pre_run_cell``/``post_run_cell`` events, so that the registrations it makes are
owned by it (see :mod:`opmagic.cells.session`). Jupyter front ends send a cell id, which
identifies a cell across runs; without one (terminal IPython, nbclient) every run is a new
cell and re-runs are recognised by the operators they define.
"""

from __future__ import annotations

import re
from typing import Any

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from ..cells.session import Session, SessionReport
from ..dispatch.sites import add_labeler, remove_labeler
from .arguments import parse_options
from .context import magic_context

_INPUT_CELL = re.compile(r"^<ipython-input-(\d+)-")

class IPythonSession:
    """A :class:`Session` driven by an IPython shell's cell events."""

    def __init__(self, shell: Any) -> None:
        self.shell = shell
        self.session = Session(is_cell_code=self.is_cell_code)
        self.running_number = shell.execution_count  # the In [n] of the cell running now

    def start(self) -> None:
        """Start tracking cells (and name cell sites ``cell [n], line k`` in tables); the
        cells run so far (this one included) go into the history untracked."""
        self.session.start()
        history = getattr(self.shell.history_manager, "input_hist_raw", None) or []
        for number, raw_cell in enumerate(history[1:], 1):
            self.session.note_earlier_cell(f"[{number}]", _compiled_code(self.shell, raw_cell))
        self.shell.events.register("pre_run_cell", self.pre_run_cell)
        self.shell.events.register("post_run_cell", self.post_run_cell)
        add_labeler(self.label)

    def stop(self) -> None:
        """Stop tracking and remove everything the session's cells registered."""
        for event, callback in (
            ("pre_run_cell", self.pre_run_cell),
            ("post_run_cell", self.post_run_cell),
        ):
            if callback in self.shell.events.callbacks[event]:
                self.shell.events.unregister(event, callback)
        remove_labeler(self.label)
        self.session.close()

    def pre_run_cell(self, info: Any) -> None:
        """A cell starts: its registrations from now on belong to it (and its code, as IPython
        compiles it, to its history)."""
        self.running_number = _number_of_starting_cell(self.shell)
        label = f"[{self.running_number}]"
        source = _compiled_code(self.shell, info.raw_cell or "")
        self.session.begin(getattr(info, "cell_id", None), label, self.shell.user_ns, source)

    def post_run_cell(self, result: Any) -> None:
        """The cell ended: keep what it registered, or roll it back if it failed."""
        error = result.error_in_exec or result.error_before_exec
        self.session.finish(success=result.success, error=error)

    def cell_number(self, filename: str) -> int | None:
        """The execution count of the cell compiled under ``filename``, if it is a cell."""
        number = getattr(self.shell.compile, "_filename_map", {}).get(filename)
        if number is None and (match := _INPUT_CELL.match(filename)):
            number = int(match[1])
        return number

    def is_cell_code(self, filename: str) -> bool:
        """Whether code compiled under ``filename`` was written in a cell."""
        return self.cell_number(filename) is not None

    def label(self, filename: str, line: int) -> str | None:
        """``cell [n], line k`` for a site in a cell (a labeler for dispatch tables)."""
        number = self.cell_number(filename)
        return None if number is None else f"cell [{number}], line {line}"


def _compiled_code(shell: Any, raw_cell: str) -> str:
    """The cell as IPython compiles it (magics and ``!`` lines as calls); the raw cell when
    IPython cannot transform it (it then fails to compile it too)."""
    try:
        return shell.transform_cell(raw_cell)
    except Exception:
        return raw_cell


def _number_of_starting_cell(shell: Any) -> int:
    """The In [n] of the cell that ``pre_run_cell`` announces, on every IPython version.

    IPython up to 9.5 advances ``execution_count`` after a cell ran, later versions before
    ``pre_run_cell``; the input history holds an empty first entry and one per earlier
    stored cell in both, so its length is the starting cell's number.
    """
    history = getattr(shell.history_manager, "input_hist_raw", None)
    return len(history) if history else shell.execution_count


def running_cell_number(shell: Any) -> int:
    """The In [n] of the cell running now (for magics that label what the cell made)."""
    magics = shell.magics_manager.registry.get(SessionMagics.__name__)
    return magics.cells.running_number if magics is not None else shell.execution_count


@magics_class
class SessionMagics(Magics):
    """``%opmagic``, and the session of ``%load_ext opmagic`` (started with this instance,
    stopped by :meth:`close` at ``%unload_ext``)."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.cells = IPythonSession(shell)
        self.cells.start()

    def close(self) -> None:
        """Stop the session, removing what its cells registered."""
        self.cells.stop()

    @magic_arguments()
    @argument(
        "what",
        choices=["session"],
        help="session: list what each cell registered (operators, kernels, fake impls, "
        "Library objects, loaded libraries) and where",
    )
    @line_magic
    def opmagic(self, line: str) -> SessionReport:
        """Show the opmagic session: ``%opmagic session`` lists what each cell registered.

        Re-running a cell replaces what it registered before; ``%unload_ext opmagic``
        removes everything listed here.
        """
        with magic_context("%opmagic"):
            parse_options(self.opmagic, line)
        return self.cells.session.report()
