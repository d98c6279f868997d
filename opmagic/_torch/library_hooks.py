"""Private torch APIs of the interception of ``torch.library`` registrations.

An opmagic session makes notebook cells re-runnable by owning every torch.library
registration a cell makes; the hooks here route those registrations to it.
"""

from __future__ import annotations

import abc
import functools
import inspect
import os
import sys
import warnings
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import torch

from . import custom_op_state
from .dispatcher import refresh_operators

_C = torch._C


# ---------------------------------------------------------------- registration routing
#
# An opmagic session makes notebook cells re-runnable by owning every torch.library
# registration a cell makes. While the hooks below are installed, a registration that the
# session's router captures is made in its own C++ ``torch::Library`` (a
# DispatcherRegistration) or recorded as a Python-side registration (fake impl,
# torch_dispatch rule, ...), so that each one can be removed and re-applied by itself.
# Registrations the router does not capture behave exactly as without opmagic.

Site = tuple[str, int]

# Library methods that register in Python rather than in the dispatcher, and their kinds
_PYTHON_REGISTRATIONS = {
    "_register_fake": "fake",
    "_register_torch_dispatch_rule": "torch_dispatch",
    "register_symm_mem_args": "symm_mem_args",
    "_register_effectful_op": "effect",
}
# the kinds of which torch keeps one per operator, a newer registration replacing the older
_REPLACED_PYTHON_REGISTRATIONS = ("symm_mem_args", "effect")


class RegistrationRouter(Protocol):
    """What the registration hooks consult; opmagic's session implements it."""

    def capture_site(self) -> Site | None:
        """``(filename, line)`` to record the registration being made under, or ``None``."""

    def make_room(self, registration: Registration) -> Callable[[bool], None]:
        """Remove what ``registration`` replaces; returns what to call with whether it applied."""

    def added(self, registration: Registration) -> None:
        """Record a registration that is now in effect."""

    def library_created(self, library: Any) -> None:
        """Record a ``torch.library.Library`` created by a captured call."""

    def custom_op_replacing(self, qualname: str, library: Any, opdef: Any) -> None:
        """``custom_op`` is about to define ``qualname`` again (raise to refuse)."""

    def opcheck_called(
        self, op: Any, args: tuple, kwargs: dict, test_utils: Any
    ) -> Callable[[Any], None]:
        """``torch.library.opcheck(op, args, kwargs, test_utils=...)`` is about to run; returns
        what to call with its outcomes (the dict opcheck returns) once it has run."""


class Registration(abc.ABC):
    """One torch.library registration that can be removed and re-applied by itself."""

    kind: str  # "def", "namespace", "impl", "fallback", "fake", "torch_dispatch", ...
    op: str | None  # "ns::name" or "ns::name.overload"; None for fallbacks
    key: str | None  # the dispatch key, or the torch_dispatch class name
    site: Site
    seq: int = 0  # order of registration in the session (set by the session)
    # Whether a newer registration with the same identity replaces this one. Where torch
    # keeps both instead (kernels stack in the dispatcher, fake impls in their holder: the
    # newest runs, and removing it brings the older back) or refuses the newer one (a second
    # fallback for a key, a second torch_dispatch rule), it is False: the session leaves it
    # to torch.
    exclusive: bool = True

    def __init__(self) -> None:
        self.state = "new"  # "applied", "removed" (can be re-applied) or "dead"

    @property
    def identity(self) -> tuple:
        """Registrations with equal identities replace each other."""
        return (self.kind, self.op, self.key)

    @property
    def defined_name(self) -> str:
        """The operator a def defines, or the namespace a namespace claim holds."""
        if self.kind not in ("def", "namespace") or self.op is None:
            raise TypeError(f"{self.describe()} defines nothing")
        return self.op

    @property
    def applied(self) -> bool:
        """Whether the registration is in effect now."""
        return self.state == "applied"

    @property
    def made_through(self) -> Any:
        """The ``torch.library.Library`` it was made through, if any (and still alive)."""
        return None

    def remove(self) -> None:
        """Undo the registration, keeping what is needed to re-apply it."""
        if self.state == "applied":
            self._undo()
            self.state = "removed"

    def reapply(self) -> None:
        """Make a removed registration again (a dead one stays dead)."""
        if self.state == "removed" and self._redo():
            self.state = "applied"

    def discard(self) -> None:
        """Undo the registration for good."""
        self.remove()
        self.state = "dead"

    @abc.abstractmethod
    def describe(self) -> str:
        """A few words on what was registered, naming the operator."""

    def summary(self) -> str:
        """What was registered, in a word or two, for listings grouped by operator."""
        if self.kind == "impl":
            return f"{self.key} kernel"
        if self.kind == "torch_dispatch":
            return f"torch_dispatch rule ({self.key})"
        if self.kind == "fallback":
            return f"{self.key} fallback"
        return {"fake": "fake impl", "namespace": "Library DEF"}.get(self.kind, self.kind)

    @abc.abstractmethod
    def _undo(self) -> None:
        """Take the registration out of torch."""

    @abc.abstractmethod
    def _redo(self) -> bool:
        """Put a removed registration back; ``False`` when that is no longer possible."""


