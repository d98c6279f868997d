"""``kernels(namespace, keys)``: which kernels serve which keys, for many operators at once."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .._torch import custom_op_state, dispatcher
from ..errors import (
    ArgumentTypeError,
    OpmagicError,
    UnknownDispatchKeyError,
    is_list_of_values,
)
from .keys import catalogue
from .ops import op_ref
from .sites import label_site
from .table import (
    alias_site_in,
    classify,
    is_meta_stub,
    parse_computed_table,
    python_kernel_label,
)

if TYPE_CHECKING:
    import pandas

DEFAULT_KEYS = (
    "CPU",
    "CUDA",
    "Meta",
    "SparseCPU",
    "SparseCUDA",
    "NestedTensorCPU",
    "NestedTensorCUDA",
    "QuantizedCPU",
    "BackendSelect",
    "Python",
    "Functionalize",
    "ADInplaceOrView",
    "AutogradCPU",
    "AutogradCUDA",
    "AutocastCPU",
    "AutocastCUDA",
    "FuncTorchBatched",
)
LONG_COLUMNS = ["op", "overload", "key", "kind", "alias", "source"]


def kernels(
    namespace: str | None = None,
    keys: Iterable[str] | str | None = None,
    *,
    wide: bool = False,
    missing: str | None = None,
) -> pandas.DataFrame:
    """Kernels per dispatch key for every operator of a namespace (or of the whole process).

    Long form (default): a row per (operator overload, key) that has an operator-specific
    kernel: registered for the key, filled from an alias key (``alias`` says which), or a
    fallthrough registered for the op. Process-wide fallbacks (fallthrough or not) and
    missing kernels are left out.

    ``wide=True``: a row per operator overload and a column per key, each cell the kind
    that serves it (``kernel``, ``alias:CompositeExplicitAutograd``, ``autograd``,
    ``fallback``, ``fallthrough``, ``missing``), e.g. ``df[df["Meta"].isin(["missing",
    "fallback"])]`` lists ops without a Meta kernel.

    ``keys``: runtime key names, ``"all"`` for every runtime key, or ``None`` for
    :data:`DEFAULT_KEYS` (common backends, autograd, autocast, functorch and Python keys).

    ``missing``: a runtime key; only operators without a kernel of their own for it (no
    kernel, only the process-wide fallback, or a fallthrough) are listed, and the key is
    added to ``keys`` when it is not there.
    """
    import pandas as pd

    for what, value in (("namespace", namespace), ("missing", missing)):
        if value is not None and not isinstance(value, str):
            raise ArgumentTypeError(f"kernels: {what} must be a str or None, got {value!r}.")
    wanted = _keys(keys)
    if missing is not None and missing not in wanted:
        wanted += _keys([missing])
    only = frozenset(wanted)
    with_non_functional = set(
        dispatcher.registrations_for_key("CompositeExplicitAutogradNonFunctional")
    )
    non_functional_sites: dict[str, str | None] = {}

    def non_functional_site(name: str) -> str | None:
        """Where ``name``'s CompositeExplicitAutogradNonFunctional kernel was registered."""
        if name not in with_non_functional:
            return None
        if name not in non_functional_sites:
            non_functional_sites[name] = alias_site_in(
                dispatcher.dump_registrations(name), "CompositeExplicitAutogradNonFunctional"
            )
        return non_functional_sites[name]

    sites: dict[str, str] = {}
    rows: list[tuple] = []
    cells: list[list[str]] = []
    for name in _op_names(namespace):
        qualname, _, overload = name.partition(".")
        computed = parse_computed_table(dispatcher.dump_table(name), only)
        if missing is not None and _has_own_kernel(name, missing, computed.get(missing)):
            continue
        if wide:
            cells.append([qualname, overload or "default"])
        for key in wanted:
            found = computed.get(key)
            if found is None:
                if wide:
                    cells[-1].append("missing")
                continue
            site, torch_kind, fallthrough = found
            kind, alias, is_fallback = classify(
                torch_kind, fallthrough, site, functools.partial(non_functional_site, name)
            )
            if key == "Meta" and kind == "kernel" and _is_stub(qualname, name, site):
                kind = "stub"
            if wide:
                cells[-1].append(f"alias:{alias}" if kind == "alias" else kind)
            elif not is_fallback:
                source = _python_source(name, key, site) if ".py:" in site else None
                if source is None:
                    if site not in sites:
                        sites[site] = label_site(site)
                    source = sites[site]
                rows.append((qualname, overload or "default", key, kind, alias, source))
    if wide:
        frame = pd.DataFrame(cells, columns=["op", "overload", *wanted])
        return frame.set_index(["op", "overload"]).sort_index()
    frame = pd.DataFrame(rows, columns=LONG_COLUMNS)
    return frame.sort_values(["op", "overload", "key"], kind="stable").reset_index(drop=True)


