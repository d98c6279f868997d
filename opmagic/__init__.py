"""opmagic: define, compile and inspect PyTorch operators from a notebook or a script.

The plain-Python API lives here; ``%load_ext opmagic`` adds the IPython magics on top of it.
"""

from .build import LoadedLibrary, compile_library
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
    BuildError,
    CompileError,
    NotAnOperatorError,
    OpmagicError,
    RegistrationError,
    ToolchainError,
    UnknownOperatorError,
)

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
    "BuildError",
    "CompileError",
    "DispatchTable",
    "KeyInfo",
    "LoadedLibrary",
    "NotAnOperatorError",
    "OpmagicError",
    "OverloadTables",
    "RegistrationError",
    "Resolution",
    "Step",
    "TableEntry",
    "ToolchainError",
    "UnknownOperatorError",
    "compile_library",
    "dispatch_table",
    "kernels",
    "key_info",
    "resolve",
    "runtime_keys",
]
