"""The dispatch-key catalogue: every key of the running torch, in priority order, with a
category and a one-line explanation.

The keys, their bits and their order come from the live dispatcher (decoded from
``DispatchKeySet`` raw bits); this module only adds names for groups and the words.
Keysets are handled as raw ``int`` bits with the same algebra as ``c10::DispatchKeySet``.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from dataclasses import dataclass

from .._torch import dispatcher
from ..errors import ArgumentTypeError, UnknownDispatchKeyError

CATEGORIES = (
    "python & modes",
    "functorch",
    "autocast",
    "autograd",
    "view & inplace",
    "backend select",
    "backend",
    "other",
)

# functionality -> (category, explanation); "{b}" is the backend of a per-backend key.
_FUNCTIONALITY_TEXT: dict[str, tuple[str, str]] = {
    "PythonDispatcher": (
        "python & modes",
        "Python dispatcher (enable_python_dispatcher, used by make_fx/torch.compile): "
        "routes the call through torch._ops so Python kernels (py_impl) can interpose.",
    ),
    "PreDispatch": (
        "python & modes",
        "Pre-dispatch tracing (export/make_fx with pre_dispatch=True): a mode sees the op "
        "before autograd and autocast.",
    ),
    "TESTING_ONLY_GenericMode": ("other", "Reserved for the dispatcher's own unit tests."),
    "TESTING_ONLY_GenericWrapper": ("other", "Reserved for the dispatcher's own unit tests."),
    "FuncTorchDynamicLayerFrontMode": (
        "functorch",
        "Entry of a torch.func transform (vmap, grad, jvp, functionalize): hands the call to "
        "the innermost transform, which enables only its own keys.",
    ),
    "PythonTLSSnapshot": (
        "python & modes",
        "Snapshots the thread-local dispatch state when a call enters from Python, so a "
        "__torch_dispatch__ handler later runs under it.",
    ),
    "DeferredInit": (
        "other",
        "Deferred module initialisation (torchdistx): records factory calls.",
    ),
    "FuncTorchGradWrapper": (
        "functorch",
        "torch.func.grad/jvp wrapper tensors: unwraps wrappers whose transform has exited.",
    ),
    "VmapMode": ("functorch", "Legacy torch._vmap_internals vmap mode (random ops inside vmap)."),
    "Batched": ("functorch", "Legacy torch._vmap_internals BatchedTensors."),
    "FuncTorchVmapMode": (
        "functorch",
        "Set inside torch.func.vmap: makes random ops follow the chosen randomness.",
    ),
    "BatchedNestedTensor": ("functorch", "vmap over nested tensors: batching rules for them."),
    "FuncTorchBatched": (
        "functorch",
        "torch.func.vmap BatchedTensors: runs the op's batching rule (or the slow per-sample "
        "for-loop fallback) on the unbatched tensors.",
    ),
    "AutocastFunctionality": ("autocast", ""),
    "Tracer": ("other", "torch.jit.trace: records the op into the TorchScript graph being traced."),
    "AutogradFunctionality": (
        "autograd",
        "Autograd for {b} tensors: records the backward node when an input requires grad, "
        "then redispatches below autograd.",
    ),
    "AutogradNestedTensor": (
        "autograd",
        "Autograd for nested tensors: records the backward node, then redispatches below autograd.",
    ),
    "AutogradOther": (
        "autograd",
        "Autograd for backends without an autograd key of their own (Mkldnn, FPGA, Vulkan, ...).",
    ),
    "ADInplaceOrView": (
        "view & inplace",
        "After autograd for in-place and view ops: bumps version counters and records view "
        "metadata. A fallthrough for every other op.",
    ),
    "ZeroTensor": (
        "view & inplace",
        "Efficient zero tensors (_efficientzerotensor): materialises them for kernels that "
        "cannot handle them.",
    ),
    "Negative": (
        "view & inplace",
        "Lazy negation views (_neg_view): resolves the negative bit before kernels that ignore it.",
    ),
    "Conjugate": (
        "view & inplace",
        "Lazy conjugate views (x.conj() of complex tensors): resolves the conjugate bit before "
        "kernels that ignore it.",
    ),
    "Functionalize": (
        "functorch",
        "Functionalization (torch.func.functionalize, AOTAutograd): replaces mutations and "
        "views by out-of-place ops on FunctionalTensorWrappers.",
    ),
    "FuncTorchDynamicLayerBackMode": (
        "functorch",
        "Exit of a torch.func transform layer: pops it and sends the call to the next outer "
        "transform (or to the plain dispatcher).",
    ),
    "Python": (
        "python & modes",
        "__torch_dispatch__: hands the call to the innermost TorchDispatchMode, or to the "
        "tensor subclass of an argument.",
    ),
    "Fake": (
        "python & modes",
        "C++ fake tensors: swaps fake inputs for meta tensors, runs the Meta kernels, and "
        "turns the outputs back into fake tensors.",
    ),
    "BackendSelect": (
        "backend select",
        "Factory ops with no tensor inputs: picks the backend from the device, dtype and "
        "layout arguments, then redispatches to it.",
    ),
    "Dense": ("backend", "Kernels for dense (strided) {b} tensors."),
    "Quantized": ("backend", "Kernels for quantized {b} tensors."),
    "Sparse": ("backend", "Kernels for sparse COO {b} tensors."),
    "SparseCsr": ("backend", "Kernels for sparse compressed (CSR/CSC/BSR/BSC) {b} tensors."),
    "NestedTensor": ("backend", "Kernels for nested (ragged) {b} tensors."),
    "MkldnnCPU": ("backend", "Kernels for oneDNN (MKL-DNN) opaque CPU tensors."),
    "FPGA": ("backend", "Kernels for FPGA tensors (out-of-tree backend)."),
    "Vulkan": ("backend", "Kernels for Vulkan GPU tensors (mobile)."),
    "Metal": ("backend", "Kernels for Metal GPU tensors (iOS)."),
    "CustomRNGKeyId": (  # a backend functionality: it sits between Quantized and Sparse
        "backend",
        "Kernels for tensors of a custom random-number generator (the RNG extension point).",
    ),
}

_AUTOCAST_TEXT = (
    "Automatic mixed precision for {b} tensors: while torch.autocast('{d}') is on, casts "
    "inputs to the autocast dtype and redispatches; off by default (in the TLS exclude set)."
)

_BACKEND_WORDS = {"Meta": "meta (shape-only, no data)", "CPU": "CPU", "CUDA": "CUDA"}

ALIAS_TEXT: dict[str, str] = {
    "Autograd": "Fills every Autograd<backend> key, AutogradOther and AutogradNestedTensor.",
    "CompositeImplicitAutograd": (
        "A decomposition into other ops, used for every backend and for autograd (its "
        "derivative comes from the ops it calls) unless a more specific kernel exists."
    ),
    "CompositeImplicitAutogradNestedTensor": (
        "A decomposition used for nested-tensor keys, like CompositeImplicitAutograd."
    ),
    "CompositeExplicitAutograd": (
        "One kernel for every backend key (and Undefined); autograd needs its own kernel."
    ),
    "CompositeExplicitAutogradNonFunctional": (
        "Like CompositeExplicitAutograd, for ops whose kernel is not functional (it mutates "
        "or views); not used under functionalization backends."
    ),
    "FuncTorchBatchedDecomposition": "A decomposition used as the vmap rule (FuncTorchBatched).",
}

UNDEFINED_TEXT = (
    "No key at all (a call without tensor inputs and nothing in the TLS include set): only "
    "CompositeImplicitAutograd or CompositeExplicitAutograd kernels can serve it."
)


@dataclass(frozen=True)
class KeyInfo:
    """One dispatch key: its torch name, where it sits, and what it is for."""

    name: str
    category: str
    explanation: str
    priority: int  # 0 = the highest-priority runtime key; aliases and Undefined get -1
    functionality: str  # e.g. "AutogradFunctionality" for AutogradCPU; the name itself otherwise
    backend: str | None  # e.g. "CPU" for AutogradCPU; None for keys that are not per-backend
    raw: int  # bits of DispatchKeySet(name); 0 for aliases and Undefined
    is_alias: bool = False


class KeyCatalogue:
    """Every runtime and alias key of this torch, decoded from the live dispatcher."""

    def __init__(self) -> None:
        self.num_backends = dispatcher.num_backends()
        self.backend_mask = (1 << self.num_backends) - 1
        full = dispatcher.full_keyset_raw()
        dense_bit = _bit_of(dispatcher.single_key_raw("Dense"))
        self.backend_names: dict[int, str] = {
            b: dispatcher.keyset_names((1 << dense_bit) | (1 << b))[0]
            for b in range(self.num_backends)
            if full >> b & 1
        }
        functionality_names = _functionality_names(self.num_backends)
        entries: list[tuple[int, int, KeyInfo]] = []
        self.per_backend_bits: set[int] = set()
        for fbit in range(self.num_backends, full.bit_length()):
            if not full >> fbit & 1:
                continue
            single = dispatcher.keyset_names(1 << fbit)
            if single:
                info = _describe(single[0], single[0], None, 1 << fbit)
                entries.append((fbit, -1, info))
                continue
            self.per_backend_bits.add(fbit)
            functionality = functionality_names.get(fbit, f"functionality{fbit}")
            for b, backend in self.backend_names.items():
                raw = (1 << fbit) | (1 << b)
                names = dispatcher.keyset_names(raw)
                if names:
                    entries.append((fbit, b, _describe(names[0], functionality, backend, raw)))
        entries.sort(key=lambda e: (e[0], e[1]), reverse=True)
        self.runtime: tuple[KeyInfo, ...] = tuple(
            dataclasses.replace(info, priority=i) for i, (_, _, info) in enumerate(entries)
        )
        self.by_name: dict[str, KeyInfo] = {k.name: k for k in self.runtime}
        self._bits: dict[str, tuple[int, int]] = {info.name: (fbit, b) for fbit, b, info in entries}
        self._name_of: dict[tuple[int, int], str] = {v: k for k, v in self._bits.items()}
        self.aliases: dict[str, KeyInfo] = {
            name: KeyInfo(name, "alias", text, -1, name, None, 0, True)
            for name, text in ALIAS_TEXT.items()
            if dispatcher.is_alias_key(name)
        }
        self.undefined = KeyInfo("Undefined", "other", UNDEFINED_TEXT, -1, "Undefined", None, 0)

    # ------------------------------------------------------------ lookups

    def info(self, name: str) -> KeyInfo:
        """The catalogue entry of a runtime key, alias key or ``Undefined``."""
        if name in self.by_name:
            return self.by_name[name]
        if name in self.aliases:
            return self.aliases[name]
        if name == "Undefined":
            return self.undefined
        raise KeyError(name)

    def names(self, raw: int) -> list[str]:
        """Runtime keys in a raw keyset, highest priority first."""
        backends = [b for b in range(self.num_backends - 1, -1, -1) if raw >> b & 1]
        out: list[str] = []
        for fbit in range(raw.bit_length() - 1, self.num_backends - 1, -1):
            if not raw >> fbit & 1:
                continue
            if fbit in self.per_backend_bits:
                out.extend(self._name_of[(fbit, b)] for b in backends if (fbit, b) in self._name_of)
            elif (fbit, -1) in self._name_of:
                out.append(self._name_of[(fbit, -1)])
        return out

    def highest(self, raw: int) -> str | None:
        """The key the dispatcher picks for a keyset (``None`` when it has no functionality bit)."""
        functionality = raw & ~self.backend_mask
        if not functionality:
            return None
        fbit = functionality.bit_length() - 1
        if fbit not in self.per_backend_bits:
            return self._name_of.get((fbit, -1))
        backends = raw & self.backend_mask
        if not backends:
            return None
        return self._name_of.get((fbit, backends.bit_length() - 1))

    def raw(self, name: str) -> int:
        """Bits of ``DispatchKeySet(name)`` for a runtime key."""
        return self.by_name[name].raw

    def minus(self, raw: int, remove: int) -> int:
        """``DispatchKeySet::operator-``: removes functionality bits only, never backend bits."""
        return raw & (self.backend_mask | ~remove)

    def full_after(self, name: str) -> int:
        """``DispatchKeySet(FULL_AFTER, name)``: the keys below ``name``'s functionality."""
        info = self.by_name[name]
        functionality = info.functionality if info.backend else name
        return dispatcher.full_after_raw(functionality)

    def category_raw(self, category: str) -> int:
        """Functionality bits of every runtime key in a category (e.g. all autograd keys)."""
        raw = 0
        for info in self.runtime:
            if info.category == category:
                raw |= info.raw
        return raw & ~self.backend_mask

    def functionality_raw(self, name: str) -> int:
        """The functionality bit of a runtime key, without its backend bit."""
        return self.by_name[name].raw & ~self.backend_mask

    def backend_of(self, raw: int) -> str | None:
        """The backend of a keyset's per-backend keys: its highest backend bit, as a name."""
        backends = raw & self.backend_mask
        return self.backend_names.get(backends.bit_length() - 1) if backends else None


