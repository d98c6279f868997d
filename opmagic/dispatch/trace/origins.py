"""Where a call came from: the frame of the user's Python code that made it, and the path of
the ``nn.Module`` running it.

The observer reads them from the Python stack as ``(code, line, modules)``: the innermost
frame whose code :func:`is_user_code` accepts (not torch's, not opmagic's, not Python's
library or an installed package's: a notebook cell, a script, the user's own modules), and
the modules whose ``__call__`` runs inside the traced code, outermost first.
:class:`Origins` names them once per trace, while the code objects and modules are alive.
"""

from __future__ import annotations

import functools
import itertools
import os
import sysconfig
from pathlib import Path
from typing import Any

import torch

from ..sites import label_location
from .result import CodeLocation

# Where machinery lives, not the user's code: torch, opmagic, Python's library and the
# installed packages (IPython and the kernel that run a notebook's cells among them)
_LIBRARY_ROOTS = tuple(
    str(Path(root).resolve()) + os.sep
    for root in {
        Path(torch.__file__).parent,
        Path(__file__).resolve().parents[2],  # opmagic, wherever it is installed from
        *(
            Path(sysconfig.get_paths()[kind])
            for kind in ("stdlib", "platstdlib", "purelib", "platlib")
        ),
    }
)
_GENERATED = ("<frozen ", "<eval_with_key>")  # import machinery, torch.fx's generated code
_INDUCTOR = "torchinductor_"  # the start of Inductor's cache directory, its generated code


def is_user_code(code: Any) -> bool:
    """Whether a frame running ``code`` is the user's: a call it makes is where it came from."""
    return is_user_file(code.co_filename)


@functools.lru_cache(maxsize=4096)
def is_user_file(filename: str) -> bool:
    """Whether ``filename`` holds the user's code (a notebook cell, a script, a module of
    theirs) rather than torch's, opmagic's, Python's library's, an installed package's or
    code torch generated (torch.fx graphs, Inductor's compiled modules)."""
    if filename.startswith("<"):
        return not filename.startswith(_GENERATED)
    try:
        path = Path(filename).resolve()
    except (OSError, RuntimeError):
        return True
    generated = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if any(part.startswith(_INDUCTOR) for part in path.parts) or (
        generated and path.is_relative_to(Path(generated).resolve())
    ):
        return False
    return not str(path).startswith(_LIBRARY_ROOTS)


class Origins:
    """The observer's origins named, each code line and module chain once."""

    def __init__(self) -> None:
        self._locations: dict[tuple[int, int], CodeLocation] = {}
        self._modules: dict[tuple[int, ...], tuple[str, str]] = {}
        self._names: dict[int, dict[int, str]] = {}

    def location(self, code: Any, line: int) -> CodeLocation:
        """Where ``code`` runs ``line``."""
        key = (id(code), line)
        found = self._locations.get(key)
        if found is None:
            filename = _absolute(code.co_filename)
            function = getattr(code, "co_qualname", code.co_name)  # co_qualname: Python 3.11
            found = self._locations[key] = CodeLocation(
                filename, line, function, label_location(filename, line)
            )
        return found

    def named(self, filename: str, line: int, function: str) -> CodeLocation:
        """A line of a function known by name (dynamo names the frames it compiled)."""
        filename = _absolute(filename)
        return CodeLocation(filename, line, function, label_location(filename, line))

    def definition(self, code: Any) -> CodeLocation:
        """Where the function running ``code`` is defined (its ``def`` line)."""
        return self.location(code, code.co_firstlineno)

    def module(self, modules: tuple[Any, ...]) -> tuple[str, str] | tuple[None, None]:
        """``(path, class name)`` of the innermost of ``modules`` (outermost first): the path
        names each module inside the one around it (``layers.0.linear1``; ``""`` for the
        outermost itself)."""
        if not modules:
            return None, None
        key = tuple(id(m) for m in modules)
        found = self._modules.get(key)
        if found is None:
            parts = []
            for outer, inner in itertools.pairwise(modules):
                name = self._names_in(outer).get(id(inner))
                if name != "":  # a module calling itself again adds nothing
                    parts.append(name or f"<{type(inner).__name__}>")
            found = self._modules[key] = (".".join(parts), type(modules[-1]).__name__)
        return found

    def _names_in(self, module: Any) -> dict[int, str]:
        """The dotted names of the modules inside ``module``, by identity."""
        found = self._names.get(id(module))
        if found is None:
            try:
                named = module.named_modules(remove_duplicate=False)
                found = {id(inner): name for name, inner in named}
            except Exception:  # not an nn.Module after all, or one that refuses: no names
                found = {}
            self._names[id(module)] = found
        return found


def _absolute(filename: str) -> str:
    """A code object's filename as label_location expects it (relative ones made absolute)."""
    if os.path.isabs(filename) or filename.startswith("<"):
        return filename
    return os.path.abspath(filename)
