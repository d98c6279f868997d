"""``dispatch_table(op)``: what serves each runtime dispatch key of an operator.

Read from the live dispatcher (``_dispatch_dump_table`` for the computed table,
``_dispatch_dump`` for the raw registrations), then annotated with the key catalogue and,
for ``torch.library.custom_op`` operators, with the user's Python functions behind each kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._torch import custom_op_state, dispatcher, library_hooks, triton
from ..display import Displayable
from .keys import KeyInfo, catalogue
from .ops import OpRef, op_ref, overloads_of
from .sites import label_callable, label_site, parse_site

if TYPE_CHECKING:
    import pandas

    from ..view.diagram import Diagram

KINDS = (
    "kernel",
    "alias",
    "autograd",
    "fallback",
    "fallthrough",
    "stub",
    "ambiguous",
    "missing",
)
OWN_KINDS = ("kernel", "alias", "autograd", "stub", "ambiguous")  # the op's own registrations
KIND_TEXT = {
    "kernel": "kernel registered for this key",
    "alias": "kernel filled in from an alias key",
    "autograd": "autograd kernel (from the Autograd alias)",
    "fallback": "backend fallback (one kernel for every operator)",
    "fallthrough": "fallthrough: the dispatcher skips this key",
    "stub": "custom_op's Meta stub: no fake impl is registered, so a call reaching it raises",
    "ambiguous": "ambiguous: CompositeImplicitAutograd plus a backend kernel (raises)",
    "missing": "no kernel: a call that reaches this key fails",
}

# dumpComputedTable's labels -> (kind, alias that served it)
_TORCH_KIND = {
    "kernel": ("kernel", None),
    "default backend kernel": ("alias", "CompositeExplicitAutograd"),
    "math kernel": ("alias", "CompositeImplicitAutograd"),
    "nested kernel": ("alias", "CompositeImplicitAutogradNestedTensor"),
    "batched kernel": ("alias", "FuncTorchBatchedDecomposition"),
    "autograd kernel": ("autograd", "Autograd"),
    "backend fallback": ("fallback", None),
    "ambiguous autogradother": ("ambiguous", None),
}


@dataclass(frozen=True)
class TableEntry:
    """What serves one runtime key of an operator's dispatch table."""

    key: str
    category: str
    kind: str  # one of KINDS
    alias: str | None  # the alias key that filled the slot ("alias"/"autograd" kinds)
    site: str | None  # the registration site torch recorded ("registered at FILE:LINE")
    explanation: str  # what the key is for (from the catalogue)
    impl: str | None = None  # the Python function behind the kernel, when opmagic can tell
    is_fallback: bool = False  # the kernel is the key's process-wide backend fallback
    source: str = field(init=False)  # for display: the function, else the registration site

    def __post_init__(self) -> None:
        # named now, not when shown: a cell's site label changes as cells re-run or unload
        object.__setattr__(self, "source", self.impl or label_site(self.site))

    @property
    def has_kernel(self) -> bool:
        """Whether a call reaching this key runs something (not missing, not skipped)."""
        return self.kind not in ("missing", "fallthrough")

    @property
    def is_own(self) -> bool:
        """Whether the op's own registrations serve this key (not a process-wide fallback or
        fallthrough, not nothing)."""
        return self.kind in OWN_KINDS or (self.kind == "fallthrough" and not self.is_fallback)

    @property
    def kind_label(self) -> str:
        """A short kind label for tables: ``kernel``, ``via Autograd``, ``fallback``, ..."""
        if self.kind in ("alias", "autograd"):
            return f"via {self.alias}"
        if self.kind == "fallthrough":
            return "fallthrough" if self.is_fallback else "fallthrough kernel"
        if self.kind == "ambiguous":
            return "ambiguous (raises)"
        if self.kind == "stub":
            return "stub: raises (no fake impl)"
        return self.kind

    @property
    def kind_text(self) -> str:
        """One line on the kind, naming the alias when there is one."""
        if self.kind == "alias":
            return f"kernel from the {self.alias} alias"
        if self.kind == "fallthrough":
            return "fallthrough (backend fallback)" if self.is_fallback else "fallthrough (kernel)"
        return KIND_TEXT[self.kind]


@dataclass(frozen=True)
class Registration:
    """One kernel registration as the user (or torch) made it, before alias resolution."""

    key: str
    is_alias: bool
    site: str
    active: bool  # False when a later registration to the same key overrides it
    signature: str | None = None
    fallthrough: bool = False  # a fallthrough kernel: the dispatcher skips the key
    source: str = field(init=False)  # the site shortened for display, named when read

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", label_site(self.site))


