"""``resolve(op, *args, **kwargs)``: which kernels the dispatcher runs for a call, unrun.

The simulation follows c10's dispatcher step by step:

* a dispatch computes ``((keys of the tensor arguments | TLS include) - TLS exclude)``
  masked by the op's fallthrough keys (per backend, as ``DispatchKeyExtractor`` does);
* the highest-priority key picks a table entry, and what its kernel does next is modelled on
  what torch's own kernels and fallbacks do: redispatch below a key (autograd,
  ADInplaceOrView, math-bit fallbacks, PythonTLSSnapshot, ...), call the op again under new
  thread-local guards (autocast wrappers, functionalization, functorch layers,
  ``__torch_dispatch__`` handlers), end (backend and CompositeImplicitAutograd kernels), or
  fail;
* user kernels at other keys are taken to redispatch below their key, as the dispatcher
  tutorial's kernels and ``Library.impl(..., with_keyset=True)`` kernels do.

tests/dispatch/test_resolve_ground_truth.py checks the model against the real dispatcher.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..._torch import custom_op_state, dispatcher, library_hooks
from ...display import Displayable
from ...errors import ArgumentsMismatchError
from ..keys import KeyCatalogue, catalogue
from ..ops import OpRef, op_ref, overloads_of
from ..sites import label_callable
from ..table import OperatorTable, TableEntry

if TYPE_CHECKING:
    from ...view.graph import Diagram

_MAX_STEPS = 64


@dataclass(frozen=True)
class Skip:
    """A key the call's keyset had that the dispatcher passed over, and why."""

    key: str
    reason: str  # "excluded" | "fallthrough" | "masked"
    detail: str


@dataclass(frozen=True)
class Step:
    """One kernel on the path: the key, the table entry that served it, and what it does."""

    key: str
    entry: TableEntry
    via: str  # "dispatch" | "redispatch" | "call" (the previous kernel called the op again)
    origin: str  # what put the key in the keyset (arguments, TLS include, a kernel)
    skipped: tuple[Skip, ...]  # keys of the keyset passed over just before this one
    action: str  # "ends" | "redispatch" | "call" | "python" | "error"
    note: str  # what the kernel does next, in one line
    assumed: bool = False  # reached only if a Python handler calls the op again, as usual


@dataclass(frozen=True)
class DispatchInput:
    """One argument the dispatcher reads keys from."""

    name: str
    description: str
    keys: tuple[str, ...]


@dataclass(frozen=True)
class Resolution(Displayable):
    """The predicted dispatch of one call: the path of runtime keys and why each is there."""

    op: str
    schema: str
    steps: tuple[Step, ...]
    error: str | None
    inputs: tuple[DispatchInput, ...]
    context: tuple[str, ...]  # the thread-local state that matters, in words
    tls_included: tuple[str, ...]
    tls_excluded: tuple[str, ...]

    @property
    def path(self) -> tuple[str, ...]:
        """Runtime keys whose kernels run, in order (the first is the resolved key).

        A fallback that runs and raises (the Meta fallback) is on the path; a key with no
        kernel at all, where dispatch fails, is not.
        """
        return tuple(
            step.key for step in self.steps if step.entry.kind not in ("missing", "ambiguous")
        )

    @property
    def key(self) -> str | None:
        """The key resolved for the inputs (``path[0]``), or ``None``."""
        return self.path[0] if self.path else None

    @property
    def python(self) -> str | None:
        """Where the path hands over to Python code that opmagic does not follow, if it does."""
        last = self.steps[-1] if self.steps else None
        return last.note if last is not None and last.action == "python" else None

    def diagram(self, show_all: bool = False) -> Diagram:
        """The path as a Graphviz diagram; ``show_all`` draws the op's whole table around it."""
        return self.view("diagram", show_all=show_all)


def resolve(op: Any, *args: Any, **kwargs: Any) -> Resolution:
    """Predict which kernels ``op(*args, **kwargs)`` runs under the current thread-local state.

    ``op`` is anything :func:`opmagic.dispatch_table` accepts; for a packet
    (``torch.ops.aten.add``) the overload is chosen from the arguments as torch chooses it.
    Nothing runs: no kernel is called and no argument is touched. The call is taken as
    ``torch.ops`` makes it (boxed: Tensor, Tensor?, Tensor[] and Tensor?[] carry keys).
    """
    ref = op_ref(op)
    if ref.overload is None:
        ref = ref.with_overload(_select_overload(ref, args, kwargs))
    table = OperatorTable(ref)
    bound = _bind(ref, table.schema_obj, args, kwargs)
    return _Simulator(ref, table, bound).run()


# ------------------------------------------------------------------ argument binding


@dataclass(frozen=True)
class _Arg:
    name: str
    type: str
    value: Any