def _bit_of(raw: int | None) -> int:
    """Index of the single functionality bit of ``DispatchKeySet(functionality)``."""
    if not raw:
        raise RuntimeError("this torch build has no Dense dispatch key; opmagic cannot decode keys")
    return raw.bit_length() - 1


def _functionality_names(num_backends: int) -> dict[int, str]:
    """Map each per-backend functionality bit to its torch name (Dense, Sparse, ...)."""
    names: dict[int, str] = {}
    for name in dispatcher.dispatch_key_names():
        raw = dispatcher.single_key_raw(name)
        if raw and raw >> num_backends and raw & ((1 << num_backends) - 1) == 0:
            functionality = raw >> num_backends
            if functionality & (functionality - 1) == 0:
                names.setdefault(raw.bit_length() - 1, name)
    return names


def _describe(name: str, functionality: str, backend: str | None, raw: int) -> KeyInfo:
    if name.startswith("Autocast"):
        device = name[len("Autocast") :]
        text = _AUTOCAST_TEXT.format(b=device, d=device.lower())
        return KeyInfo(name, "autocast", text, -1, name, None, raw)
    category, text = _FUNCTIONALITY_TEXT.get(
        functionality, ("other", "No description in opmagic's catalogue (a key new to this torch).")
    )
    if backend is not None:
        text = text.format(b=_BACKEND_WORDS.get(backend, backend))
    return KeyInfo(name, category, text, -1, functionality, backend, raw)


@functools.cache
def catalogue() -> KeyCatalogue:
    """The key catalogue of this process's torch, built once on first use."""
    return KeyCatalogue()


def key_info(name: str) -> KeyInfo:
    """Category, priority and explanation of one dispatch key (runtime or alias)."""
    if not isinstance(name, str):
        raise ArgumentTypeError(
            f"key_info takes a dispatch key's name (a str such as 'CPU'), got {name!r}."
        )
    known = catalogue()
    try:
        return known.info(name)
    except KeyError:
        by_lower = {n.lower(): n for n in [*known.by_name, *known.aliases, "Undefined"]}
        close = [by_lower[n] for n in difflib.get_close_matches(name.lower(), list(by_lower), n=3)]
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise UnknownDispatchKeyError(
            f"This torch has no dispatch key {name!r}.{hint} runtime_keys() lists them all."
        ) from None


def runtime_keys() -> list[KeyInfo]:
    """Every runtime dispatch key of this torch, highest priority first."""
    return list(catalogue().runtime)
