"""opmagic's exceptions: each message names the cause and the fix."""

from __future__ import annotations


class OpmagicError(Exception):
    """Base class of every error opmagic raises on purpose."""


class UnknownOperatorError(OpmagicError, LookupError):
    """An operator or overload name that the dispatcher does not know."""


class NotAnOperatorError(OpmagicError, TypeError):
    """Something passed where an operator was expected that cannot name one."""


class ArgumentsMismatchError(OpmagicError, TypeError):
    """Call arguments that match no overload, or the wrong type for a schema argument."""


class ForeignOperatorError(OpmagicError, ValueError):
    """An operator name that belongs to an operator defined outside the opmagic session."""


class OperatorNameError(OpmagicError, ValueError):
    """A name that cannot name a new custom operator (``namespace::name`` with identifiers)."""


class CellSourceError(OpmagicError, ValueError):
    """A cell whose code cannot become an operator; ``line`` is the cell line at fault."""

    def __init__(self, message: str, *, filename: str | None = None, line: int | None = None):
        super().__init__(message)
        self.filename = filename
        self.line = line