class DispatcherRegistration(Registration):
    """A def, kernel, fallback or namespace claim held in a C++ library of its own."""

    def __init__(self, module: RoutedModule, method: str, args: tuple, site: Site) -> None:
        super().__init__()
        self.module, self.method, self.args, self.site = module, method, args, site
        self._library: Any = None
        self.result: Any = None
        self._python_impl_record: str | None = None  # what _undo took out of torch.library
        namespace = module.namespace
        if method == "define":
            self.kind, self.key = "def", None
            self.op = _qualify(namespace, args[0].split("(", 1)[0].strip())
        elif method == "claim":
            self.kind, self.op, self.key = "namespace", namespace, None
        elif method == "fallback":
            self.kind, self.op, self.key = "fallback", None, args[0]
        elif method == "impl_with_aoti_compile":
            self.kind, self.op, self.key = "impl", _qualify(args[0], args[1]), args[2]
        elif method == "register_ad_inplace_or_view_fallback":
            self.kind, self.op, self.key = "impl", _qualify(namespace, args[0]), "ADInplaceOrView"
        else:
            self.kind, self.op, self.key = "impl", _qualify(namespace, args[0]), args[1]
        self.exclusive = self.kind in ("def", "namespace")

    @property
    def made_through(self) -> Any:
        """The ``torch.library.Library`` it was made through, if it is still alive."""
        return self.module.library()

    @functools.cached_property
    def definition(self) -> tuple[str, str, frozenset]:
        """A def's normalised schema, alias analysis and tags (raises on a bad schema)."""
        schema, alias_analysis, tags = self.args
        parsed = _C.parse_schema(f"{self.module.namespace}::{schema.strip()}")
        return str(parsed), alias_analysis, frozenset(tags)

    def adopt(self, previous: DispatcherRegistration) -> None:
        """Take over an identical previous def instead of defining the operator again.

        The dispatcher keeps the operator's entry untouched, so every OpOverload and the
        dispatcher's own per-entry Python cache stay valid.
        """
        self._library, previous._library = previous._library, None
        self.result, self.state, previous.state = previous.result, "applied", "removed"
        self.module.own(self.defined_name, previous.module)

    def give_back(self, previous: DispatcherRegistration) -> None:
        """Undo ``adopt``: the previous def owns the operator again."""
        previous._library, self._library = self._library, None
        previous.state, self.state = ("applied" if previous._library else "removed"), "dead"
        previous.reapply()  # only when the adopted library was destroyed meanwhile
        previous.module.own(self.defined_name, self.module)
        self.module.registrations.pop(id(self), None)

    def apply(self) -> Any:
        """Make the registration for the first time; returns what torch's call returned."""
        if self.state == "applied":  # adopted
            return self.result
        library_kind = "DEF" if self.method == "claim" else self.module.registration_kind
        library = _C._dispatch_library(
            library_kind, self.module.namespace, self.module.dispatch_key, *self.site
        )
        result = None  # a namespace claim is the library itself
        try:
            with warnings.catch_warnings(record=True) as caught:
                if self.method != "claim":
                    result = getattr(library, self.method)(*self.args)
        except BaseException:
            library.reset()
            raise
        for warning in caught:  # torch's warnings (e.g. "Overriding ...") name the cell's line
            warnings.warn_explicit(warning.message, warning.category, *self.site)
        self._library, self.result = library, result
        self.state = "applied"
        return result

    def discard(self) -> None:
        """Undo for good and let the library's module forget it."""
        super().discard()
        self.module.registrations.pop(id(self), None)

    def _set_python_impl_record(self, present: bool) -> None:
        """Keep ``Library.impl``'s record of Python kernels (``torch.library._impls``, which its
        ``allow_override=False`` consults) as destroying the kernel's Library would: a removed
        kernel (a re-run cell's previous one) no longer counts as registered."""
        library = self.module.library()
        if self.method != "impl" or library is None:
            return
        record = f"{self.module.namespace}/{self.args[0].split('::')[-1]}/{self.args[1]}"
        if not present and record in library._op_impls:
            library._op_impls.discard(record)
            torch.library._impls.discard(record)
            self._python_impl_record = record
        elif present and self._python_impl_record == record:
            library._op_impls.add(record)
            torch.library._impls.add(record)

    def describe(self) -> str:
        if self.kind == "def":
            return f"def {self.module.namespace}::{self.args[0]}"
        if self.kind == "namespace":
            return f"namespace {self.op} (Library DEF)"
        if self.kind == "fallback":
            return f"{self.key} fallback for every operator"
        return f"{self.key} kernel for {self.op}"

    def _undo(self) -> None:
        self._library.reset()
        self._library = None
        self._set_python_impl_record(present=False)

    def _redo(self) -> bool:
        if self.module.destroyed:
            return False
        self.apply()
        self._set_python_impl_record(present=True)
        return True


