"""How a diff names kernels: their kind, and where they came from in the user's terms.

torch records a registration site as ``registered at FILE:LINE``; for a kernel written in
Python that is the line of its ``Library``, and for ``custom_op`` or ``torch.library.impl`` a
line inside torch's registration helpers. Where opmagic can tell more, a kernel is named by
the function behind it (a custom op's impl, fake impl or backward, an ``OpOverload.py_impl``
kernel, a ``torch._native`` route); cells are named ``cell [n], line k`` by the session's
labelers.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from ..._torch import dispatcher, library_hooks
from ...errors import OpmagicError
from ..keys import catalogue
from ..ops import op_ref
from ..sites import label_site, parse_site
from ..table import OperatorTable, Registration, TableEntry, classify
from .computed import Computed
from .state import NativeRoute

_NON_FUNCTIONAL = "CompositeExplicitAutogradNonFunctional"
_TORCH_PACKAGE = os.path.dirname(torch.__file__) + os.sep
_TORCH_BUILD = "/pytorch/pytorch/"  # where torch's C++ sources were when it was built


@dataclass(frozen=True)
class Kernel:
    """A kernel registration as a diff shows it."""

    kind: str  # "C++", "Python", "fallthrough", "torch._native router", "backend fallback"
    where: str  # file:line, "cell [3], line 6", or the Python function behind it
    site: str  # as torch recorded it ("registered at FILE:LINE")
    by_torch: bool = False  # torch registered it itself (not through its helpers for users)

    @property
    def text(self) -> str:
        """``Python · my_sin (myext.py:22)``."""
        return f"{self.kind} · {self.where}" if self.where else self.kind


def registered_by_torch(site: str) -> bool:
    """Whether a site is in torch's own code, other than the helpers (``torch.library``,
    ``torch._library``) through which user code registers."""
    located = parse_site(site)
    if located is None:
        return False
    filename = located[0]
    if filename.startswith(library_hooks.registration_machinery_paths()):
        return False
    return filename.startswith(_TORCH_PACKAGE) or _TORCH_BUILD in filename


class LiveFunctions:
    """The functions behind an operator's kernels as it is now (custom ops, Python kernels of
    OpOverloads): the one side of a diff that can still be asked."""

    def __init__(self, op: str, active: Mapping[str, Registration], live: bool) -> None:
        self.active = active
        self._table: OperatorTable | None = None
        if live:
            try:
                self._table = OperatorTable(op_ref(op))
            except OpmagicError:  # registrations without a definition: sites only
                self._table = None

    def function(self, registration: Registration) -> str | None:
        """The function behind a kernel that is active now, when opmagic can tell."""
        table = self._table
        if table is None or self.active.get(registration.key) != registration:
            return None
        keys = (
            _filled_by(registration.key)
            if registration.is_alias
            else [registration.key]
            if registration.key in catalogue().by_name
            else []
        )
        for key in keys:
            entry = table.entry(key)
            if entry.site == registration.site and entry.impl:
                return entry.impl
        return None


class KernelNamer:
    """Names the kernels and table entries of one side (before or after) of an operator."""

    def __init__(
        self,
        op: str,
        active: Mapping[str, Registration],
        routes: Sequence[NativeRoute],
        functions: LiveFunctions,
    ) -> None:
        self.op = op
        self.active = active
        self.routes = routes  # torch._native routes of the op, or the one its op implements
        self.functions = functions
        self._named: dict[Registration, Kernel] = {}

    def kernel(self, registration: Registration) -> Kernel:
        """A registration's kind and where it came from (named once per registration)."""
        named = self._named.get(registration)
        if named is None:
            named = self._named[registration] = self._name(registration)
        return named

    def _name(self, registration: Registration) -> Kernel:
        kind = _kind(registration)
        where = None
        if kind == "torch._native router":
            routes = [r for r in self.routes if r.key == registration.key]
            implemented = [r for r in routes if r.node_op == self.op]
            if implemented:  # the kernel of a route's own _native operator: its function
                kind, where = "Python", implemented[0].impl
            else:
                where = "; ".join(r.text for r in routes)
        if where is None and kind == "Python":  # only Python kernels have a function to name
            where = self.functions.function(registration)
        where = where or label_site(registration.site)
        return Kernel(kind, where, registration.site, registered_by_torch(registration.site))

    def entry(self, key: str, computed: Computed) -> TableEntry:
        """The computed entry of one runtime key as a :class:`TableEntry` whose ``source``
        names the kernel (``missing`` when nothing serves the key)."""
        info = catalogue().info(key)
        found = computed.get(key)
        if found is None:
            return TableEntry(key, info.category, "missing", None, None, info.explanation)
        site, torch_kind, fallthrough = found
        non_functional = self.active.get(_NON_FUNCTIONAL)
        kind, alias, is_fallback = classify(
            torch_kind,
            fallthrough,
            site,
            lambda: non_functional.site if non_functional is not None else None,
        )
        registration = None if is_fallback else self.active.get(alias or key)
        source = self.kernel(registration).where if registration is not None else label_site(site)
        return TableEntry(
            key, info.category, kind, alias, site, info.explanation, source, is_fallback
        )


@functools.cache
def _filled_by(alias: str) -> list[str]:
    """The runtime keys a kernel registered to an alias key fills."""
    return [
        info.name for info in catalogue().runtime if dispatcher.alias_includes(alias, info.name)
    ]


def _kind(registration: Registration) -> str:
    if registration.fallthrough:
        return "fallthrough"
    located = parse_site(registration.site)
    filename = located[0] if located else ""
    if filename and filename == dispatcher.native_registry_file():
        return "torch._native router"
    return "Python" if filename.endswith(".py") or filename.startswith("<") else "C++"


def entry_text(entry: TableEntry) -> str:
    """A table entry in a few words: ``kernel · cell [3], line 6``, ``via Autograd · ...``,
    ``fallback · ...``, or ``no kernel``."""
    if entry.kind == "missing":
        return "no kernel"
    return f"{entry.kind_label} · {entry.source}" if entry.source else entry.kind_label