@dataclass(frozen=True)
class DispatchTable(Displayable):
    """An operator's dispatch table: one entry per runtime key, in priority order."""

    op: str  # "ns::name" or "ns::name.overload"
    schema: str
    entries: tuple[TableEntry, ...]
    registrations: tuple[Registration, ...]
    _by_key: dict[str, TableEntry] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._by_key.update({e.key: e for e in self.entries})

    def __getitem__(self, key: str) -> TableEntry:
        """The entry of one runtime key (``table["CPU"]``)."""
        try:
            return self._by_key[key]
        except KeyError:
            raise KeyError(
                f"{key!r} is not a runtime dispatch key of this torch; alias keys such as "
                "'Autograd' are resolved into runtime keys (look at table.registrations)."
            ) from None

    def kernels(self) -> list[TableEntry]:
        """Entries that run something: kernels, alias kernels, autograd kernels and fallbacks."""
        return [e for e in self.entries if e.has_kernel]

    def frame(self) -> pandas.DataFrame:
        """The table as a DataFrame, a row per runtime key (missing keys included)."""
        return self.view("frame")

    def diagram(self, show_all: bool = False) -> Diagram:
        """The table as a Graphviz diagram; ``show_all`` draws keys without a kernel of the
        op's own (fallbacks, fallthroughs, missing) too."""
        return self.view("diagram", show_all=show_all)


@dataclass(frozen=True)
class OverloadTables(Displayable):
    """The dispatch tables of every overload of one operator packet."""

    op: str
    tables: tuple[DispatchTable, ...]

    def __getitem__(self, overload: str) -> DispatchTable:
        """The table of one overload, by name (``"default"`` for the default one)."""
        wanted = "" if overload == "default" else overload
        for table in self.tables:
            if table.op.partition(".")[2] == wanted:
                return table
        raise KeyError(f"{self.op} has no overload {overload!r}")

    def __iter__(self):
        return iter(self.tables)

    def __len__(self) -> int:
        return len(self.tables)


def dispatch_table(op: Any, *, all_overloads: bool = False) -> DispatchTable | OverloadTables:
    """The dispatch table of an operator.

    ``op`` names one overload (``"aten::add.Tensor"``, an OpOverload, a custom op) or a
    packet (``"aten::add"``, ``torch.ops.aten.add``, or a torch function or Tensor method
    standing for one: ``torch.add``, ``torch.Tensor.add``). A packet gives its default overload's
    table when it has one, else (or with ``all_overloads=True``) an :class:`OverloadTables`.
    """
    ref = op_ref(op)
    if ref.overload is None:
        overloads = overloads_of(ref)
        if all_overloads or "" not in overloads:
            return OverloadTables(
                ref.qualname, tuple(table_for(ref.with_overload(o)) for o in overloads)
            )
        ref = ref.with_overload("")
    return table_for(ref)


def table_for(ref: OpRef) -> DispatchTable:
    """The table of one resolved overload."""
    return OperatorTable(ref).table()