class PythonRegistration(Registration):
    """A registration torch keeps in Python (fake impl, torch_dispatch rule, symm_mem args, effect).

    The handles torch returns go into the Library's ``_registration_handles``; removing one
    takes it out of that list again, so that the Library's own teardown never undoes it twice.
    """

    def __init__(self, library: Any, method: str, arguments: dict[str, Any], site: Site) -> None:
        super().__init__()
        self.library, self.method, self.arguments, self.site = library, method, arguments, site
        self.kind = _PYTHON_REGISTRATIONS[method]
        self.exclusive = self.kind in _REPLACED_PYTHON_REGISTRATIONS
        target = arguments["op_name"]
        target = target if isinstance(target, str) else target._name
        self.op: str = _qualify(library.ns, target)  # always an operator
        rule_class = arguments.get("torch_dispatch_class")
        self.key = None if rule_class is None else getattr(rule_class, "__name__", str(rule_class))
        self._rule_class = rule_class
        self._handles: list[Any] = []
        self._fake_kernel: Any = None

    @property
    def identity(self) -> tuple:
        if self._rule_class is not None:
            return (self.kind, self.op, self._rule_class)
        return (self.kind, self.op, None)

    def captured(self, handles: list[Any]) -> None:
        """Take the handles the first registration added to the Library."""
        self._handles = list(handles)
        if self.kind == "fake":
            self._fake_kernel = _fake_holder(self.op).kernel
        self.state = "applied"

    @property
    def made_through(self) -> Any:
        """The ``torch.library.Library`` it was made through."""
        return self.library

    def describe(self) -> str:
        return f"{self.summary()} for {self.op}"

    def _undo(self) -> None:
        registered = self.library._registration_handles
        for handle in self._handles:
            for index, candidate in enumerate(registered):
                if candidate is handle:
                    del registered[index]
                    handle.destroy()
                    break
        self._handles = []

    def _redo(self) -> bool:
        if self.library.m is None:
            return False
        before = len(self.library._registration_handles)
        if self.kind == "fake":
            self.library._registration_handles.append(_reinstate_fake(self.op, self._fake_kernel))
        else:
            _ORIGINALS[(torch.library.Library, self.method)](self.library, **self.arguments)
        self._handles = self.library._registration_handles[before:]
        return True


