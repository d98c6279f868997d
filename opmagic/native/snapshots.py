"""What a library registered: the dispatcher before and after, compared.

A snapshot holds, for every operator of the namespaces a library touches, its schema and
kernel registrations as the dispatcher reports them. The difference between the snapshot
taken before a library's init and the one after is what the library added: new operators
and new kernels (and which earlier kernels they override).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .._torch import dispatcher
from ..dispatch.sites import label_site, parse_site
from ..dispatch.table import parse_registrations


@dataclass(frozen=True)
class OperatorState:
    """An operator as the dispatcher knows it at one moment."""

    schema: str | None  # None: the name exists (kernels or holds) but nothing defines it
    def_site: str | None
    kernels: frozenset[tuple[str, bool, str, bool]]  # (key, is alias key, site, active)


Snapshot = dict[str, OperatorState]  # "ns::name" or "ns::name.overload" -> state


@dataclass(frozen=True)
class NewOperator:
    """An operator a library defined."""

    name: str  # "ns::name" or "ns::name.overload"
    schema: str
    line: int | None  # line of the defining block in the library's source


@dataclass(frozen=True)
class NewKernel:
    """A kernel a library registered for one operator and dispatch key."""

    op: str
    key: str  # a runtime key (CPU) or an alias key (Autograd, CompositeImplicitAutograd)
    is_alias: bool
    line: int | None  # line of the registering block in the library's source
    overrides: str | None = None  # the site of the kernel it replaced, if it replaced one
    overrides_source: str = field(init=False)  # that site for display, named when found

    def __post_init__(self) -> None:
        # named now, not when shown: a cell's site label goes when its library is replaced
        object.__setattr__(self, "overrides_source", label_site(self.overrides))


def snapshot(namespaces: Iterable[str]) -> Snapshot:
    """Schema and registrations of every operator in ``namespaces``."""
    prefixes = tuple(f"{ns}::" for ns in set(namespaces))
    if not prefixes:
        return {}
    return {
        name: _state(dispatcher.dump_registrations(name))
        for name in dispatcher.all_op_names()
        if name.startswith(prefixes)
    }


def _state(text: str) -> OperatorState:
    """An operator's state from its ``_dispatch_dump`` text."""
    return OperatorState(
        _header(text, "schema"),
        _header(text, "debug"),
        frozenset((r.key, r.is_alias, r.site, r.active) for r in parse_registrations(text)),
    )


def whole_dispatcher() -> dict[str, str]:
    """Every operator of every namespace, as the dispatcher prints its registrations: two of
    them tell what changed anywhere (about 0.3 s for torch's ~3,600 operators)."""
    return {name: dispatcher.dump_registrations(name) for name in dispatcher.all_op_names()}


def registrations_left(before: dict[str, str], after: dict[str, str]) -> dict[str, list[str]]:
    """What ``after`` (a :func:`whole_dispatcher`) has that ``before`` had not: per operator
    whose registrations differ, the sites of its definition and kernels that are new."""
    left: dict[str, list[str]] = {}
    for name in sorted(set(before) | set(after)):
        if before.get(name) == after.get(name):
            continue
        old, new = _sites(before.get(name)), _sites(after.get(name))
        added = [site for site in new if site not in old]
        gone = [f"(gone: {site})" for site in old if site not in new]
        if added or gone:  # not only the order or the flags of the same registrations
            left[name] = added + gone
    return left


def _sites(text: str | None) -> list[str]:
    """The registration sites in an operator's ``_dispatch_dump`` text (definition first)."""
    if text is None:
        return []
    state = _state(text)
    sites = [state.def_site, *(kernel[2] for kernel in sorted(state.kernels))]
    return list(dict.fromkeys(site for site in sites if site))


def _header(text: str, field: str) -> str | None:
    """A ``field: value`` header line of ``_dispatch_dump`` output (None for ``(none)``)."""
    for line in text.splitlines():
        if line.startswith(f"{field}: "):
            value = line[len(field) + 2 :].strip()
            return None if value in ("", "(none)") else value
    return None


def operators_added(before: Snapshot, after: Snapshot, site_file: str) -> tuple[NewOperator, ...]:
    """Operators with a schema after that had none before, in source order."""
    added = [
        NewOperator(name, state.schema, site_line(state.def_site, site_file))
        for name, state in after.items()
        if state.schema is not None and (name not in before or before[name].schema is None)
    ]
    return tuple(sorted(added, key=lambda op: (op.line or 0, op.name)))


def kernels_added(before: Snapshot, after: Snapshot, site_file: str) -> tuple[NewKernel, ...]:
    """Kernel registrations present after and not before, in source order."""
    added = []
    for name, state in after.items():
        old = before.get(name)
        old_kernels = old.kernels if old else frozenset()
        for key, is_alias, site, active in state.kernels - old_kernels:
            if not active and (key, is_alias, site, True) in old_kernels:
                continue  # an earlier kernel that this library's kernel made inactive
            overridden = next(
                (
                    s
                    for k, a, s, was_active in old_kernels
                    if (k, a) == (key, is_alias) and was_active
                ),
                None,
            )
            added.append(NewKernel(name, key, is_alias, site_line(site, site_file), overridden))
    return tuple(sorted(added, key=lambda k: (k.line or 0, k.op, k.key)))


def site_line(site: str | None, site_file: str) -> int | None:
    """The line of a registration site when it is in ``site_file``, else ``None``."""
    located = parse_site(site)
    return located[1] if located is not None and located[0] == site_file else None