class OperatorTable:
    """One overload's computed dispatch table, read once and turned into entries on demand.

    :func:`table_for` builds every entry from it; ``resolve`` needs only the entries on its
    path and the fallthrough keys, and ``kernels`` only alias sites, so they use it directly
    instead of building a whole :class:`DispatchTable`.
    """

    def __init__(self, ref: OpRef) -> None:
        self.ref = ref
        self.schema_obj = dispatcher.find_schema(ref.qualname, ref.overload or "")
        self.schema = str(self.schema_obj)
        self._computed = parse_computed_table(dispatcher.dump_table(ref.dispatcher_name))
        self._registrations_dump: str | None = None
        self._registrations: list[Registration] | None = None
        self._describe = _custom_op_describer(ref.qualname)
        self._entries: dict[str, TableEntry] = {}
        self._alias_sites: dict[str, str | None] = {}

    @property
    def registrations_dump(self) -> str:
        """torch's dump of the raw registrations (read on first use)."""
        if self._registrations_dump is None:
            self._registrations_dump = dispatcher.dump_registrations(self.ref.dispatcher_name)
        return self._registrations_dump

    @property
    def registrations(self) -> list[Registration]:
        """The raw registrations (parsed on first use)."""
        if self._registrations is None:
            self._registrations = parse_registrations(self.registrations_dump)
        return self._registrations

    def table(self) -> DispatchTable:
        """Every runtime key's entry (and ``Undefined``'s) as a :class:`DispatchTable`; the
        entries made already (``resolve``'s path) are the same objects."""
        entries = [self.entry(info.name) for info in catalogue().runtime]
        entries.append(self.entry("Undefined"))
        return DispatchTable(
            self.ref.dispatcher_name, self.schema, tuple(entries), tuple(self.registrations)
        )

    def alias_site(self, alias: str) -> str | None:
        """The site of the active kernel registered to an alias key, if there is one."""
        if alias not in self._alias_sites:
            self._alias_sites[alias] = alias_site_in(self.registrations_dump, alias)
        return self._alias_sites[alias]

    def has_alias_kernel(self, alias: str) -> bool:
        """Whether a kernel is registered (and active) for an alias key."""
        return self.alias_site(alias) is not None

    def entry(self, key: str) -> TableEntry:
        """The table entry of one runtime key (or ``Undefined``)."""
        if key not in self._entries:
            info = catalogue().info(key)
            self._entries[key] = self._make_entry(info, self._computed.get(key))
        return self._entries[key]

    def fallthrough_mask(self, keyset: int) -> int:
        """Functionality bits to drop for ``keyset``: the op's fallthrough keys for its backend.

        Mirrors ``DispatchKeyExtractor::nonFallthroughKeysPerBackend_``: a per-backend key
        (e.g. AutogradXLA) only counts when the keyset's backend is that backend.
        """
        key_catalogue = catalogue()
        backend = key_catalogue.backend_of(keyset)
        mask = 0
        for key, (_, _, fallthrough) in self._computed.items():
            if not fallthrough or key not in key_catalogue.by_name:
                continue
            info = key_catalogue.by_name[key]
            if info.backend is None or info.backend == backend:
                mask |= info.raw & ~key_catalogue.backend_mask
        return mask

    def _make_entry(self, info: KeyInfo, computed: tuple[str, str, bool] | None) -> TableEntry:
        if computed is None:
            return TableEntry(info.name, info.category, "missing", None, None, info.explanation)
        site, torch_kind, fallthrough = computed
        kind, alias, is_fallback = classify(
            torch_kind,
            fallthrough,
            site,
            lambda: self.alias_site("CompositeExplicitAutogradNonFunctional"),
        )
        impl = self._describe(info, kind, site) if self._describe else None
        if impl is None and kind == "kernel":
            impl = python_kernel_label(self.ref, info.name, site)
        if info.name == "Meta" and kind == "kernel" and is_meta_stub(self.ref, site):
            kind = "stub"
        return TableEntry(
            info.name, info.category, kind, alias, site, info.explanation, impl, is_fallback
        )


def classify(
    torch_kind: str,
    fallthrough: bool,
    site: str,
    non_functional_site: Callable[[], str | None],
) -> tuple[str, str | None, bool]:
    """``(kind, alias, is_fallback)`` of a computed entry from torch's label for it.

    torch labels kernels from CompositeExplicitAutograd and from its NonFunctional variant
    both "default backend kernel"; the registration site tells them apart:
    ``non_functional_site()`` is the site of the op's NonFunctional kernel, if it has one.
    """
    kind, alias = _TORCH_KIND.get(torch_kind, ("kernel", None))
    if alias == "CompositeExplicitAutograd" and non_functional_site() == site:
        alias = "CompositeExplicitAutogradNonFunctional"
    is_fallback = kind == "fallback"
    return ("fallthrough" if fallthrough else kind), alias, is_fallback


def python_kernel_label(ref: OpRef, key: str, site: str) -> str | None:
    """``meta_mm (torch/_meta_registrations.py:2511)`` for a kernel a Python Library
    registered (its site is the Library's line) when the op names the function itself."""
    located = parse_site(site)
    if located is None or not located[0].endswith(".py"):
        return None
    function = dispatcher.python_kernel(ref.op_overload(), key)
    return label_callable(function) if function is not None else None


def is_meta_stub(ref: OpRef, site: str) -> bool:
    """Whether the Meta kernel registered at ``site`` is ``custom_op``'s stub, which raises
    because the op has no fake impl (and custom_op cannot generate one: it returns something)."""
    opdef = custom_op_state.custom_op_def(ref.qualname)
    if opdef is None or custom_op_state.custom_op_parts(opdef)["fake"] is not None:
        return False
    if "custom_ops.py" not in site and site not in library_hooks.custom_op_sites(opdef):
        return False
    return not custom_op_state.custom_op_can_fake_trivially(ref.op_overload())


def parse_computed_table(
    text: str, only: set[str] | frozenset[str] | None = None
) -> dict[str, tuple[str, str, bool]]:
    """``key -> (site, torch's kind label, is_fallthrough)`` from ``_dispatch_dump_table``.

    The one parser of computed tables: :class:`OperatorTable` reads one operator's,
    ``kernels()`` every operator's.

    Lines read ``Key: [fallthrough ]registered at FILE:LINE [kind]``; parsed with string
    methods, and only for the keys in ``only`` when given, because ``kernels()`` parses
    every operator's table.
    """
    out = {}
    for line in text.split("\n"):
        key, _, rest = line.partition(": ")
        if only is not None and key not in only:
            continue
        cut = rest.rfind(" [")
        if cut < 0 or not rest.endswith("]"):
            continue
        site = rest[:cut]
        fallthrough = site.startswith("fallthrough ")
        out[key] = (site[12:] if fallthrough else site, rest[cut + 2 : -1], fallthrough)
    return out