class PythonKernelRegistration(Registration):
    """A Python kernel for one dispatch key of an OpOverload (``OpOverload.py_impl``).

    The Python dispatcher (``torch.compile``, ``make_fx``) runs it instead of the C++ kernel;
    ``torch.library.register_autocast`` makes one beside its C++ kernel on plain operators.
    """

    kind = "py_kernel"

    def __init__(self, op_overload: Any, key: Any, kernel: Any, site: Site) -> None:
        super().__init__()
        self._op_overload = weakref.ref(op_overload)
        self._dispatch_key, self.kernel, self.site = key, kernel, site
        self.op, self.key = op_overload.name(), key.name

    def summary(self) -> str:
        return f"Python {self.key} kernel"

    def describe(self) -> str:
        return f"Python {self.key} kernel (py_impl) for {self.op}"

    def _undo(self) -> None:
        op_overload = self._op_overload()
        if op_overload is not None and op_overload.py_kernels.get(self._dispatch_key) is (
            self.kernel
        ):
            del op_overload.py_kernels[self._dispatch_key]
            op_overload._dispatch_cache.clear()

    def _redo(self) -> bool:
        op_overload = self._op_overload()
        if op_overload is None or self._dispatch_key in op_overload.py_kernels:
            return False
        op_overload.py_kernels[self._dispatch_key] = self.kernel
        op_overload._dispatch_cache.clear()
        return True


class RoutedModule:
    """Stands in for a Library's C++ module (``library.m``) while a session routes it.

    A captured registration gets a C++ library of its own; anything else reaches the
    Library's real module unchanged.
    """

    def __init__(self, library: Any, base: Any) -> None:
        self.library = weakref.ref(library)
        self.base = base
        kind, namespace, dispatch_key = library.kind, library.ns, library.dispatch_key
        self.namespace, self.dispatch_key = namespace, dispatch_key
        self.registration_kind = "IMPL" if kind == "IMPL" else "FRAGMENT"
        self.registrations: dict[int, DispatcherRegistration] = {}
        self.destroyed = False

    def define(self, schema: str, alias_analysis: str = "", tags: tuple = ()) -> Any:
        """``torch::Library::def``."""
        return self._route("define", schema, alias_analysis, tags)

    def impl(self, name: str, dispatch: str, func: Any, with_keyset: bool = False) -> Any:
        """``torch::Library::impl``."""
        return self._route("impl", name, dispatch, func, with_keyset)

    def fallback(self, dispatch: str, func: Any, with_keyset: bool = False) -> Any:
        """``torch::Library::fallback``."""
        return self._route("fallback", dispatch, func, with_keyset)

    def impl_with_aoti_compile(self, namespace: str, name: str, dispatch: str) -> Any:
        """The AOTI-compiled kernel registration."""
        return self._route("impl_with_aoti_compile", namespace, name, dispatch)

    def register_ad_inplace_or_view_fallback(self, name: str) -> Any:
        """custom_op's ADInplaceOrView kernel for mutating and view operators."""
        return self._route("register_ad_inplace_or_view_fallback", name)

    def own(self, op: str, other: RoutedModule) -> None:
        """Move a definition's Python bookkeeping (``Library._op_defs``) here from ``other``."""
        mine, theirs = self.library(), other.library()
        if theirs is not None:
            theirs._op_defs.discard(op)
        if mine is not None:
            mine._op_defs.add(op)

    def reset(self) -> None:
        """The Library is destroyed: everything made through it goes."""
        self.destroyed = True
        self.base.reset()
        for registration in list(self.registrations.values()):
            registration.discard()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)

    def _route(self, method: str, *args: Any) -> Any:
        """A captured call gets its own registration; any other reaches the real module."""
        router = _router
        site = router.capture_site() if router is not None else None
        if router is None or site is None:
            return getattr(self.base, method)(*args)
        return self.register(DispatcherRegistration(self, method, args, site), router)

    def register(self, registration: DispatcherRegistration, router: RegistrationRouter) -> Any:
        """Apply a registration after the router made room for it, and record it."""
        release = router.make_room(registration)
        try:
            result = registration.apply()
        except BaseException:
            release(False)
            raise
        release(True)
        self.registrations[id(registration)] = registration
        router.added(registration)
        return result


