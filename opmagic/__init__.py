"""opmagic: define, compile and inspect PyTorch operators from a notebook or a script.

The plain-Python API lives here; ``%load_ext opmagic`` adds the IPython magics on top of it.
"""

from .checks import CheckReport, CheckRow, check_op
from .custom_op import CustomOpResult, KernelRow, custom_op_from_source
from .dispatch import (
    DispatchTable,
    KeyInfo,
    OverloadTables,
    Resolution,
    Step,
    TableEntry,
    dispatch_table,
    kernels,
    key_info,
    resolve,
    runtime_keys,
)
from .errors import (
    ArgumentsMismatchError,
    CellSourceError,
    ForeignOperatorError,
    NotAnOperatorError,
    OperatorNameError,
    OpmagicError,
    UnknownOperatorError,
)
from .session import Session, SessionReport, active_session, registration_site

__version__ = "0.1.0"


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext opmagic``: register the magics (IPython is imported only now)."""
    from .magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: object) -> None:
    """``%unload_ext opmagic``: remove the magics and what the session registered."""
    from .magics import unload_ipython_extension as unload

    unload(ipython)


__all__ = [
    "ArgumentsMismatchError",
    "CellSourceError",
    "CheckReport",
    "CheckRow",
    "CustomOpResult",
    "DispatchTable",
    "ForeignOperatorError",
    "KernelRow",
    "KeyInfo",
    "NotAnOperatorError",
    "OperatorNameError",
    "OpmagicError",
    "OverloadTables",
    "Resolution",
    "Session",
    "SessionReport",
    "Step",
    "TableEntry",
    "UnknownOperatorError",
    "active_session",
    "check_op",
    "custom_op_from_source",
    "dispatch_table",
    "kernels",
    "key_info",
    "registration_site",
    "resolve",
    "runtime_keys",
]
