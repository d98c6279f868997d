"""opmagic: define, compile and inspect PyTorch operators from a notebook or a script.

The plain-Python API lives here; ``%load_ext opmagic`` adds the IPython magics on top of it.
"""

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
    NotAnOperatorError,
    OpmagicError,
    UnknownOperatorError,
)

__version__ = "0.1.0"

__all__ = [
    "ArgumentsMismatchError",
    "DispatchTable",
    "KeyInfo",
    "NotAnOperatorError",
    "OpmagicError",
    "OverloadTables",
    "Resolution",
    "Step",
    "TableEntry",
    "UnknownOperatorError",
    "dispatch_table",
    "kernels",
    "key_info",
    "resolve",
    "runtime_keys",
]
