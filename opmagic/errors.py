"""opmagic's exceptions: each message names the cause and the fix."""

from __future__ import annotations

import shutil
import sys
import textwrap
from collections.abc import Iterable, Mapping
from typing import Any, TypeGuard

from .display import Displayable


class OpmagicError(Exception):
    """Base class of every error opmagic raises on purpose.

    ``displayed`` is set by a front end that has shown the error already (a notebook draws a
    ``CompileError`` in place of the build's progress): IPython then shows it no second time.
    """

    displayed = False

    def _render_traceback_(self) -> list[str]:
        """IPython shows this instead of a traceback: the message says what is wrong and how to
        fix it, and opmagic's frames would only hide it (``%debug`` still has them)."""
        return [wrap_to_terminal(f"{type(self).__name__}: {self}")]


def wrap_to_terminal(text: str, width: int | None = None) -> str:
    """``text`` with its long lines broken between words at the terminal's width
    (``shutil.get_terminal_size``); an indented line (a source excerpt) is kept whole."""
    width = width or shutil.get_terminal_size().columns
    return "\n".join(
        line
        if len(line) <= width or line[:1].isspace()
        else textwrap.fill(line, width, break_long_words=False, break_on_hyphens=False)
        for line in text.splitlines()
    )


class UnknownOperatorError(OpmagicError, LookupError):
    """An operator or overload name that the dispatcher does not know."""


class NotAnOperatorError(OpmagicError, TypeError):
    """Something passed where an operator was expected that cannot name one."""


class ArgumentTypeError(OpmagicError, TypeError):
    """An argument of a public function that has the wrong type; the message says what it takes."""


def is_list_of_values(value: object) -> TypeGuard[Iterable[Any]]:
    """Whether an argument that takes several values got them as a collection: an iterable,
    but not text or bytes (characters), a mapping (its keys) or a tensor (its slices)."""
    if isinstance(value, (str, bytes, bytearray, Mapping)) or not isinstance(value, Iterable):
        return False
    torch = sys.modules.get("torch")  # a tensor exists only once torch is imported
    return torch is None or not isinstance(value, torch.Tensor)


class ArgumentValueError(OpmagicError, ValueError):
    """An argument of a public function whose value it cannot take (a tensor on the wrong
    device, a number out of range); the message says what it takes."""


class UnknownDispatchKeyError(OpmagicError, LookupError):
    """A dispatch key name that this torch does not have."""


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


class BuildError(OpmagicError):
    """A C++ library could not be built or loaded (base of the build errors below)."""


class BuildOptionError(BuildError, ValueError):
    """An argument of ``compile_library`` (or an option of ``%%torch_library``) is invalid."""


class ToolchainError(BuildError):
    """Something the build needs is not installed: the message names what to install."""


class CompilerNotFoundError(ToolchainError):
    """No C++ compiler was found (neither ``$CXX`` nor ``c++``/``g++`` on ``PATH``)."""


class MissingHeadersError(ToolchainError):
    """Headers the build needs (torch's C++ headers, ``Python.h``) are not installed."""


class CudaToolkitError(ToolchainError):
    """nvcc, CUDA's headers or NVRTC are missing, or do not fit this torch."""


class TritonNotInstalledError(ToolchainError):
    """``%%triton_op`` needs the ``triton`` package; the message says which version to install."""


class TritonKernelError(OpmagicError, RuntimeError):
    """A Triton kernel that does not compile, or that failed while it ran (an out-of-bounds
    access the interpreter caught): ``filename`` and ``line`` are where in the kernel, as the
    user numbers the cell's lines; ``kernel`` is the kernel's name."""

    def __init__(
        self,
        message: str,
        *,
        kernel: str = "",
        filename: str | None = None,
        line: int | None = None,
    ) -> None:
        super().__init__(message)
        self.kernel = kernel
        self.filename = filename
        self.line = line


class CudaLaunchError(OpmagicError, RuntimeError):
    """A quick-path CUDA kernel that did not launch: replaced by a newer run of its cell, not
    loadable on this GPU, or refused by the driver (its configuration is in the message)."""


class NoGPUError(OpmagicError, RuntimeError):
    """A kernel was asked to run where no GPU can run it (no driver, no device, CPU torch)."""


class CompareError(OpmagicError, ValueError):
    """Arguments of ``compare`` that cannot make a sweep (bad inputs, dtypes, devices)."""


class ExportError(OpmagicError, ValueError):
    """What ``opmagic.export`` cannot make a package of: a directory it may not write, a bad
    package name, nothing to export, cells that clash. Nothing was written."""


class CacheDirectoryError(BuildError):
    """The build cache directory is unsafe to load from (another owner, or open to others)."""


class CacheFullError(BuildError):
    """The disk that holds the build cache (or the compiler's temporary files) is full."""


class CompileError(BuildError, Displayable):
    """The compiler rejected the source; the message shows every error at its source line.

    In a notebook it displays as the errors beside their source lines, the log folded below
    (and the front end that displayed it sets ``displayed``: nothing repeats it).
    ``diagnostics`` holds every parsed compiler message, ``log`` the full compiler output
    (the source's lines numbered as the user sees them), ``command`` the command that
    failed; ``source``, ``label`` and ``first_line`` say which source it was and how the user
    numbers its lines.
    """

    def __init__(
        self,
        message: str,
        *,
        diagnostics: tuple = (),
        log: str = "",
        command: str = "",
        source: str = "",
        label: str = "",
        first_line: int = 1,
    ) -> None:
        super().__init__(message)
        self.diagnostics = diagnostics
        self.log = log
        self.command = command
        self.source = source
        self.label = label
        self.first_line = first_line


class LoadError(BuildError):
    """A built library could not be loaded: an undefined symbol, a foreign build, or C++ that
    crashed or registered outside its blocks when tried in a child process (nothing of it was
    loaded). ``line`` is the source line at fault, when known, in the source's numbering.
    """

    def __init__(self, message: str, *, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


class RegistrationError(OpmagicError):
    """torch rejected a registration (duplicate operator, bad schema, ...); nothing was kept.

    ``line`` is the line of the TORCH_LIBRARY* block that failed, in the source's numbering.
    ``signature_changed``: a kernel's C++ signature differs from the one the operator's
    dispatcher entry, kept alive by other registrations, remembers.
    """

    def __init__(
        self, message: str, *, line: int | None = None, signature_changed: bool = False
    ) -> None:
        super().__init__(message)
        self.line = line
        self.signature_changed = signature_changed
