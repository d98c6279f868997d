"""``nn.Module`` internals the trace reads: which Python code is a module's ``__call__``.

The trace names the modules running a call from the Python stack: a frame running one of
:func:`module_call_codes` has the module as its ``self``. Read only; nothing is hooked.
"""

from __future__ import annotations

from types import CodeType

import torch


def module_call_codes() -> tuple[CodeType, ...]:
    """The code objects of ``nn.Module.__call__``'s implementation (``_call_impl``, which
    every module call runs, hooks or not), whose frames' ``self`` is the running module."""
    return (torch.nn.Module._call_impl.__code__,)