_router: RegistrationRouter | None = None
_ORIGINALS: dict[tuple[Any, str], Any] = {}
_routed_libraries: weakref.WeakSet = weakref.WeakSet()


def install_registration_hooks(router: RegistrationRouter) -> None:
    """Route torch.library registrations through ``router`` until ``remove_registration_hooks``.

    Patches ``torch.library.Library`` (construction and every registering method),
    ``custom_op``'s library factory, which would otherwise destroy an operator's previous
    library before the session can decide whether to keep it, and ``py_impl`` (Python
    kernels of OpOverloads); and ``torch.library.opcheck``, whose samples the router records.
    """
    global _router
    if _router is not None:
        raise RuntimeError("torch.library registrations are already routed by another session")
    from torch._library import custom_ops

    library = torch.library.Library
    patches: list[tuple[Any, str, Any]] = [
        (library, "__init__", _library_init),
        (custom_ops, "get_library_allowing_overwrite", _custom_op_library),
        (torch._ops.OperatorBase, "py_impl", _py_impl),
        (torch.library, "opcheck", _recording_opcheck(torch.library.opcheck)),
    ]
    for name in ("define", "impl", "fallback", "_impl_with_aoti_compile"):
        patches.append((library, name, _routing_entry(getattr(library, name))))
    for name in _PYTHON_REGISTRATIONS:
        if hasattr(library, name):
            patches.append((library, name, _python_registering(name, getattr(library, name))))
    for owner, name, replacement in patches:
        _ORIGINALS[(owner, name)] = getattr(owner, name)
        setattr(owner, name, replacement)
    _router = router


def remove_registration_hooks() -> None:
    """Undo ``install_registration_hooks``; routed Libraries get their own modules back."""
    global _router
    for (owner, name), original in _ORIGINALS.items():
        setattr(owner, name, original)
    _ORIGINALS.clear()
    for library in list(_routed_libraries):
        if isinstance(library.m, RoutedModule):
            library.m = library.m.base
    _routed_libraries.clear()
    _router = None


def _recording_opcheck(original: Callable[..., Any]) -> Callable[..., Any]:
    """``torch.library.opcheck`` that tells the router its operator and samples before it runs
    (they are copied then) and its outcomes after."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def opcheck(*args: Any, **kwargs: Any) -> Any:
        router = _router
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            bound = None  # opcheck raises its own error for the call
        finished = None
        if router is not None and bound is not None:
            arguments = bound.arguments
            finished = router.opcheck_called(
                arguments["op"],
                arguments["args"],
                arguments.get("kwargs") or {},
                arguments.get("test_utils", signature.parameters["test_utils"].default),
            )
        outcomes = original(*args, **kwargs)  # a failing test raises by default: none recorded
        if finished is not None:
            finished(outcomes)
        return outcomes

    return opcheck


def registration_machinery_paths() -> tuple[str, ...]:
    """Files of torch's registration API, which a call passes through on its way to a Library."""
    root = os.path.dirname(torch.library.__file__)
    return (os.path.join(root, "library.py"), os.path.join(root, "_library") + os.sep)


def _library_init(self: Any, ns: str, kind: str, dispatch_key: str = "") -> None:
    """``Library.__init__`` while routed: the C++ library records the real caller as its site."""
    caller = sys._getframe(1)
    router = _router
    site = router.capture_site() if router is not None else None
    claims = kind == "DEF" and site is not None
    _ORIGINALS[(torch.library.Library, "__init__")](
        self, ns, "FRAGMENT" if claims else kind, dispatch_key
    )
    self.m.reset()  # torch recorded this wrapper as the site; make it again with the caller's
    self.m = _C._dispatch_library(
        "FRAGMENT" if claims else kind,
        ns,
        dispatch_key,
        caller.f_code.co_filename,
        caller.f_lineno,
    )
    if site is None or router is None:
        return
    self.kind = kind
    module = _route_library(self)
    if claims:  # the namespace claim is a registration of its own, so a re-run can take it over
        module.register(DispatcherRegistration(module, "claim", (), site), router)
    router.library_created(self)


