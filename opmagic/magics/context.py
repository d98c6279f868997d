"""What every magic runs in: its shell (:class:`ShellMagics`), and the one error policy,
what a magic's failure looks like to the user (:func:`magic_context`).

A ``UsageError`` is for a bad magic line or expression only; every other failure is an
:class:`~opmagic.errors.OpmagicError` that reaches the user as itself: its own class (so
``except CompileError`` works), its attributes (the cell line it names), and no internal
frames (IPython shows :meth:`OpmagicError._render_traceback_`). Either way the message starts
with the magic's name, once; but an error that is a display of its own (a ``CompileError``:
its errors at their cell lines under the name of the build that failed) keeps its message.

An error a magic has already displayed (``error.displayed``: a ``CompileError`` drawn in place
of the build's progress in a notebook) is shown once: :func:`show_errors_once` makes IPython
send no second ``error`` output for it (ipykernel sends one for every traceback it shows,
even an empty one, and JupyterLab draws an empty one as ``ename: evalue``). The cell still
fails: the execute reply says ``error`` (with the message as its traceback, which
nbclient and nbconvert print), so "Run All" stops there.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
import weakref
from collections.abc import Iterator
from typing import Any, NoReturn

from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.core.magic import Magics

from ..display import Displayable
from ..errors import OpmagicError


@contextlib.contextmanager
def magic_context(name: str) -> Iterator[None]:
    """Run a magic's work: its ``UsageError`` or ``OpmagicError`` gets ``name: `` in front
    of its message (``%%custom_op: cell [3], line 2: ...``) and propagates, class kept."""
    try:
        yield
    except (UsageError, OpmagicError) as error:
        message = str(error)
        if not (isinstance(error, Displayable) or message.startswith(f"{name}: ")):
            error.args = (f"{name}: {message}", *error.args[1:])
        raise


class ShellMagics(Magics):
    """The base of opmagic's magics. IPython gives each the shell it is registered with; its
    types say ``shell`` may be None, which never holds for a registered magic."""

    shell: InteractiveShell


class _ShownOnce:
    """The shell's custom exception handler (``InteractiveShell.set_custom_exc``) for
    :class:`OpmagicError`: an error a magic has displayed already is recorded for
    ``%debug``/``%tb`` and not shown again; any other is shown as IPython shows it. The
    exceptions of a handler the user had set go to that handler."""

    def __init__(self, shell: Any) -> None:
        self.previous = (shell.custom_exceptions, shell.CustomTB)
        self.installed: Any = None  # the shell's CustomTB once this handler is set

    def show(
        self, shell: Any, etype: type, value: BaseException, tb: Any, tb_offset: Any = None
    ) -> None:
        """Show ``value`` (IPython calls this for an exception of the handled classes)."""
        exceptions, previous_handler = self.previous
        if not isinstance(value, OpmagicError) and isinstance(value, exceptions):
            previous_handler(etype, value, tb, tb_offset=tb_offset)
        elif isinstance(value, OpmagicError) and value.displayed:
            sys.last_type, sys.last_value, sys.last_traceback = etype, value, tb
            if hasattr(shell, "_last_traceback"):  # ipykernel: the execute reply's traceback,
                shell._last_traceback = value._render_traceback_()  # what nbclient prints
        else:
            shell.showtraceback((etype, value, tb), tb_offset=tb_offset)


_handlers: weakref.WeakKeyDictionary[Any, _ShownOnce] = weakref.WeakKeyDictionary()


def show_errors_once(shell: Any) -> None:
    """Set the handler that shows a displayed :class:`OpmagicError` once (see the module)."""
    handler = _ShownOnce(shell)
    shell.set_custom_exc((*shell.custom_exceptions, OpmagicError), handler.show)
    handler.installed = shell.CustomTB
    _handlers[shell] = handler


def stop_showing_errors_once(shell: Any) -> None:
    """Give the shell back the custom exception handler it had before
    :func:`show_errors_once`, unless another one has replaced opmagic's since."""
    handler = _handlers.pop(shell, None)
    if handler is not None and shell.CustomTB == handler.installed:
        shell.custom_exceptions, shell.CustomTB = handler.previous


_OPMAGIC = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def raise_users_error(shell: Any, error: BaseException) -> NoReturn:
    """Raise ``error``, which the user's code raised in a cell a magic ran (``%%trace``), shown
    as the user's own: its traceback from the first frame of a cell on, opmagic's frames left
    out (IPython shows what :meth:`_render_traceback_` gives; ``%debug`` still has them all)."""
    is_cell = getattr(shell.compile, "_filename_map", {}).__contains__
    kept: list[types.TracebackType] = []
    entry = error.__traceback__
    while entry is not None:
        filename = entry.tb_frame.f_code.co_filename
        if (kept or is_cell(filename)) and not filename.startswith(_OPMAGIC):
            kept.append(entry)
        entry = entry.tb_next
    users: types.TracebackType | None = None
    for entry in reversed(kept):
        users = types.TracebackType(users, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    shown = shell.InteractiveTB.structured_traceback(type(error), error, users, tb_offset=0)
    with contextlib.suppress(AttributeError):  # one that takes no attributes: shown as is
        error._render_traceback_ = lambda: shown  # type: ignore[attr-defined]
    raise error
