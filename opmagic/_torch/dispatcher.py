"""Private torch APIs that read the dispatcher: keysets, thread-local state, tables, schemas.

A new torch release that renames or changes one of these breaks this module alone;
tests/_torch/ exercises each function so a failure names the shim. Keysets cross this
boundary as plain ``int`` raw representations (``DispatchKeySet.raw_repr``).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

_C = torch._C

# The classes of ``torch.ops.ns.name`` (a packet) and ``torch.ops.ns.name.overload``: torch
# exports them from a private module only.
OpOverload = torch._ops.OpOverload
OpOverloadPacket = torch._ops.OpOverloadPacket


# ---------------------------------------------------------------- dispatch keys


def full_keyset_raw() -> int:
    """Raw bits of every runtime dispatch key of this torch build."""
    return _C._dispatch_keyset_full().raw_repr()


def num_backends() -> int:
    """Number of backend-component bits at the bottom of a raw keyset."""
    return _C._dispatch_num_backends()


def keyset_names(raw: int) -> list[str]:
    """Runtime key names of a raw keyset, lowest priority first (torch's own spelling)."""
    text = str(_C.DispatchKeySet.from_raw_repr(raw))
    inner = text[text.index("(") + 1 : text.rindex(")")]
    return [name for name in inner.split(", ") if name]


@functools.cache
def full_after_raw(functionality: str) -> int:
    """``DispatchKeySet(FULL_AFTER, key)``: the mask a kernel uses to redispatch below ``key``."""
    key = _C._parse_dispatch_key(functionality)
    if key is None:
        raise KeyError(functionality)
    return _C._dispatch_keyset_full_after(key).raw_repr()


def single_key_raw(name: str) -> int | None:
    """Raw bits of ``DispatchKeySet(name)`` when torch can parse the name, else ``None``."""
    key = _C._parse_dispatch_key(name)
    return None if key is None else _C.DispatchKeySet(key).raw_repr()


def after_autograd_raw() -> int:
    """``c10::after_autograd_keyset``: what autograd kernels redispatch to."""
    return _C._after_autograd_keyset.raw_repr()


def after_ad_inplace_or_view_raw() -> int:
    """``c10::after_ADInplaceOrView_keyset``: what the autograd fallback redispatches to."""
    return _C._after_ADInplaceOrView_keyset.raw_repr()


def is_alias_key(name: str) -> bool:
    """Whether ``name`` is an alias key (Autograd, CompositeImplicitAutograd, ...)."""
    key = _C._parse_dispatch_key(name)
    return key is not None and _C._dispatch_is_alias_key(key)


def dispatch_key_names() -> list[str]:
    """Every name of the ``DispatchKey`` enum (runtime, alias and per-backend keys)."""
    return list(_C.DispatchKey.__members__)


def dispatch_key_for_device(device_type: str) -> str:
    """The Dense runtime key of a device type (``'cuda'`` -> ``'CUDA'``)."""
    return _C._dispatch_key_for_device(device_type)


# ---------------------------------------------------------------- thread-local state


def tls_included_raw() -> int:
    """The thread-local dispatch include set, as raw bits."""
    return _C._dispatch_tls_local_include_set().raw_repr()


def tls_excluded_raw() -> int:
    """The thread-local dispatch exclude set, as raw bits."""
    return _C._dispatch_tls_local_exclude_set().raw_repr()


def tensor_keyset_raw(tensor: torch.Tensor) -> int:
    """The dispatch keyset a tensor contributes to a call (``TensorImpl::key_set``)."""
    return _C._dispatch_keys(tensor).raw_repr()


def dispatch_modes() -> list[Any]:
    """The TorchDispatchMode stack, innermost (the one that runs first) last."""
    return [_C._get_dispatch_stack_at(i) for i in range(_C._len_torch_dispatch_stack())]


def torch_function_disabled() -> Any:
    """A guard under which ``__torch_function__`` (modes and subclasses) is not consulted, so
    reading a tensor's attributes runs no user code."""
    return _C.DisableTorchFunction()


def autograd_fallback_mode() -> str:
    """What the autograd fallback does for ops with no autograd kernel (``warn``, ``nothing``)."""
    return _C._get_autograd_fallback_mode()


def functorch_layers() -> list[tuple[str, int]]:
    """The torch.func transform stack, outermost first, as ``(transform, level)`` pairs."""
    stack = _C._functorch.get_interpreter_stack() or []
    return [(interp.key().name, interp.level()) for interp in stack]


def batched_level(tensor: torch.Tensor) -> int | None:
    """The vmap level of a BatchedTensor, or ``None`` for any other tensor."""
    if not _C._functorch.is_batchedtensor(tensor):
        return None
    return _C._functorch.maybe_get_level(tensor)


def unwrap_functorch(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor one functorch wrapper (BatchedTensor, GradWrapper) holds."""
    return _C._functorch.get_unwrapped(tensor)


def grad_wrapper_level(tensor: torch.Tensor) -> int | None:
    """The level of a torch.func.grad/jvp TensorWrapper, or ``None`` for other tensors."""
    if not _C._functorch.is_gradtrackingtensor(tensor):
        return None
    return _C._functorch.maybe_get_level(tensor)


def wrap_for_grad(tensor: torch.Tensor, level: int) -> torch.Tensor:
    """A TensorWrapper at ``level`` around ``tensor``, as a grad/jvp layer makes for its inputs."""
    return _C._functorch._wrap_for_grad(tensor, level)


def is_grad_wrapper(tensor: torch.Tensor) -> bool:
    """Whether a tensor is a torch.func.grad/jvp TensorWrapper."""
    return _C._functorch.is_gradtrackingtensor(tensor)


def is_functional_tensor(tensor: torch.Tensor) -> bool:
    """Whether a tensor is a C++ FunctionalTensorWrapper (functionalization)."""
    return torch._is_functional_tensor(tensor)


def unwrap_functional(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor a FunctionalTensorWrapper holds."""
    return torch._from_functional_tensor(tensor)


# ---------------------------------------------------------------- operators


def all_op_names() -> list[str]:
    """Every operator the dispatcher knows, as ``ns::name`` or ``ns::name.overload``."""
    return _C._dispatch_get_all_op_names()


def has_operator(name: str) -> bool:
    """Whether the dispatcher has ``ns::name`` or ``ns::name.overload``: defined, or only
    holding kernels registered without a definition (``c10::Dispatcher::findOp``)."""
    return _C._dispatch_has_kernel(name)


def overload_names(qualname: str) -> Iterator[str]:
    """The overloads of one operator (``""``: the default one), found one at a time by asking
    for this name alone, never listing every operator.

    TorchScript's operator registry, indexed by name, mirrors every dispatcher definition as
    definitions come and go, and adds overloads of its own (``aten::add.int``), so each of its
    candidates is checked against the dispatcher. An operator holding kernels but no
    definition has the default overload.
    """
    found = False
    for schema in _C._jit_get_schemas_for_operator(qualname):
        overload = schema.overload_name
        if has_operator(f"{qualname}.{overload}" if overload else qualname):
            found = True
            yield overload
    if not found and has_operator(qualname):
        yield ""


def dump_all_registrations(op_names: Iterable[str]) -> list[str]:
    """``dump_registrations`` of many operators, in order (one C-level loop: a snapshot of the
    whole dispatcher reads every operator's dump)."""
    return list(map(_C._dispatch_dump, op_names))


def dump_table(op_name: str) -> str:
    """The computed dispatch table of one operator, a line per runtime key that has a kernel."""
    return _C._dispatch_dump_table(op_name)


def dump_registrations(op_name: str) -> str:
    """Schema and raw kernel registrations of one operator, as the dispatcher prints them."""
    return _C._dispatch_dump(op_name)


@functools.cache
def _dispatch_key(name: str) -> Any | None:
    """The ``DispatchKey`` of a name: torch's parser misses some per-backend keys (e.g.
    AutogradMTIA), which the enum has."""
    member = _C.DispatchKey.__members__.get(name)
    return member if member is not None else _C._parse_dispatch_key(name)


def has_backend_fallback(key: str) -> bool:
    """Whether a backend fallback (one kernel for every operator) is registered for ``key``."""
    dispatch_key = _dispatch_key(key)
    return dispatch_key is not None and _C._dispatch_has_backend_fallback(dispatch_key)


@functools.cache
def alias_includes(alias: str, key: str) -> bool:
    """``c10::isIncludedInAlias``: whether a kernel registered to ``alias`` fills ``key``."""
    alias_key, runtime_key = _dispatch_key(alias), _dispatch_key(key)
    if alias_key is None or runtime_key is None:
        return False
    return _C._dispatch_is_included_in_alias(runtime_key, alias_key)


@functools.cache
def backend_keys_of_autograd(key: str) -> frozenset[str]:
    """``getBackendKeySetFromAutograd``: the backend keys an autograd key stands for (none for
    other keys), as runtime key names."""
    dispatch_key = _dispatch_key(key)
    if dispatch_key is None:
        return frozenset()
    keyset = _C._dispatch_get_backend_keyset_from_autograd(dispatch_key)
    return frozenset(keyset_names(keyset.raw_repr()))


@functools.cache
def autogradother_backends() -> frozenset[str]:
    """``c10::autogradother_backends``: backends served by AutogradOther, as runtime key names."""
    return frozenset(keyset_names(_C._dispatch_autogradother_backends.raw_repr()))


def registrations_for_key(key: str) -> list[str]:
    """Names of all operators with a kernel registered directly to ``key`` (alias keys too)."""
    try:
        return _C._dispatch_get_registrations_for_dispatch_key(key)
    except RuntimeError:  # torch cannot parse some per-backend names (e.g. QuantizedHIP)
        return []


def operator_parts(op: Any) -> tuple[str, str, str | None] | None:
    """``(namespace, name, overload)`` of an OpOverload (``""``: the default overload), of an
    OpOverloadPacket (overload ``None``) or of what ``custom_op`` returns; else ``None``."""
    custom = getattr(op, "_opoverload", None)
    if isinstance(custom, OpOverload):
        op = custom
    if isinstance(op, OpOverload):
        namespace, name = op._schema.name.split("::", 1)
        return namespace, name, op._schema.overload_name
    if isinstance(op, OpOverloadPacket):
        namespace, name = op._qualified_op_name.split("::", 1)
        return namespace, name, None
    return None


def find_schema(qualname: str, overload: str) -> Any | None:
    """The FunctionSchema of ``qualname.overload``, or ``None`` when it does not exist."""
    try:
        return _C._dispatch_find_schema_or_throw(qualname, overload).schema()
    except RuntimeError:
        return None


def parse_schema(text: str) -> Any:
    """The FunctionSchema of ``"ns::name(Tensor x) -> Tensor"`` (raises RuntimeError if bad).

    Its ``.arguments`` (each with ``.name``, ``.kwarg_only``) and ``.returns`` are read by
    front ends that generate Python kernels for a schema.
    """
    return _C.parse_schema(text)


def select_overload(qualname: str, args: tuple, kwargs: dict) -> str:
    """The overload name torch picks for a packet call (raises RuntimeError on no match)."""
    return _C._jit_resolve_packet(qualname, *args, **kwargs)


def py_kernel_keys(op_overload: Any) -> list[str]:
    """Keys with a Python kernel (``py_impl``) on an OpOverload, used by the Python dispatcher."""
    return [
        getattr(key, "name", str(key))
        for key in getattr(op_overload, "py_kernels", {})
        if isinstance(key, _C.DispatchKey)
    ]


def python_kernel(op_overload: Any, key: str) -> Any | None:
    """The Python function ``py_impl`` put on an OpOverload for ``key``, or None.

    ``torch/_meta_registrations.py`` registers each Python Meta kernel both here and with
    the dispatcher (through one ``Library``, whose line is all the dispatcher records).
    """
    dispatch_key = getattr(_C.DispatchKey, key, None)
    if dispatch_key is None:
        return None
    return getattr(op_overload, "py_kernels", {}).get(dispatch_key)


def library_autocast_dtype(op_overload: Any, autocast_key: str) -> torch.dtype | None:
    """The dtype ``torch.library.register_autocast`` casts to at ``autocast_key`` for an op
    that is not a custom_op (its rule is a Python kernel closing over ``cast_inputs``)."""
    rule = python_kernel(op_overload, autocast_key)
    code = getattr(rule, "__code__", None)
    if rule is None or code is None or "cast_inputs" not in code.co_freevars:
        return None
    if not rule.__closure__:
        return None
    dtype = rule.__closure__[code.co_freevars.index("cast_inputs")].cell_contents
    return dtype if isinstance(dtype, torch.dtype) else None


def is_fake_mode(mode: Any) -> bool:
    """Whether a dispatch mode is a FakeTensorMode."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return isinstance(mode, FakeTensorMode)


def is_fake_tensor_type(cls: type) -> bool:
    """Whether a tensor subclass is FakeTensor."""
    from torch._subclasses.fake_tensor import FakeTensor

    return issubclass(cls, FakeTensor)


# a key nothing registers kernels for: an operator held alive gets a fallthrough kernel there
_HOLD_KEY = "QuantizedPrivateUse3"


def hold_operators(qualnames: Iterable[str]) -> Callable[[], None]:
    """Keep these operators' dispatcher entries alive until the returned function is called.

    An operator whose last registration goes away is freed, and handles to it (a ``static``
    typed handle in a C++ library, ``torch.ops`` objects) would dangle while its library is
    replaced. Each one gets a fallthrough kernel for a key no tensor has, from a library of
    its namespace; the returned function removes them (unused operators are freed then).
    """
    libraries: dict[str, Any] = {}
    key = getattr(_C.DispatchKey, _HOLD_KEY)
    for qualname in qualnames:
        namespace = qualname.split("::", 1)[0]
        library = libraries.get(namespace)
        if library is None:
            library = _C._dispatch_library("FRAGMENT", namespace, "", "opmagic (held)", 0)
            libraries[namespace] = library
        # torch's stub lacks the binding's fourth argument, with_keyset
        library.impl(qualname, key, torch.library.fallthrough_kernel, False)  # type: ignore[call-arg]

    def release() -> None:
        for library in libraries.values():
            library.reset()

    return release


# ---------------------------------------------------------------- torch._native overrides


def native_override_routes() -> list[tuple[str, str, str, str, bool, Any, Any]]:
    """The override routes ``torch._native`` keeps for aten ops (empty where this torch has
    none): ``(op_symbol, dispatch_key, dsl_name, node_id, active, cond_fn, impl_fn)``, in the
    order its router tries them. A route is installed in the dispatcher as one router kernel
    per ``(op, key)`` (``torch/_native/registry.py``), which picks the first route whose
    condition holds and else calls the kernel it hides."""
    registry = sys.modules.get("torch._native.registry")
    graphs = getattr(registry, "_graphs", None)
    if not isinstance(graphs, dict):
        return []
    return [
        (op_symbol, key, node.dsl_name, node.node_id, node.active, node.cond_fn, node.impl_fn)
        for (op_symbol, key), nodes in graphs.items()
        for node in nodes
    ]


def native_registry_file() -> str | None:
    """The file of ``torch._native``'s registry: the site torch records for its router kernels."""
    registry = sys.modules.get("torch._native.registry")
    return getattr(registry, "__file__", None)


# ---------------------------------------------------------------- call arguments


def check_call_arguments(schema: Any, args: tuple, kwargs: dict) -> None:
    """Convert a call's arguments as the boxed Python call does (``createStackForSchema``),
    without running anything; raises RuntimeError with torch's words when one does not fit."""
    _C._check_schema_allow_fake_script_object(schema, *args, **kwargs)


def allows_numbers_as_tensors(qualname: str) -> bool:
    """Whether torch turns numbers passed for Tensor arguments of this op into tensors
    (``aten::add``, ``aten::mul``, ... and prims), as its Python calls do."""
    namespace, _, name = qualname.partition("::")
    return namespace == "prims" or (
        namespace == "aten" and _C._should_allow_numbers_as_tensors(name)
    )


def new_scalar_tensor() -> torch.Tensor:
    """A 0-dim CPU tensor made the way ``scalar_to_tensor`` makes one for a number passed as
    a Tensor: outside every mode, transform and TorchFunctionMode, but an inference tensor
    under inference_mode."""
    backend_select = _C.DispatchKeySet(_C.DispatchKey.BackendSelect)
    with (
        _C.DisableTorchFunction(),
        _C._ForceDispatchKeyGuard(backend_select, backend_select - backend_select),
    ):
        return torch.empty(())


# ---------------------------------------------------------------- tensor subclasses and modes


def is_traceable_wrapper_subclass(tensor: torch.Tensor) -> bool:
    """Whether a tensor is a wrapper subclass that says what it wraps (``__tensor_flatten__``)."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass as check

    return check(tensor)


def inner_tensor_names(tensor: Any) -> list[str]:
    """The attributes holding a traceable wrapper subclass's inner tensors, in its order
    (``tensor`` is such a subclass: it has ``__tensor_flatten__``)."""
    return list(tensor.__tensor_flatten__()[0])


def has_own_storage(tensor: torch.Tensor) -> bool:
    """Whether a tensor holds data of its own (``_make_subclass``), unlike a wrapper subclass
    made by ``_make_wrapper_subclass``, whose storage is a placeholder."""
    try:
        tensor.untyped_storage().data_ptr()
    except RuntimeError:
        return False
    return True


def fake_mode_of(tensor: Any) -> Any:
    """The FakeTensorMode a FakeTensor (``tensor``) belongs to."""
    return tensor.fake_mode


def fake_mode_refuses(mode: Any, tensor: torch.Tensor) -> bool:
    """Whether FakeTensorMode refuses a tensor argument: not one of its own fakes, and the
    mode does not convert real inputs (``allow_non_fake_inputs`` off)."""
    from torch._subclasses.fake_tensor import fake_tensor_tls

    if mode.is_our_fake(tensor):
        return False
    override = fake_tensor_tls.allow_non_fake_inputs_override
    return not (mode.allow_non_fake_inputs if override is None else override)


def fake_tensor_passes_on(tensor: torch.Tensor) -> bool:
    """Whether FakeTensorMode (and FakeTensor's own handler) returns NotImplemented for a call
    with this argument: a tensor subclass it does not know, whose handler then runs."""
    from torch._subclasses.fake_tensor import _check_for_subclass_arg

    return _check_for_subclass_arg(tensor)


def is_functional_tensor_mode(mode: Any) -> bool:
    """Whether a dispatch mode is Python functionalization's FunctionalTensorMode."""
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    return isinstance(mode, FunctionalTensorMode)


def is_functional_tensor_subclass(cls: type) -> bool:
    """Whether a tensor subclass is Python functionalization's FunctionalTensor."""
    from torch._subclasses.functional_tensor import FunctionalTensor

    return issubclass(cls, FunctionalTensor)


def functional_tensor_elem(tensor: Any) -> torch.Tensor:
    """The C++ FunctionalTensorWrapper a FunctionalTensor (``tensor``) holds."""
    return tensor.elem


def functional_tensor_metadata_ops() -> frozenset[Any]:
    """The metadata queries FunctionalTensorMode answers without decomposing."""
    from torch._subclasses.functional_tensor import FunctionalTensor

    return FunctionalTensor.metadata_fns


def functional_mode_can_decompose(mode: Any, op_overload: Any, args: tuple, kwargs: dict) -> bool:
    """Whether FunctionalTensorMode decomposes this call (if the op has a CIA kernel)."""
    return mode._can_decompose(op_overload, args, kwargs)


def can_auto_functionalize(op_overload: Any) -> bool:
    """Whether Python functionalization handles this mutable op with auto_functionalize."""
    from torch._higher_order_ops.auto_functionalize import can_auto_functionalize as check

    return check(op_overload)


def has_effects(op_overload: Any) -> bool:
    """Whether an op is registered as side-effectful (Python functionalization threads tokens)."""
    from torch._higher_order_ops.effects import has_effects as check

    return check(op_overload)


def jagged_rule(op_overload: Any, args: tuple, kwargs: dict) -> Any | None:
    """The jagged NestedTensor's rule for this call (its op table, or the pointwise rule), or
    ``None``; raises as the real call does when a pointwise op's arguments do not fit."""
    from torch.nested._internal.ops import lookup_jagged

    return lookup_jagged(op_overload, *args, **kwargs)


def vmap_fallback_enabled() -> bool:
    """Whether vmap may use its per-sample fallback for ops without a batching rule."""
    return _C._functorch._is_vmap_fallback_enabled()  # type: ignore[attr-defined]  # no stub


# ---------------------------------------------------------------- contexts for a call


def new_logging_dispatch_mode(log: list[str]) -> Any:
    """A ``TorchDispatchMode`` that appends each operator it sees to ``log`` and runs it."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class LoggingMode(TorchDispatchMode):
        """Logs every operator call that reaches the Python key, then runs it unchanged."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            log.append(str(func))
            return func(*args, **(kwargs or {}))

    return LoggingMode()


# ---------------------------------------------------------------- torch.ops caches


def refresh_operators(qualnames: Iterable[str]) -> None:
    """Forget Python-side caches of operators whose definition changed or went away.

    ``torch.ops`` caches a packet per operator on first access, and torch.fx a signature
    per schema; after an operator is removed or redefined (a rebuilt library, a re-run
    cell) they are stale, as ``torch.library.Library._destroy`` knows. Only for operators
    whose definition changed: torch keys tables (decompositions, Python kernels) by the
    packets of its own operators.
    """
    from torch.fx.operator_schemas import _SCHEMA_TO_SIGNATURE_CACHE

    for qualname in set(qualnames):
        namespace_name, _, rest = qualname.partition("::")
        name, _, overload = rest.partition(".")
        _SCHEMA_TO_SIGNATURE_CACHE.pop((f"{namespace_name}::{name}", overload), None)
        namespace = vars(torch.ops).get(namespace_name)
        if namespace is None or name not in vars(namespace):
            continue
        delattr(namespace, name)
        names = getattr(namespace, "_dir", None)
        if isinstance(names, list) and name in names:
            names.remove(name)