def _route_library(library: Any) -> RoutedModule:
    """Give a Library a RoutedModule (once); it is reset when the Library is collected."""
    if isinstance(library.m, RoutedModule):
        return library.m
    module = RoutedModule(library, library.m)
    library.m = module
    weakref.finalize(library, module.reset)
    _routed_libraries.add(library)
    return module


def _routing_entry(method: Any) -> Any:
    """A Library method that routes the Library first when a captured call uses it."""

    @functools.wraps(method)
    def entry(self: Any, *args: Any, **kwargs: Any) -> Any:
        """Route the Library, then run torch's method."""
        router = _router
        if router is not None and self.m is not None and router.capture_site() is not None:
            _route_library(self)
        return method(self, *args, **kwargs)

    return entry


def _python_registering(name: str, method: Any) -> Any:
    """A Library method that registers in Python, recording what a captured call adds."""
    signature = inspect.signature(method)

    @functools.wraps(method)
    def registering(self: Any, *args: Any, **kwargs: Any) -> Any:
        """Run torch's method one frame deeper, recording the handles a captured call adds."""
        bound = signature.bind(self, *args, **kwargs)
        if "_stacklevel" in signature.parameters:  # torch finds its caller this many frames up
            bound.arguments["_stacklevel"] = bound.arguments.get("_stacklevel", 1) + 1
        router = _router
        site = router.capture_site() if router is not None else None
        if site is None or router is None:
            return method(*bound.args, **bound.kwargs)
        arguments = {k: v for k, v in bound.arguments.items() if k != "self"}
        registration = PythonRegistration(self, name, arguments, site)
        before = len(self._registration_handles)
        release = router.make_room(registration)
        try:
            result = method(*bound.args, **bound.kwargs)
        except BaseException:
            release(False)
            raise
        release(True)
        registration.captured(self._registration_handles[before:])
        router.added(registration)
        return result

    return registering


def _py_impl(self: Any, key: Any) -> Any:
    """``OperatorBase.py_impl`` while routed: a cell's Python kernel for a dispatch key of an
    OpOverload is recorded, so that re-runs and ``%unload_ext`` take it away again."""
    register = _ORIGINALS[(torch._ops.OperatorBase, "py_impl")](self, key)
    if not isinstance(self, torch._ops.OpOverload) or not isinstance(key, _C.DispatchKey):
        return register  # modes, subclasses and functorch transforms: not tracked

    @functools.wraps(register)
    def registering(kernel: Any) -> Any:
        """Register ``kernel`` with torch, as the running cell's registration when captured."""
        router = _router
        site = router.capture_site() if router is not None else None
        if site is None or router is None:
            return register(kernel)
        registration = PythonKernelRegistration(self, key, kernel, site)
        release = router.make_room(registration)
        try:
            result = register(kernel)
        except BaseException:
            release(False)
            raise
        release(True)
        registration.state = "applied"
        router.added(registration)
        return result

    return registering


def _custom_op_library(namespace: str, name: str) -> Any:
    """custom_op's library factory: a captured re-definition keeps the previous library."""
    from torch._library import custom_ops

    router = _router
    if router is None or router.capture_site() is None:
        return _ORIGINALS[(custom_ops, "get_library_allowing_overwrite")](namespace, name)
    qualname = f"{namespace}::{name}"
    router.custom_op_replacing(
        qualname, custom_ops.OPDEF_TO_LIB.get(qualname), custom_ops.OPDEFS.get(qualname)
    )
    library = torch.library.Library(namespace, "FRAGMENT")
    custom_ops.OPDEF_TO_LIB[qualname] = library
    return library


def _qualify(namespace: str, name: str) -> str:
    """``ns::name[.overload]`` from a name a registration call received."""
    return name if "::" in name else f"{namespace}::{name}"