def parse_registrations(text: str) -> list[Registration]:
    """Kernel registrations from ``_dispatch_dump`` (its header lines are skipped)."""
    registrations = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.split(":", 1)[0] in ("name", "schema", "debug", "alias analysis kind"):
            continue
        registration = _registration(line)
        if registration is not None:
            registrations.append(registration)
    return registrations


def alias_site_in(dump: str, alias: str) -> str | None:
    """The site of the active kernel registered to the alias key ``alias``, from an
    operator's ``_dispatch_dump``; only its line is parsed (``kernels()`` asks this of
    hundreds of operators)."""
    start = dump.find(f"\n{alias}[alias]: ") + 1  # an inactive one reads "[alias] (inactive)"
    if start == 0:
        return None
    end = dump.find("\n", start)
    registration = _registration(dump[start:] if end < 0 else dump[start:end])
    return registration.site if registration is not None else None


def definition_site(op_name: str) -> str | None:
    """Where an operator's schema was defined, as torch records it (``registered at FILE:LINE``),
    from the ``debug:`` line of its raw registrations."""
    for line in dispatcher.dump_registrations(op_name).splitlines():
        if line.startswith("debug: "):
            return line.removeprefix("debug: ").strip() or None
    return None


def _registration(line: str) -> Registration | None:
    """One ``KEY[alias] (inactive): SITE :: SIGNATURE [ FLAGS ]`` line (every part after the
    key's optional), read with string methods: a regular expression took six times as long,
    and every table, resolution and library load reads these."""
    head, colon, rest = line.partition(": ")
    inactive = head.endswith(" (inactive)")
    head = head.removesuffix(" (inactive)")
    is_alias = head.endswith("[alias]")
    key = head.removesuffix("[alias]")
    if not colon or not key.isidentifier():
        return None
    flags = ""
    if rest.endswith(" ]") and (cut := rest.rfind(" [ ")) >= 0:
        rest, flags = rest[:cut], rest[cut + 3 : -2]  # the kernel's flags
    site, _, signature = rest.partition(" :: ")
    fallthrough = "fallthrough" in flags.split()
    return Registration(key, is_alias, site, not inactive, signature or None, fallthrough)


def _custom_op_describer(qualname: str) -> Any:
    """For ``torch.library.custom_op`` ops: a function naming the user code behind an entry."""
    opdef = custom_op_state.custom_op_def(qualname)
    if opdef is None:
        return None
    parts = custom_op_state.custom_op_parts(opdef)
    own_sites = library_hooks.custom_op_sites(opdef)  # where an opmagic session recorded them

    def describe(info: KeyInfo, kind: str, site: str) -> str | None:
        if "custom_ops.py" not in site and site not in own_sites:
            return None
        if info.name == "Meta":
            fake = parts["fake"]
            if fake is not None:
                return f"custom_op fake impl {label_callable(fake)}"
            if kind == "kernel" and is_meta_stub(op_ref(qualname), site):
                return "no fake impl: register one with register_fake"
            return "custom_op fake impl: generated (the op returns nothing)"
        if kind == "alias" or info.category == "backend":
            device = (
                info.backend.lower() if info.functionality == "Dense" and info.backend else None
            )
            fn = parts["device_kernels"].get(device) if kind == "kernel" else None
            fn = fn or parts["device_kernels"].get(None) or parts["impl"]
            launcher = triton.triton_op_launcher(fn)
            if launcher is not None:
                kernels = [
                    label_callable(triton.kernel_function(k))
                    for k in triton.launched_kernels(launcher)
                ]
                launching = f" launching {', '.join(kernels)}" if kernels else ""
                return f"triton_op launcher {label_callable(launcher)}{launching}"
            user_function = custom_op_state.unwrap_registered_function(fn)
            return f"custom_op impl {label_callable(user_function)}"
        if info.category == "autograd":
            backward = parts["backward"]
            return (
                f"custom_op backward {label_callable(backward)}"
                if backward is not None
                else "custom_op autograd without a backward (register_autograd)"
            )
        if info.name == "BackendSelect":
            return "custom_op device router (picks the kernel from the device argument)"
        if info.category == "autocast":
            dtype = parts["autocast"].get(info.name.removeprefix("Autocast").lower())
            return f"custom_op autocast rule (casts floating inputs to {dtype})"
        if info.functionality == "FuncTorchBatched" and parts["vmap"] is not None:
            return f"custom_op vmap rule {label_callable(parts['vmap'])}"
        return None

    return describe
