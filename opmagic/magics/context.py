"""The magics' one error policy: what a magic's failure looks like to the user.

A ``UsageError`` is for a bad magic line or expression only; every other failure is an
:class:`~opmagic.errors.OpmagicError` that reaches the user as itself: its own class (so
``except CompileError`` works), its attributes (the cell line it names), and no internal
frames (IPython shows :meth:`OpmagicError._render_traceback_`). Either way the message starts
with the magic's name, once; but an error that is a display of its own (a ``CompileError``:
its errors at their cell lines under the name of the build that failed) keeps its message.
"""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Iterator
from typing import Any, NoReturn

from IPython.core.error import UsageError

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
