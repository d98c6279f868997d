"""Every private PyTorch API that opmagic touches, and nothing else.

A new torch release that renames or changes one of these breaks this file alone;
tests/dispatch/test_torch_shim.py exercises each function so a failure names the shim.
Keysets cross this boundary as plain ``int`` raw representations (``DispatchKeySet.raw_repr``).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

_C = torch._C


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


def dump_table(op_name: str) -> str:
    """The computed dispatch table of one operator, a line per runtime key that has a kernel."""
    return _C._dispatch_dump_table(op_name)


def dump_registrations(op_name: str) -> str:
    """Schema and raw kernel registrations of one operator, as the dispatcher prints them."""
    return _C._dispatch_dump(op_name)


def registrations_for_key(key: str) -> list[str]:
    """Names of all operators with a kernel registered directly to ``key`` (alias keys too)."""
    try:
        return _C._dispatch_get_registrations_for_dispatch_key(key)
    except RuntimeError:  # torch cannot parse some per-backend names (e.g. QuantizedHIP)
        return []


def find_schema(qualname: str, overload: str) -> Any | None:
    """The FunctionSchema of ``qualname.overload``, or ``None`` when it does not exist."""
    try:
        return _C._dispatch_find_schema_or_throw(qualname, overload).schema()
    except RuntimeError:
        return None


def select_overload(qualname: str, args: tuple, kwargs: dict) -> str:
    """The overload name torch picks for a packet call (raises RuntimeError on no match)."""
    return _C._jit_resolve_packet(qualname, *args, **kwargs)


def custom_op_def(qualname: str) -> Any | None:
    """The ``CustomOpDef`` behind a ``torch.library.custom_op`` operator, if any."""
    from torch._library import custom_ops

    return custom_ops.OPDEFS.get(qualname)


def custom_op_parts(opdef: Any) -> dict[str, Any]:
    """The Python pieces of a ``CustomOpDef``: default impl, device kernels, fake, autograd."""
    return {
        "impl": opdef._init_fn,
        "device_kernels": dict(opdef._backend_fns),
        "fake": opdef._abstract_fn,
        "backward": opdef._backward_fn,
        "setup_context": opdef._setup_context_fn,
        "vmap": getattr(opdef, "_vmap_fn", None),
        "autocast": dict(getattr(opdef, "_autocast_dtype", {}) or {}),
        "torch_dispatch": dict(getattr(opdef, "_torch_dispatch_fns", {}) or {}),
    }


def registered_fake_impl(qualname: str) -> Any | None:
    """The fake (abstract) impl registered for an operator with ``register_fake``, if any."""
    from torch._library import simple_registry

    entry = simple_registry.singleton.find(qualname)
    kernel = entry.fake_impl.kernel
    return None if kernel is None else getattr(kernel, "func", kernel)


def registered_torch_dispatch_rule(qualname: str, mode_type: type) -> Any | None:
    """The ``register_torch_dispatch`` rule of an operator for a mode or subclass type, if any."""
    from torch._library import simple_registry

    return simple_registry.singleton.find(qualname).torch_dispatch_rules.find(mode_type)


def py_kernel_keys(op_overload: Any) -> list[str]:
    """Keys with a Python kernel (``py_impl``) on an OpOverload, used by the Python dispatcher."""
    return [
        getattr(key, "name", str(key))
        for key in getattr(op_overload, "py_kernels", {})
        if isinstance(key, _C.DispatchKey)
    ]


def unwrap_custom_op_kernel(fn: Any) -> Any:
    """The user's function inside the per-device wrapper ``CustomOpDef.register_kernel`` makes."""
    fn = inspect.unwrap(fn)
    code = getattr(fn, "__code__", None)
    if code is not None and fn.__closure__ and "fn" in code.co_freevars:
        return fn.__closure__[code.co_freevars.index("fn")].cell_contents
    return fn


def custom_op_can_fake_trivially(op_overload: Any) -> bool:
    """Whether custom_op generates a fake impl by itself (ops that return nothing)."""
    from torch._library import utils

    return utils.can_generate_trivial_fake_impl(op_overload)


def is_fake_mode(mode: Any) -> bool:
    """Whether a dispatch mode is a FakeTensorMode."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return isinstance(mode, FakeTensorMode)


def is_fake_tensor_type(cls: type) -> bool:
    """Whether a tensor subclass is FakeTensor."""
    from torch._subclasses.fake_tensor import FakeTensor

    return issubclass(cls, FakeTensor)


# ---------------------------------------------------------------- torch.ops cache


def forget_cached_ops(qualnames: list[str]) -> None:
    """Drop cached ``torch.ops.ns.name`` packets so the next access sees the live operator.

    ``torch.ops`` caches a packet per operator on first access; after an operator is
    removed or redefined (a rebuilt library) the cached packet is stale, as
    ``torch.library.Library._destroy`` knows. Only for operators whose definition changed:
    torch keys tables (decompositions, Python kernels) by the packets of its own operators.
    """
    for qualname in qualnames:
        namespace_name, _, rest = qualname.partition("::")
        name = rest.split(".", 1)[0]
        namespace = vars(torch.ops).get(namespace_name)
        if namespace is None or name not in vars(namespace):
            continue
        delattr(namespace, name)
        if name in namespace._dir:
            namespace._dir.remove(name)