def _select_overload(ref: OpRef, args: tuple, kwargs: dict) -> str:
    overloads = overloads_of(ref)
    if len(overloads) == 1:
        return overloads[0]
    try:
        chosen = dispatcher.select_overload(ref.qualname, args, kwargs)
    except RuntimeError as exc:
        schemas = "\n  ".join(str(dispatcher.find_schema(ref.qualname, o)) for o in overloads)
        given = ", ".join(
            [_type_name(a) for a in args] + [f"{k}={_type_name(v)}" for k, v in kwargs.items()]
        )
        raise ArgumentsMismatchError(
            f"No overload of {ref.qualname} accepts ({given}). Its overloads are:\n  {schemas}\n"
            f"Pass arguments matching one of them, or name one ('{ref.qualname}.<overload>')."
        ) from exc
    return "" if chosen == "default" else chosen


def _bind(ref: OpRef, schema: Any, args: tuple, kwargs: dict) -> list[_Arg]:
    """Match call arguments to the schema's arguments, as the boxed Python call does."""
    params = list(schema.arguments)
    positional = [p for p in params if not p.kwarg_only]
    if len(args) > len(positional):
        raise ArgumentsMismatchError(
            f"{ref} takes at most {len(positional)} positional arguments, got {len(args)}.\n"
            f"Schema: {schema}"
        )
    unknown = [k for k in kwargs if k not in {p.name for p in params}]
    if unknown:
        raise ArgumentsMismatchError(
            f"{ref} has no argument named {', '.join(map(repr, unknown))}.\nSchema: {schema}"
        )
    bound = []
    for i, param in enumerate(params):
        if i < len(args) and not param.kwarg_only:
            if param.name in kwargs:
                raise ArgumentsMismatchError(
                    f"{ref} got argument {param.name!r} both by position and by keyword."
                )
            value = args[i]
        elif param.name in kwargs:
            value = kwargs[param.name]
        elif param.has_default_value():
            value = param.default_value
        else:
            raise ArgumentsMismatchError(
                f"{ref} is missing the required argument {param.name!r}.\nSchema: {schema}"
            )
        _check_tensor_type(ref, param.name, str(param.type), value)
        bound.append(_Arg(param.name, str(param.type), value))
    return bound


def _check_tensor_type(ref: OpRef, name: str, type_str: str, value: Any) -> None:
    """Tensor-typed parameters must get tensors: anything else is a clear error."""
    if type_str.replace("Optional[", "").replace("List[", "").rstrip("]") != "Tensor":
        return
    optional_items = "Optional[Tensor]" in type_str
    if type_str.startswith("List["):
        if isinstance(value, (list, tuple)) and all(
            isinstance(v, torch.Tensor) or (optional_items and v is None) for v in value
        ):
            return
        raise ArgumentsMismatchError(
            f"Argument {name!r} of {ref} must be a list of Tensors"
            f"{' (or None)' if optional_items else ''}, got {_type_name(value)}."
        )
    if isinstance(value, torch.Tensor) or (type_str.startswith("Optional[") and value is None):
        return
    raise ArgumentsMismatchError(
        f"Argument {name!r} of {ref} must be a Tensor, got {_type_name(value)}. "
        "Wrap numbers with torch.tensor(...) or pick an overload that takes a Scalar."
    )


