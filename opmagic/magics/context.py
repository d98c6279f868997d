"""What every magic runs in: its shell (:class:`ShellMagics`), and the one error policy,
what a magic's failure looks like to the user (:func:`magic_context`).

A ``UsageError`` is for a bad magic line or expression only; every other failure is an
:class:`~opmagic.errors.OpmagicError` that reaches the user as itself: its own class (so
``except CompileError`` works), its attributes (the cell line it names), and no internal
frames (IPython shows :meth:`OpmagicError._render_traceback_`). Either way the message starts
with the magic's name, once; but an error that is a display of its own (a ``CompileError``:
its errors at their cell lines under the name of the build that failed) keeps its message.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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
