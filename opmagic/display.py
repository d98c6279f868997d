"""The one display base: result objects hold facts, ``opmagic.view`` registers how they look.

A result class derives from :class:`Displayable` and never imports a view. Each view module
registers renderers for the types it draws, per *form*, with :func:`renders`:

- ``"text"``: ``str(obj)``, what terminals show;
- ``"pretty"``: what IPython's plain display shows (the text view when none is registered);
- ``"html"``: ``obj._repr_html_()``, what notebooks show;
- ``"mimebundle"``: ``obj._repr_mimebundle_(include, exclude)``, e.g. a picture as
  ``image/svg+xml`` beside its ``text/plain`` form;
- any other name, e.g. ``"diagram"`` or ``"frame"``: what :meth:`Displayable.view` returns.

Renderers are looked up along the type's MRO, as IPython's ``formatters.for_type`` does, so a
subclass is drawn like its base unless a view registers something for it.

View modules are imported when first needed: :func:`renders_on_first_use` names the module
that registers a type's renderers (by the type's dotted path), and the first lookup for that
type imports it. So ``import opmagic`` loads no view (nor graphviz, pandas, ...) until a
result is displayed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

Renderer = Callable[..., Any]
_R = TypeVar("_R", bound=Renderer)

_renderers: dict[tuple[type, str], Renderer] = {}
# "package.module.QualName" of a type -> the module that registers its renderers, not yet imported
_first_use: dict[str, str] = {}


def renders(cls: type, form: str) -> Callable[[_R], _R]:
    """Register the decorated function as the ``form`` renderer of ``cls`` (and subclasses)."""

    def register(renderer: _R) -> _R:
        """Record ``renderer`` and return it unchanged."""
        _renderers[(cls, form)] = renderer
        return renderer

    return register


def renders_on_first_use(module: str, types: Iterable[str]) -> None:
    """Have ``module`` imported (it registers renderers) the first time a renderer of one of
    ``types`` is looked up; each type is named by its dotted path, ``"package.module.Class"``,
    so that naming it imports nothing."""
    for path in types:
        _first_use[path] = module


def renderer_for(obj: Any, form: str) -> Renderer | None:
    """The renderer registered for ``obj``'s type (or its nearest base) and ``form``, after
    importing the view module of any type on the way that has one still to import."""
    for cls in type(obj).__mro__:
        if _first_use:
            _import_views_of(cls)
        found = _renderers.get((cls, form))
        if found is not None:
            return found
    return None


def _import_views_of(cls: type) -> None:
    """Import the module that registers ``cls``'s renderers, if it is still to be imported
    (forgotten only once imported: a thread looking meanwhile waits for the import)."""
    path = f"{cls.__module__}.{cls.__qualname__}"
    module = _first_use.get(path)
    if module is not None:
        importlib.import_module(module)
        _first_use.pop(path, None)


class NoRendererError(LookupError):
    """A view was asked of an object no view module registered that form for."""


class Displayable:
    """Base of opmagic's result objects: text, HTML and pictures come from registered views."""

    __slots__ = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # IPython's pretty printer uses the first class of the MRO that defines __repr__ (a
        # dataclass does) unless that class defines _repr_pretty_ itself: give each one ours.
        super().__init_subclass__(**kwargs)
        if "_repr_pretty_" not in vars(cls):
            cls._repr_pretty_ = Displayable._repr_pretty_

    def view(self, form: str, **options: Any) -> Any:
        """The ``form`` view of this object (``"diagram"``, ``"frame"``, ...), with options."""
        renderer = renderer_for(self, form)
        if renderer is None:
            raise NoRendererError(
                f"No {form!r} view is registered for {type(self).__name__}: import opmagic "
                "(which tells this module where opmagic.view draws each type) before asking "
                "for one."
            )
        return renderer(self, **options)

    def __str__(self) -> str:
        renderer = renderer_for(self, "text")
        return renderer(self) if renderer is not None else object.__repr__(self)

    def _repr_html_(self) -> str | None:
        """Notebook display (IPython calls it); ``None`` when no HTML view is registered."""
        renderer = renderer_for(self, "html")
        return renderer(self) if renderer is not None else None

    def _repr_mimebundle_(
        self, include: Iterable[str] | None = None, exclude: Iterable[str] | None = None
    ) -> dict[str, str] | None:
        """The registered mime bundle (a picture and its text); ``None``: none is registered."""
        renderer = renderer_for(self, "mimebundle")
        return renderer(self, include=include, exclude=exclude) if renderer is not None else None

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """IPython's plain display: the pretty view, else the text view."""
        if cycle:
            printer.text(f"{type(self).__name__}(...)")
            return
        renderer = renderer_for(self, "pretty")
        printer.text(renderer(self) if renderer is not None else str(self))
