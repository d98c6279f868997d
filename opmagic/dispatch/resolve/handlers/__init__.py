"""What each kernel does next: one handler per dispatch-key functionality (or category).

A handler gets the call (:class:`~..call.OperatorCall`, whose ``state`` is the dispatcher
state the walk has reached), the key, the table entry that serves it and the keyset it was
picked from, and returns a :class:`~..call.KernelOutcome`: the kernel ends the call,
redispatches below its key, calls the op again under new thread-local state, hands over to
Python code opmagic does not follow, or fails. Each handler models what torch's own kernel
or fallback for that key does; keys with no handler run the user's kernel and redispatch
below it.

The handlers live by subject: ``backends``, ``autograd`` (with ADInplaceOrView and
autocast), ``math_bits``, ``functionalize`` (with Fake), ``python`` (modes, subclasses)
and ``functorch``; ``registry`` holds :func:`handles` and the moves they share. To model a
new key, write a handler in the module of its subject and register it with :func:`handles`.
"""

from __future__ import annotations

from . import autograd, backends, functionalize, functorch, math_bits, python
from .registry import HANDLERS_BY_CATEGORY, HANDLERS_BY_FUNCTIONALITY, handles, kernel_outcome

__all__ = [
    "HANDLERS_BY_CATEGORY",
    "HANDLERS_BY_FUNCTIONALITY",
    "autograd",
    "backends",
    "functionalize",
    "functorch",
    "handles",
    "kernel_outcome",
    "math_bits",
    "python",
]
