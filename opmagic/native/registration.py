"""Registering a loaded library's blocks in the dispatcher, in place of the one it replaces.

:func:`register` runs the library's registration entry point (the preamble's
``opmagic_init``) and compares the dispatcher before and after to say what it added. A
library that replaces an earlier version of the same code takes its place in one step:
the earlier version is unregistered first and registered again if the new one fails, so a
failing cell leaves the previous state.

While a library is registered, the registration sites torch records in its source
(``registered at /…/myops.cpp:6``) are named as the user sees that source (``cell [3],
line 6``): each :class:`Registration` holds an entry in :data:`SITE_LABELS` from
:func:`register` until it ends.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .._torch import dispatcher
from ..dispatch.sites import add_labeler, remove_labeler
from ..errors import RegistrationError
from .diagnostics import where
from .loader import NativeLibrary
from .snapshots import (
    NewKernel,
    NewOperator,
    kernels_added,
    operators_added,
    snapshot,
)

_SIGNATURE_CHANGED = "Mismatch in kernel C++ signatures"
_SITE_IN_TEXT = re.compile(r"(?P<file>/[^\s:]+):(?P<line>\d+)")


@dataclass(frozen=True)
class SourceSite:
    """A library's source: the file torch names in its registration sites, and how the user
    sees it (``label``, and the number its first line has there)."""

    file: Path  # the source as compiled, in the published build
    label: str  # "cell [3]", "myops.cpp"
    first_line: int

    def where(self, line: int | None) -> str:
        """A line of the source as the user sees it: ``cell [3], line 6``."""
        return where(self.label, line, self.first_line)


@dataclass(eq=False)
class Registration:
    """A library's blocks as registered in the dispatcher (until :meth:`close`), and what
    they added to it."""

    native: NativeLibrary
    site: SourceSite
    operators: tuple[NewOperator, ...] = ()
    kernels: tuple[NewKernel, ...] = ()
    active: bool = True

    @property
    def namespaces(self) -> set[str]:
        """Namespaces whose operators the blocks may register (not ``_``: fallbacks)."""
        return {b.namespace for b in self.native.blocks if b.namespace != "_"}

    def close(self) -> None:
        """Remove every operator and kernel the blocks registered (idempotent).

        The code stays mapped (tensors or autograd graphs may still point into it); only
        the registrations go, and ``torch.ops`` forgets the operators they defined.
        """
        if not self.active:
            return
        self.native.fini()
        self._ended()
        dispatcher.refresh_operators([op.name for op in self.operators])

    def _ended(self) -> None:
        """The blocks are no longer registered: their sites lose their names."""
        self.active = False
        SITE_LABELS.remove(self)


class SiteLabels:
    """Names of registration sites in the sources of the libraries registered now.

    An entry per :class:`Registration` in effect (for a source file two of them share, the
    newest names it); while there are entries, :mod:`opmagic.dispatch.sites` asks here first.
    """

    def __init__(self) -> None:
        self._sites: dict[Registration, SourceSite] = {}  # oldest first

    def add(self, registration: Registration) -> None:
        """Name the sites in ``registration``'s source from now on."""
        self._sites[registration] = registration.site
        add_labeler(self.label)

    def remove(self, registration: Registration) -> None:
        """Stop naming the sites of ``registration`` (a no-op when it has no entry)."""
        self._sites.pop(registration, None)
        if not self._sites:
            remove_labeler(self.label)

    def label(self, filename: str, line: int) -> str | None:
        """``cell [3], line 6`` for a site in a registered library's source, else ``None``."""
        for site in reversed(self._sites.values()):
            if str(site.file) == filename:
                return site.where(line)
        return None

    def relabel(self, text: str) -> str:
        """torch's message with the ``FILE:LINE`` sites of registered sources named."""
        return _SITE_IN_TEXT.sub(lambda m: self.label(m["file"], int(m["line"])) or m[0], text)


SITE_LABELS = SiteLabels()


def register(
    native: NativeLibrary, site: SourceSite, replace: Registration | None
) -> Registration:
    """Register ``native``'s blocks in place of ``replace``; what they added to the dispatcher.

    The operators of the replaced library are held in the dispatcher meanwhile, so handles
    to them (a ``static`` typed handle in another library) stay valid across the swap,
    unless a kernel's C++ signature changes. If the new registration fails, the replaced
    library is registered again and :class:`RegistrationError` names the failing block.
    """
    if not native.blocks:
        raise RegistrationError(
            f"{site.label} has no registration block (TORCH_LIBRARY, TORCH_LIBRARY_FRAGMENT, "
            "TORCH_LIBRARY_IMPL, or their STABLE_TORCH_LIBRARY* forms for the stable ABI): "
            "there is nothing to register."
        )
    previous = replace if replace is not None and replace.active else None
    registration = Registration(native, site)
    namespaces = registration.namespaces
    if previous is not None:
        namespaces |= previous.namespaces
    release = dispatcher.hold_operators(_names_in(namespaces)) if previous is not None else None
    redefined = [op.name for op in previous.operators] if previous is not None else []
    site_file = str(site.file)
    SITE_LABELS.add(registration)
    try:
        if previous is not None:
            previous.native.fini()
        before = snapshot(namespaces)
        failure = native.init(site_file)
        if failure is not None and release is not None and _SIGNATURE_CHANGED in failure[0]:
            # a held entry remembers its kernels' old C++ signature: let the entries go
            # (handles to them were typed for the old signature anyway) and register afresh
            release()
            release = None
            failure = native.init(site_file)
        if failure is not None:
            raise _registration_error(failure, registration, previous)
        after = snapshot(namespaces)
        registration.operators = operators_added(before, after, site_file)
        redefined += [op.name for op in registration.operators]
        if previous is not None:
            previous._ended()
    finally:
        if release is not None:
            release()
        # torch.ops caches a packet per operator: drop those whose definition changed (only
        # those: torch keys tables by the packets of operators it owns, aten's included)
        dispatcher.refresh_operators(redefined)
    registration.kernels = kernels_added(before, after, site_file)
    return registration


def _registration_error(
    failure: tuple[str, int], registration: Registration, previous: Registration | None
) -> RegistrationError:
    """The error for a failed registration, after putting the previous version back."""
    message, line = failure
    text = f"{registration.site.where(line)}: {SITE_LABELS.relabel(message)}"
    registration._ended()
    if previous is not None:
        restored = previous.native.init(str(previous.site.file))
        if restored is None:
            text += f"\nThe previous version ({previous.site.label}) is registered again."
        else:
            previous._ended()
            text += f"\nThe previous version could not be registered again: {restored[0]}"
    return RegistrationError(text, line=line, signature_changed=_SIGNATURE_CHANGED in message)


def _names_in(namespaces: Iterable[str]) -> list[str]:
    """Every operator name (with overload) the dispatcher knows in ``namespaces``."""
    prefixes = tuple(f"{ns}::" for ns in namespaces)
    return [n for n in dispatcher.all_op_names() if n.startswith(prefixes)] if prefixes else []