def _has_own_kernel(name: str, key: str, computed: tuple[str, str, bool] | None) -> bool:
    """Whether ``key`` has a working kernel of the operator's own (no fallback, no skip).

    A ``torch.library.custom_op`` always registers a Meta kernel, which raises when the op
    has no fake impl: that stub does not count, as ``resolve`` predicts it fails.
    """
    if computed is None:
        return False
    site, torch_kind, fallthrough = computed
    kind, _, is_fallback = classify(torch_kind, fallthrough, site, lambda: None)
    if is_fallback or kind == "fallthrough":
        return False
    return not (key == "Meta" and _is_stub(name.partition(".")[0], name, site))


def _is_stub(qualname: str, name: str, site: str) -> bool:
    """Whether the Meta kernel of op ``name`` at ``site`` is custom_op's raising stub."""
    if custom_op_state.custom_op_def(qualname) is None:  # the cheap test first
        return False
    return is_meta_stub(op_ref(name), site)


def _python_source(name: str, key: str, site: str) -> str | None:
    """The function behind a kernel a Python Library registered (e.g. a Python Meta kernel)."""
    return python_kernel_label(op_ref(name), key, site)


def _keys(keys: Iterable[str] | str | None) -> list[str]:
    key_catalogue = catalogue()
    if keys is None:
        return [k for k in DEFAULT_KEYS if k in key_catalogue.by_name]
    if isinstance(keys, str):
        if keys == "all":
            keys = list(key_catalogue.by_name)
        else:
            keys = [k.strip() for k in keys.split(",")]
    if not is_list_of_values(keys):
        raise ArgumentTypeError(f"kernels: keys must be key names or 'all', got {keys!r}.")
    wanted = list(keys)
    if not all(isinstance(k, str) for k in wanted):
        raise ArgumentTypeError(f"kernels: keys must be key names (str), got {wanted!r}.")
    unknown = [k for k in wanted if k not in key_catalogue.by_name]
    if unknown:
        aliases = [k for k in unknown if k in key_catalogue.aliases]
        hint = (
            f" {', '.join(map(repr, aliases))} "
            f"{'is an alias key' if len(aliases) == 1 else 'are alias keys'}:"
            " ask for the runtime keys it fills (e.g. CPU, AutogradCPU)."
            if aliases
            else " Runtime keys look like CPU, CUDA, Meta, AutogradCPU, AutocastCUDA, Python."
        )
        raise UnknownDispatchKeyError(
            f"Unknown dispatch key {', '.join(map(repr, unknown))}.{hint}"
        )
    return wanted


def _op_names(namespace: str | None) -> list[str]:
    names = dispatcher.all_op_names()
    if namespace is None:
        return sorted(names)
    prefix = namespace.rstrip(":") + "::"
    selected = sorted(n for n in names if n.startswith(prefix))
    if not selected:
        namespaces = sorted({n.split("::", 1)[0] for n in names})
        raise OpmagicError(
            f"No operators in namespace {namespace!r}. Namespaces with operators: "
            f"{', '.join(namespaces)}."
        )
    return selected
