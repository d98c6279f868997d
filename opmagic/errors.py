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