def _fake_holder(qualname: str) -> Any:
    """The registry entry holding an operator's fake impls."""
    from torch._library import simple_registry

    return simple_registry.singleton.find(qualname).fake_impl


def _reinstate_fake(qualname: str, kernel: Any) -> Any:
    """Put a removed fake impl back on top of the operator's fake impls; returns its handle."""
    from torch._library.utils import RegistrationHandle

    holder = _fake_holder(qualname)
    holder.kernels.append(kernel)
    return RegistrationHandle(lambda: holder.kernels.remove(kernel))


def take_cached_overloads(qualname: str) -> Any | None:
    """Remove an operator's cached ``torch.ops`` packet (with its OpOverloads); returns it.

    Called when the operator's dispatcher entry is about to go, so that new lookups make new
    objects; ``restore_cached_overloads`` brings the old objects back if the entry returns.
    """
    namespace, name = qualname.split("::", 1)
    name = name.split(".", 1)[0]
    ops_namespace = vars(torch.ops).get(namespace)
    packet = None if ops_namespace is None else vars(ops_namespace).pop(name, None)
    if ops_namespace is not None and packet is not None and name in ops_namespace._dir:
        ops_namespace._dir.remove(name)
    refresh_operators([qualname])
    return packet


def restore_cached_overloads(qualname: str, packet: Any) -> None:
    """Point a packet taken by ``take_cached_overloads`` and its OpOverloads at the operator's
    re-created dispatcher entry, and cache it again, so that every object (and every kernel
    closure) holding the old ones works.
    """
    for overload in list(vars(packet).values()):
        if isinstance(overload, torch._ops.OpOverload):
            name, _, overload_name = overload._name.partition(".")
            found = _C._get_operation_overload(name, overload_name)
            if found is None:
                continue
            shortcut = custom_op_state.has_dispatch_shortcut(overload)
            overload._op, overload._op_dk, overload._tags = found
            overload._op.__module__ = packet.__module__
            overload._schema = _C._get_schema(name, overload_name)
            vars(overload).pop("_handle", None)
            custom_op_state.rebind_dispatch_shortcut(overload, shortcut)
    torch._ops._refresh_packet(packet)
    namespace, name = qualname.split("::", 1)
    name = name.split(".", 1)[0]
    ops_namespace = getattr(torch.ops, namespace)
    setattr(ops_namespace, name, packet)
    if name not in ops_namespace._dir:
        ops_namespace._dir.append(name)


def destroy_library(library: Any) -> None:
    """Destroy a Library and drop torch's references to it (keep-alive list, custom_op table)."""
    from torch._library import custom_ops

    defs = set(library._op_defs)
    if library.m is not None:
        library._destroy()
    keep_alive = torch.library._keep_alive
    keep_alive[:] = [kept for kept in keep_alive if kept is not library]
    for qualname, owner in list(custom_ops.OPDEF_TO_LIB.items()):
        if owner is library:
            del custom_ops.OPDEF_TO_LIB[qualname]
    torch.library._defs.difference_update(defs)
    refresh_operators(defs)


def is_torch_held_library(library: Any) -> bool:
    """Whether torch keeps a Library alive itself (made by a torch.library helper or custom_op)."""
    from torch._library import custom_ops

    return any(kept is library for kept in torch.library._keep_alive) or any(
        owner is library for owner in custom_ops.OPDEF_TO_LIB.values()
    )


def custom_op_sites(opdef: Any) -> set[str]:
    """Sites, as the dispatcher prints them, of kernels made through a custom op's own Library.

    A session records custom_op's registrations at the cell line that made them, so the
    site alone no longer says that custom_op made a kernel; its Library does.
    """
    module = getattr(getattr(opdef, "_lib", None), "m", None)
    if not isinstance(module, RoutedModule):
        return set()
    return {
        f"registered at {filename}:{line}"
        for filename, line in (r.site for r in module.registrations.values() if r.applied)
    }


def is_library(value: Any) -> bool:
    """Whether a value is a ``torch.library.Library``."""
    return isinstance(value, torch.library.Library)