def _type_name(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return "Tensor"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(_type_name(v) for v in value[:3])
        return f"{type(value).__name__}[{inner}{', ...' if len(value) > 3 else ''}]"
    return f"{type(value).__name__} {value!r}"[:60]


@dataclass(frozen=True)
class _Val:
    """A tensor the dispatcher reads keys from, with the keys it carries at this point."""

    name: str
    tensor: torch.Tensor
    raw: int

    @classmethod
    def of(cls, name: str, tensor: torch.Tensor) -> _Val:
        return cls(name, tensor, dispatcher.tensor_keyset_raw(tensor))

    def unwrapped(self, inner: torch.Tensor) -> _Val:
        return _Val.of(self.name, inner)


def _dispatch_values(bound: list[_Arg]) -> list[_Val]:
    """The tensors the boxed dispatcher reads keys from: Tensor, Tensor?, Tensor[], Tensor?[]."""
    out = []
    for arg in bound:
        if isinstance(arg.value, torch.Tensor):
            out.append(_Val.of(arg.name, arg.value))
        elif isinstance(arg.value, (list, tuple)) and "Tensor" in arg.type:
            out.extend(
                _Val.of(f"{arg.name}[{i}]", v)
                for i, v in enumerate(arg.value)
                if isinstance(v, torch.Tensor)
            )
    return out


# ------------------------------------------------------------------ the simulator


@dataclass
class _Kernel:
    """What a kernel does after it runs, and the state the next dispatch sees."""

    action: str  # as Step.action
    note: str
    keyset: int | None = None  # redispatch: the keyset passed on
    masked: int = 0  # redispatch: keys below the kernel that its mask drops
    include: int = 0  # call: keys added to the TLS include set
    uninclude: int = 0  # call: keys removed from the TLS include set
    exclude: int = 0  # keys the kernel's guard adds to the TLS exclude set
    tls: tuple[int, int] | None = None  # call: the TLS (include, exclude) to restore first
    args: list[_Val] | None = None  # the arguments it passes on, when they change
    pop_mode: bool = False
    pop_layer: bool = False
    assumed: bool = False


@dataclass
class _State:
    args: list[_Val]
    included: int
    excluded: int
    modes: list[Any]
    layers: list[tuple[str, int]]
    saved_tls: list[tuple[int, int]] = field(default_factory=list)  # functorch front entries
    excluded_by: list[tuple[int, str]] = field(default_factory=list)  # (bits, kernel key)
    assumed: bool = False


Origin = Callable[[str, "str | None"], str]


class _Simulator:
    """Walks one call through the dispatcher model, recording a Step per kernel."""

    def __init__(self, ref: OpRef, table: OperatorTable, bound: list[_Arg]) -> None:
        self.ref = ref
        self.table = table
        self.bound = bound
        self.cat: KeyCatalogue = catalogue()
        self.state = _State(
            args=_dispatch_values(bound),
            included=dispatcher.tls_included_raw(),
            excluded=dispatcher.tls_excluded_raw(),
            modes=dispatcher.dispatch_modes(),
            layers=dispatcher.functorch_layers(),
        )
        self.initial = dataclasses.replace(self.state, saved_tls=[], excluded_by=[])
        self.steps: list[Step] = []
        opdef = custom_op_state.custom_op_def(ref.qualname)
        self.custom_op = custom_op_state.custom_op_parts(opdef) if opdef is not None else None
        self.custom_op_sites = library_hooks.custom_op_sites(opdef) if opdef is not None else set()

    # -------------------------------------------------------------- driver

    def run(self) -> Resolution:
        cat = self.cat
        keyset, pending, origin_of = self._dispatch(via="dispatch")
        via = "dispatch"
        error: str | None = None
        while True:
            if len(self.steps) == _MAX_STEPS:
                error = f"the path did not end within {_MAX_STEPS} kernels (a kernel loop?)"
                break
            key = cat.highest(keyset) or "Undefined"
            entry = self.table.entry(key)
            skipped = tuple(s for s in pending if _above(cat, s.key, key))
            pending = [s for s in pending if s not in skipped]
            kernel = self._kernel(key, entry, keyset)
            previous = self.steps[-1].key if self.steps else None
            self.steps.append(
                Step(
                    key,
                    entry,
                    via,
                    origin_of(key, previous),
                    skipped,
                    kernel.action,
                    kernel.note,
                    self.state.assumed,
                )
            )
            if kernel.action == "error":
                error = kernel.note
                break
            if kernel.action in ("ends", "python"):
                break
            if kernel.args is not None:
                self.state.args = kernel.args
            if kernel.action == "redispatch":
                assert kernel.keyset is not None
                self._exclude(kernel.exclude, key)
                pending += [
                    Skip(k, "masked", f"{key}'s kernel redispatches past it")
                    for k in cat.names(kernel.masked)
                ]
                keyset, via = kernel.keyset, "redispatch"
                continue
            self._enter_call(kernel, key)
            keyset, pending, origin_of = self._dispatch(via="call", caller=key)
            via = "call"
        return Resolution(
            op=str(self.ref),
            schema=self.table.schema,
            steps=tuple(self.steps),
            error=error,
            inputs=tuple(
                DispatchInput(v.name, _describe_tensor(v.tensor), tuple(cat.names(v.raw)))
                for v in self.initial.args
            ),
            context=tuple(_context_words(cat, self.initial)),
            tls_included=tuple(cat.names(self.initial.included)),
            tls_excluded=tuple(cat.names(self.initial.excluded)),
        )

    def _exclude(self, bits: int, by: str) -> None:
        """Add keys to the TLS exclude set, remembering whose guard did it."""
        added = bits & ~self.state.excluded
        if added:
            self.state.excluded_by.append((added, by))
        self.state.excluded |= bits

    def _enter_call(self, kernel: _Kernel, caller: str) -> None:
        """Apply what a kernel sets up before calling the op again."""
        state = self.state
        if kernel.tls is not None:
            state.included, state.excluded = kernel.tls
            state.excluded_by.append((state.excluded & ~self.initial.excluded, caller))
        state.included = (state.included | kernel.include) & ~kernel.uninclude
        self._exclude(kernel.exclude, caller)
        if kernel.pop_mode:
            state.modes = state.modes[:-1]
        if kernel.pop_layer:
            state.layers = state.layers[:-1]
        state.assumed = state.assumed or kernel.assumed

    def _dispatch(self, via: str, caller: str | None = None) -> tuple[int, list[Skip], Origin]:
        """The keyset of a fresh dispatch, the keys it passes over, and where each key came from."""
        cat, state = self.cat, self.state
        args_raw = 0
        for value in state.args:
            args_raw |= value.raw
        candidates = args_raw | state.included
        after_tls = cat.minus(candidates, state.excluded)
        keyset = cat.minus(after_tls, self.table.fallthrough_mask(after_tls))
        kept = set(cat.names(keyset))
        skipped = []
        for name in cat.names(candidates):
            if name in kept:
                continue
            if after_tls & cat.functionality_raw(name):
                skipped.append(Skip(name, "fallthrough", "fallthrough for this op"))
            else:
                skipped.append(Skip(name, "excluded", _exclusion_reason(cat, name, state)))
        return keyset, skipped, _origin_function(cat, state, via, caller)

    # -------------------------------------------------------------- kernel behaviour

    def _kernel(self, key: str, entry: TableEntry, keyset: int) -> _Kernel:
        cat = self.cat
        if entry.kind == "missing":
            return _Kernel("error", _missing_message(str(self.ref), key))
        if entry.kind == "ambiguous":
            return _Kernel(
                "error",
                f"{self.ref} has a CompositeImplicitAutograd kernel and a kernel for a backend "
                "under AutogradOther: the dispatcher cannot pick one and raises. Register an "
                "Autograd kernel (or CompositeExplicitAutograd) to disambiguate.",
            )
        if entry.kind == "fallthrough":  # reachable only through a keyset built without the mask
            return self._redispatch(
                key, keyset, cat.minus(keyset, cat.functionality_raw(key)), "fallthrough: skipped"
            )
        if entry.alias in ("CompositeImplicitAutograd", "CompositeImplicitAutogradNestedTensor"):
            return _Kernel(
                "ends",
                f"decomposes into other operators ({entry.alias}); each dispatches on its own",
            )
        if key == "Undefined":
            return _Kernel("ends", f"runs {entry.source} (the Undefined slot: no backend key)")
        info = cat.by_name[key]
        handler = _HANDLERS.get(info.functionality) or _CATEGORY_HANDLERS.get(info.category)
        return handler(self, key, entry, keyset) if handler else self._below(key, entry, keyset)

    def _redispatch(self, key: str, keyset: int, mask: int, note: str, exclude: int = 0) -> _Kernel:
        masked = keyset & self.cat.full_after(key) & ~mask
        return _Kernel("redispatch", note, keyset=keyset & mask, masked=masked, exclude=exclude)

    def _below(self, key: str, entry: TableEntry, keyset: int) -> _Kernel:
        """The default: the kernel runs and redispatches to the keys below its own."""
        return self._redispatch(
            key, keyset, self.cat.full_after(key), f"runs {entry.source}, then redispatches below"
        )

    def _custom_op_site(self, entry: TableEntry) -> bool:
        """Whether custom_op made the entry's kernel (an opmagic session records a cell line)."""
        site = entry.site or ""
        return self.custom_op is not None and (
            "custom_ops.py" in site or site in self.custom_op_sites
        )

    # backend keys ------------------------------------------------------------------------

    def _backend(self, key: str, entry: TableEntry, keyset: int) -> _Kernel:
        if key == "Meta" and entry.kind == "fallback":
            return _Kernel("error", _no_fake_message(str(self.ref)))
        if (
            key == "Meta"
            and self._custom_op_site(entry)
            and self.custom_op["fake"] is None
            and not custom_op_state.custom_op_can_fake_trivially(self.ref.op_overload())
        ):
            return _Kernel("error", _no_fake_message(str(self.ref)))
        if entry.kind == "fallback":
            return _Kernel("ends", f"runs the {key} backend fallback {entry.source}")
        return _Kernel("ends", f"runs {entry.source}")

    def _backend_select(self, key: str, entry: TableEntry, keyset: int) -> _Kernel:
        """Factory ops: torch's generated kernels and custom_op's router pick the backend."""
        cat = self.cat
        generated = "RegisterBackendSelect.cpp" in (entry.site or "")
        if entry.kind != "kernel" or not (generated or self._custom_op_site(entry)):
            return self._below(key, entry, keyset)
        options = {a.name: a.value for a in self.bound}
        device = options.get("device")
        device = torch.device(device) if device is not None else torch.get_default_device()
        if not generated:
            if device.type not in self.custom_op["device_kernels"]:
                return _Kernel(
                    "error",
                    f"{self.ref} has no kernel for device '{device.type}', so its BackendSelect "
                    f"kernel raises. Register one with "
                    f"{self.ref.name}.register_kernel('{device.type}').",
                )
            target = dispatcher.dispatch_key_for_device(device.type)
            return _Kernel(
                "redispatch",
                f"custom_op's device router picks {target} from device={device}",
                keyset=cat.raw(target),
            )
        target = _backend_key(cat, device, options.get("layout"), options.get("dtype"))
        state = self.state
        chosen = cat.minus(cat.raw(target) | state.included, state.excluded)
        return _Kernel(
            "redispatch",
            f"picks {target} from the device, layout and dtype arguments and redispatches there",
            keyset=chosen & cat.full_after(key),
        )

    # autograd, ADInplaceOrView, autocast ------------------------------------------------

    def _autograd(self, key: str, entry: TableEntry, keyset: int) -> _Kernel:
        if entry.kind == "fallback":
            note = (
                "no autograd kernel for this op: the autograd fallback (mode "
                f"'{dispatcher.autograd_fallback_mode()}') runs the op below autograd; backward "
                "through its outputs warns or raises"
            )
        elif self._custom_op_site(entry) and self.custom_op["backward"] is None:
            note = (
                "custom_op's autograd kernel runs the op below autograd; it has no backward "
                "formula, so backward through the output raises (add one with register_autograd)"
            )
        else:
            what = entry.impl or f"the autograd kernel {entry.source}"
            note = f"{what}: records the backward node if an input requires grad, then redispatches"
        return self._redispatch(
            key,
            keyset,
            dispatcher.after_autograd_raw(),
            note,
            exclude=self.cat.category_raw("autograd"),
        )

    def _ad_inplace_or_view(self, key: str, entry: TableEntry, keyset: int) -> _Kernel:
        return self._redispatch(
            key,
            keyset,
            dispatcher.after_ad_inplace_or_view_raw(),
            f"runs {entry.source}: bumps version counters of mutated inputs or sets up the "
            "view, then redispatches",
            exclude=self.cat.raw("ADInplaceOrView"),
        )

    def _autocast(self, key: str, entry: TableEntry, keyset: int) -> _Kernel:
        if "autocast_mode.cpp" in (entry.site or "") or self._custom_op_site(entry):
            what = entry.impl or f"the autocast wrapper {entry.source}"
            return _Kernel(
                "call",
                f"{what}: casts floating-point inputs, then calls the op again with {key} off",
                exclude=self.cat.functionality_raw(key),
            )
        return self._below(key, entry, keyset)

    def _math_bit(self, key: str, entry: TableEntry, keyset: int) -> _Kernel:
        """Conjugate/Negative/ZeroTensor fallbacks materialise flagged inputs, then redispatch."""
        if entry.kind != "fallback":
            return self._below(key, entry, keyset)
        kernel = self._redispatch(
            key,
            keyset,
            self.cat.full_after(key),
            f"the {key} fallback materialises the flagged inputs, then redispatches",
        )
        bit = self.cat.functionality_raw(key)
        kernel.args = [_Val(v.name, v.tensor, v.raw & ~bit) for v in self.state.args]
        return kernel

    # functionalization and fake ----------------------------------------------------------

    def _functionalize(self, key: str, entry: TableEntry, keyset: int) -> _Kernel:
        args = [
            v.unwrapped(dispatcher.unwrap_functional(v.tensor))
            if dispatcher.is_functional_tensor(v.tensor)
            else v
            for v in self.state.args
        ]
        return _Kernel(
            "call",
            "functionalization unwraps FunctionalTensorWrappers and calls the op again "
            "with Functionalize off",
            exclude=self.cat.raw("Functionalize"),
            args=args,
        )

    def _fake(self, key: str, entry: TableEntry, keyset: int) -> _Kernel:
        fake = self.cat.functionality_raw("Fake")
        meta = dispatcher.tensor_keyset_raw(torch.empty(0, device="meta"))
        return _Kernel(
            "call",
            "the Fake fallback swaps fake inputs for meta tensors and calls the op again",
            exclude=fake,
            args=[_Val(v.name, v.tensor, meta) if v.raw & fake else v for v in self.state.args],
        )

    # Python, modes and subclasses --------------------------------------------------------

    def _python(self, key: str, entry: TableEntry, keyset: int) -> _Kernel:
        if entry.kind != "fallback":
            return self._below(key, entry, keyset)
        cat = self.cat
        # pythonFallback's guard: every key above Python is off while the handler runs
        handler_exclude = (
            dispatcher.full_keyset_raw() & ~cat.full_after("Python") & ~cat.raw("Python")
        ) & ~cat.backend_mask
        python_keys = cat.functionality_raw("Python") | cat.functionality_raw("PythonTLSSnapshot")
        if self.state.modes:
            mode = type(self.state.modes[-1])
            rule = custom_op_state.registered_torch_dispatch_rule(self.ref.qualname, mode)
            if rule is not None:
                return _Kernel(
                    "python",
                    f"continues in Python: the register_torch_dispatch rule for "
                    f"{mode.__name__} ({label_callable(rule)})",
                )
            if dispatcher.is_fake_mode(self.state.modes[-1]):
                return self._fake_mode(mode.__name__, handler_exclude | python_keys)
            return _Kernel(
                "call",
                f"continues in Python: {mode.__name__}.__torch_dispatch__ (the innermost "
                "TorchDispatchMode); when it calls func(*args, **kwargs), as modes usually do, "
                "dispatch starts again with the mode popped and every key above Python off",
                exclude=handler_exclude,
                uninclude=python_keys if len(self.state.modes) == 1 else 0,
                pop_mode=True,
                assumed=True,
            )
        python_bit = cat.functionality_raw("Python")
        subclasses = [  # what pythonFallback hands the call to: the first subclass argument
            type(v.tensor)
            for v in self.state.args
            if v.raw & python_bit and type(v.tensor) is not torch.Tensor
        ]
        if not subclasses:
            return _Kernel(
                "python",
                "continues in Python, but no mode or tensor subclass is there to handle it",
            )
        cls = subclasses[0]
        if dispatcher.is_fake_tensor_type(cls):
            return self._fake_mode("FakeTensor", handler_exclude | python_keys)
        rule = custom_op_state.registered_torch_dispatch_rule(self.ref.qualname, cls)
        where = (
            f"the register_torch_dispatch rule for {cls.__name__} ({label_callable(rule)})"
            if rule is not None
            else f"{cls.__qualname__}.__torch_dispatch__"
        )
        return _Kernel("python", f"continues in Python: {where}; what runs next is up to it")

    def _fake_mode(self, mode_name: str, exclude: int) -> _Kernel:
        if self.custom_op is not None:  # custom_op registers its own fake-impl wrapper
            fake = self.custom_op["fake"]
            if fake is None:
                if custom_op_state.custom_op_can_fake_trivially(self.ref.op_overload()):
                    return _Kernel(
                        "python",
                        f"continues in Python: {mode_name} runs custom_op's generated fake impl "
                        "(the op returns nothing)",
                    )
                return _Kernel("error", _no_fake_message(str(self.ref)))
        else:
            fake = custom_op_state.registered_fake_impl(self.ref.qualname)
        if fake is not None:
            return _Kernel(
                "python",
                f"continues in Python: {mode_name} runs the fake impl {label_callable(fake)}",
            )
        if self.table.has_alias_kernel("CompositeImplicitAutograd"):
            return _Kernel(
                "python",
                f"continues in Python: {mode_name} runs the CompositeImplicitAutograd "
                "decomposition, faking each op it calls",
            )
        return _Kernel(
            "call",
            f"continues in Python: {mode_name} has no fake impl for this op, so it calls the op "
            "again with Meta in the TLS include set (the Meta kernel runs) and Python off",
            exclude=exclude,
            include=self.cat.raw("Meta"),
        )

    def _python_dispatcher(self, key: str, entry: TableEntry, keyset: int) -> _Kernel:
        if entry.kind != "fallback":
            return self._below(key, entry, keyset)
        py = dispatcher.py_kernel_keys(self.ref.op_overload())
        extra = f"; Python kernels (py_impl) for {', '.join(py)} replace the C++ ones" if py else ""
        return _Kernel(
            "redispatch",
            f"the Python dispatcher (torch._ops) picks the next key in Python{extra}",
            keyset=self.cat.minus(keyset, self.cat.functionality_raw(key)),
        )

    # functorch ---------------------------------------------------------------------------

    def _front(self, key: str, entry: TableEntry, keyset: int) -> _Kernel:
        """Entering the innermost transform: only its own keys stay on (setup_dispatch_key_tls)."""
        if entry.kind != "fallback" or not self.state.layers:
            return self._below(key, entry, keyset)
        cat = self.cat
        transform, level = self.state.layers[-1]
        own = _transform_keys(cat, transform)
        front = cat.functionality_raw("FuncTorchDynamicLayerFrontMode")
        back = cat.functionality_raw("FuncTorchDynamicLayerBackMode")
        dynamic_layer_keys = (
            cat.minus(
                cat.full_after("FuncTorchDynamicLayerFrontMode"),
                cat.full_after("FuncTorchDynamicLayerBackMode"),
            )
            | front
        )
        dynamic_layer_keys = cat.minus(
            dynamic_layer_keys,
            cat.category_raw("autocast") | cat.functionality_raw("FuncTorchVmapMode") | back,
        )
        state = self.state
        state.saved_tls.append((state.included, state.excluded))
        include = cat.functionality_raw("FuncTorchVmapMode") if transform == "Vmap" else 0
        args = None
        if transform in ("Grad", "Jvp"):  # materializeGradWrappers: every input gets wrapped
            args = [
                v
                if dispatcher.grad_wrapper_level(v.tensor) == level
                else _Val.of(v.name, dispatcher.wrap_for_grad(v.tensor, level))
                for v in state.args
            ]
        return _Kernel(
            "call",
            f"enters the innermost torch.func transform ({transform.lower()}, level {level}): "
            "only its keys stay on, then it calls the op again",
            tls=(state.included | include, cat.minus(state.excluded | dynamic_layer_keys, own)),
            args=args,
        )

    def _batched(self, key: str, entry: TableEntry, keyset: int) -> _Kernel:
        if not self.state.layers:
            return self._below(key, entry, keyset)
        if self._custom_op_site(entry) and self.custom_op["vmap"] is not None:
            return _Kernel(
                "python",
                f"continues in Python: the vmap rule {label_callable(self.custom_op['vmap'])}",
            )
        level = self.state.layers[-1][1]
        args = [
            v.unwrapped(dispatcher.unwrap_functorch(v.tensor))
            if dispatcher.batched_level(v.tensor) == level
            else v
            for v in self.state.args
        ]
        if entry.kind == "fallback":
            what = (
                "no batching rule: vmap's fallback runs the op once per batch element "
                "(a slow for-loop) on the unbatched tensors"
            )
        else:
            what = f"the batching rule {entry.source} calls the op again on unbatched tensors"
        return _Kernel("call", what, args=args, exclude=self.cat.functionality_raw(key))

    def _back(self, key: str, entry: TableEntry, keyset: int) -> _Kernel:
        """Leaving a transform: restore the TLS its front saw, pop it, call the next one."""
        if entry.kind != "fallback" or not self.state.layers:
            return self._below(key, entry, keyset)
        cat, state = self.cat, self.state
        transform, level = state.layers[-1]
        included, excluded = (
            state.saved_tls.pop() if state.saved_tls else (state.included, state.excluded)
        )
        if len(state.layers) == 1:  # the last layer: the dynamic-layer keys go off
            included = cat.minus(
                included,
                cat.functionality_raw("FuncTorchDynamicLayerFrontMode")
                | cat.functionality_raw("FuncTorchDynamicLayerBackMode"),
            )
        args = state.args
        if transform in ("Grad", "Jvp"):
            args = [
                v.unwrapped(dispatcher.unwrap_functorch(v.tensor))
                if dispatcher.is_grad_wrapper(v.tensor)
                else v
                for v in args
            ]
        outer = "the next outer transform" if len(state.layers) > 1 else "the plain dispatcher"
        return _Kernel(
            "call",
            f"leaves the {transform.lower()} layer (level {level}): restores the thread-local "
            f"state and calls the op again for {outer}",
            tls=(included, excluded),
            args=args,
            pop_layer=True,
        )

    def _legacy_batched(self, key: str, entry: TableEntry, keyset: int) -> _Kernel:
        if entry.kind != "fallback":
            return self._below(key, entry, keyset)
        return _Kernel(
            "ends",
            "legacy torch._vmap_internals batching fallback: a per-sample loop that opmagic "
            "does not follow",
        )


_Handler = Callable[[_Simulator, str, TableEntry, int], _Kernel]
_HANDLERS: dict[str, _Handler] = {
    "BackendSelect": _Simulator._backend_select,
    "AutogradFunctionality": _Simulator._autograd,
    "AutogradOther": _Simulator._autograd,
    "AutogradNestedTensor": _Simulator._autograd,
    "ADInplaceOrView": _Simulator._ad_inplace_or_view,
    "Conjugate": _Simulator._math_bit,
    "Negative": _Simulator._math_bit,
    "ZeroTensor": _Simulator._math_bit,
    "Functionalize": _Simulator._functionalize,
    "Fake": _Simulator._fake,
    "Python": _Simulator._python,
    "PythonDispatcher": _Simulator._python_dispatcher,
    "FuncTorchDynamicLayerFrontMode": _Simulator._front,
    "FuncTorchDynamicLayerBackMode": _Simulator._back,
    "FuncTorchBatched": _Simulator._batched,
    "Batched": _Simulator._legacy_batched,
}
_CATEGORY_HANDLERS: dict[str, _Handler] = {
    "backend": _Simulator._backend,
    "autocast": _Simulator._autocast,
}


# ------------------------------------------------------------------ words and helpers


def _above(cat: KeyCatalogue, skipped: str, key: str) -> bool:
    """Whether ``skipped`` has a higher priority than ``key`` (so it was passed first)."""
    if key == "Undefined":
        return True
    return cat.by_name[skipped].priority < cat.by_name[key].priority


def _transform_keys(cat: KeyCatalogue, transform: str) -> int:
    """``keysForEnteringDynamicLayer``: the keys a torch.func transform keeps on."""
    if transform == "Vmap":
        return cat.functionality_raw("FuncTorchBatched") | cat.functionality_raw(
            "BatchedNestedTensor"
        )
    if transform in ("Grad", "Jvp"):
        return cat.category_raw("autograd") | cat.functionality_raw("ADInplaceOrView")
    if transform == "Functionalize":
        return cat.functionality_raw("Functionalize")
    return 0


def _origin_function(cat: KeyCatalogue, state: _State, via: str, caller: str | None) -> Origin:
    """A function naming what put a key into the keyset of this dispatch."""
    holders_of = [(v.name, set(cat.names(v.raw)), v.raw) for v in state.args]
    included = state.included
    suffix = f" (after {caller} called the op again)" if via == "call" and caller else ""

    def origin(key: str, previous: str | None) -> str:
        if key == "Undefined":
            return "no key at all: no tensor inputs and nothing in the TLS include set" + suffix
        info = cat.by_name[key]
        holders = [name for name, names, _ in holders_of if key in names]
        if not holders and info.backend is not None:  # functionality and backend from two args
            bit = info.raw & ~cat.backend_mask
            holders = [name for name, _, raw in holders_of if raw & bit]
        if holders:
            return f"argument{'s' if len(holders) > 1 else ''} {', '.join(holders)}" + suffix
        if info.raw & ~cat.backend_mask & included:
            return f"the TLS include set ({_INCLUDED_BECAUSE.get(key, 'a guard')})" + suffix
        return f"the keyset {previous or 'the caller'} passed on"

    return origin


_INCLUDED_BECAUSE = {
    "Python": "a TorchDispatchMode is active",
    "PythonTLSSnapshot": "a TorchDispatchMode is active",
    "FuncTorchDynamicLayerFrontMode": "a torch.func transform is active",
    "FuncTorchDynamicLayerBackMode": "a torch.func transform is active",
    "FuncTorchVmapMode": "inside torch.func.vmap",
    "PythonDispatcher": "enable_python_dispatcher() is active",
    "PreDispatch": "pre-dispatch tracing is active",
    "BackendSelect": "always on, for factory functions",
    "ADInplaceOrView": "always on",
    "Functionalize": "functionalization is on",
    "Meta": "FakeTensorMode runs Meta kernels",
}


def _exclusion_reason(cat: KeyCatalogue, key: str, state: _State) -> str:
    bit = cat.functionality_raw(key)
    for bits, kernel_key in reversed(state.excluded_by):
        if bits & bit:
            return f"turned off by {kernel_key}'s kernel for the rest of the call"
    info = cat.by_name[key]
    if info.category == "autocast":
        return f"excluded by TLS: autocast for {key.removeprefix('Autocast')} is off"
    if info.category == "autograd" or key == "ADInplaceOrView":
        if torch.is_inference_mode_enabled():
            return "excluded by TLS: inference_mode is on"
        return "excluded by TLS: a below-autograd guard is active"
    return "excluded by the TLS exclude set"


def _context_words(cat: KeyCatalogue, state: _State) -> list[str]:
    """The thread-local state that shapes dispatch, in words."""
    words = []
    for info in cat.runtime:
        if info.category == "autocast" and info.raw & ~cat.backend_mask & ~state.excluded:
            device = info.name.removeprefix("Autocast").lower()
            words.append(f"autocast on for {device} ({_autocast_dtype(device)})")
    if torch.is_inference_mode_enabled():
        words.append("inference_mode on")
    elif not torch.is_grad_enabled():
        words.append("no_grad: autograd kernels still run but record nothing")
    words.extend(f"TorchDispatchMode {type(mode).__name__} active" for mode in state.modes)
    words.extend(f"torch.func {t.lower()} (level {level})" for t, level in state.layers)
    if state.included & cat.functionality_raw("PythonDispatcher"):
        words.append("Python dispatcher enabled")
    return words


def _autocast_dtype(device: str) -> str:
    try:
        return str(torch.get_autocast_dtype(device)).removeprefix("torch.")
    except (RuntimeError, TypeError):  # a device type this torch cannot autocast
        return "unknown dtype"


def _describe_tensor(t: torch.Tensor) -> str:
    detail = [str(t.dtype).removeprefix("torch."), str(t.device)]
    if t.layout != torch.strided:
        detail.append(str(t.layout).removeprefix("torch."))
    detail.append(str(list(t.shape)) if not t.is_nested else "nested")
    flags = (
        ("requires_grad", t.requires_grad),
        ("inference", t.is_inference()),
        ("conj", t.is_conj()),
        ("neg", t.is_neg()),
    )
    detail.extend(name for name, on in flags if on)
    kind = "Tensor" if type(t) is torch.Tensor else type(t).__name__
    return f"{kind}({', '.join(detail)})"


def _backend_key(cat: KeyCatalogue, device: torch.device, layout: Any, dtype: Any) -> str:
    """``computeDispatchKey(dtype, layout, device)``: the backend a factory op runs on."""
    dense = dispatcher.dispatch_key_for_device(device.type)
    prefix = ""
    if layout == torch.sparse_coo:
        prefix = "Sparse"
    elif layout in (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc):
        prefix = "SparseCsr"
    elif isinstance(dtype, torch.dtype) and dtype in (
        torch.qint8,
        torch.quint8,
        torch.qint32,
        torch.quint4x2,
        torch.quint2x4,
    ):
        prefix = "Quantized"
    return prefix + dense if prefix + dense in cat.by_name else dense


def _missing_message(op: str, key: str) -> str:
    if key == "Undefined":
        return (
            f"no kernel can be found: the call has no tensor inputs to pick a backend from, "
            f"and {op} has no CompositeExplicitAutograd or CompositeImplicitAutograd kernel "
            "for the Undefined slot. Give it a tensor argument, a device argument with a "
            "BackendSelect kernel, or a CompositeExplicitAutograd kernel."
        )
    return (
        f"no kernel for {key}: {op} has no {key} kernel and {key} has no fallback, so the "
        f"dispatcher raises NotImplementedError (\"Could not run '{op}' with arguments from "
        f"the '{key}' backend\"). Register a {key} kernel, or one for an alias key that covers "
        "it (CompositeExplicitAutograd for every backend, Autograd for every autograd key)."
    )


def _no_fake_message(op: str) -> str:
    return (
        f"no Meta kernel or fake impl: {op} has neither, so running it on meta tensors raises "
        "NotImplementedError. Register a fake impl (torch.library.register_fake) or a Meta kernel."
    )
