"""``opmagic.explore()``: the ipywidgets front of :class:`~opmagic.view.explorer.ExplorerModel`.

An operator search (Enter takes the best match), an input builder made from the schema,
context toggles, the answer in one line (the path, and what its last kernel does), and
tabs for the call's path diagram, the operator's table, the step-by-step explanation, its
kernels and an opcheck run. Rows wrap and diagrams shrink to the width they get, so the
explorer works in a narrow notebook (1024x768 with JupyterLab's side panel open) without
inner scrollbars. Every change redraws the path; the SVG is rendered in the kernel, so a
saved notebook keeps it. Handlers turn any failure into a message shown where the answer
is, the last diagram kept (dimmed) so the page does not jump.
"""

from __future__ import annotations

import contextlib
import functools
import time
import warnings
from collections.abc import Callable, Iterator
from html import escape
from typing import Any

import ipywidgets as widgets

from ...errors import OpmagicError
from ...verify.samples import DTYPES, LAYOUTS, VIEWS, ArgumentSlot, devices
from ..resolution import answer_line, steps_html
from ..style import FAIL_COLOUR, styled
from ..table import listing_html
from .model import ExplorerModel, find_ops, namespaces, warm_up

ALL_NAMESPACES = "(all namespaces)"
AUTOCAST_OFF = "off"
TABS = ("path", "table", "steps", "kernels", "trace", "opcheck")
_AUTO = {"width": "auto"}
_SPACED = {"width": "auto", "margin": "2px 12px 2px 2px"}  # a checkbox before the next one
_COMPACT = {"description_width": "initial"}  # labels as wide as their text
_WRAPPING = {"flex_flow": "row wrap", "align_items": "center"}
_TRACE_HINT = (
    "trace runs the call on the sample inputs, in the contexts above, and shows every "
    "operator it made: the path of each, and the calls its kernels made in turn. When an "
    "input requires grad, the call's backward runs too: its autograd nodes and their calls."
)
_STALE = "opacity:0.35"  # the last diagram, kept while the inputs do not make a call
_TOGGLES = (  # (CallContext field, checkbox label)
    ("no_grad", "no_grad"),
    ("inference_mode", "inference_mode"),
    ("vmap", "vmap"),
    ("fake", "FakeTensorMode"),
    ("logging", "logging mode"),
)


def _guarded(handler: Callable[..., None]) -> Callable[..., None]:
    """A widget handler whose failures show up as a message, not as a traceback in the log."""

    @functools.wraps(handler)
    def run(self: Explorer, *args: Any) -> None:
        try:
            handler(self, *args)
        except Exception as exc:  # the widget's boundary: every failure becomes a message
            self._show_message(f"{type(exc).__name__}: {exc}")

    return run


class Explorer:
    """The dispatch explorer widget; display it (it is the value of ``opmagic.explore()``)."""

    def __init__(self, op: Any = None) -> None:
        warm_up()
        self.model = ExplorerModel(op)
        self._loading = False  # set while the explorer itself changes widgets
        self.namespace = widgets.Dropdown(
            options=[ALL_NAMESPACES, *namespaces()],
            description="namespace",
            style=_COMPACT,
            layout={"width": "230px"},
        )
        self.search = widgets.Text(
            value=self.model.qualname or (op if isinstance(op, str) else ""),
            placeholder="search operators: add, aten::mm, sacle… (Enter: the first match)",
            description="operator",
            continuous_update=True,
            style=_COMPACT,
            layout={"width": "360px", "max_width": "100%"},
        )
        self.matches = widgets.Select(rows=4, layout={"width": "420px", "max_width": "100%"})
        self.overload = widgets.Dropdown(
            description="overload", style=_COMPACT, layout={"width": "200px"}
        )
        self.inputs = widgets.VBox()
        self.toggles = {
            name: widgets.Checkbox(description=label, indent=False, layout=_SPACED)
            for name, label in _TOGGLES
        }
        autocast_devices = [d for d in devices() if d != "meta"]
        self.autocast = widgets.Dropdown(
            options=[AUTOCAST_OFF, *autocast_devices],
            description="autocast",
            style=_COMPACT,
            layout={"width": "140px"},
        )
        self.show_all = widgets.Checkbox(description="all keys", indent=False, layout=_SPACED)
        self.message = _classed(widgets.HTML(), "opmagic-message")
        self.summary = _classed(widgets.HTML(), "opmagic-summary")
        self.path_view = _classed(widgets.HTML(), "opmagic-path")
        self.table_view = _classed(widgets.HTML(), "opmagic-table")
        self.steps_view = widgets.HTML()
        self.kernels_view = _classed(widgets.HTML(), "opmagic-kernels")
        self.trace_button = widgets.Button(description="trace this call", icon="play")
        self.trace_view = _classed(widgets.HTML(_TRACE_HINT), "opmagic-trace")
        self.opcheck_button = widgets.Button(description="run opcheck", icon="check")
        self.opcheck_view = widgets.HTML(
            "opcheck runs the operator on the sample inputs (without the contexts) and tests "
            "its schema, autograd registration, fake impl and AOT dispatch. Meant for custom ops."
        )
        self.tabs = widgets.Tab(
            children=[
                self.path_view,
                self.table_view,
                self.steps_view,
                self.kernels_view,
                widgets.VBox([self.trace_button, self.trace_view]),
                widgets.VBox([self.opcheck_button, self.opcheck_view]),
            ]
        )
        for index, title in enumerate(TABS):
            self.tabs.set_title(index, title)
        self.widget = widgets.VBox(
            [
                widgets.HTML("<b>opmagic dispatch explorer</b>"),
                widgets.HBox([self.search, self.namespace, self.overload], layout=_WRAPPING),
                self.matches,
                widgets.HTML("<i>inputs</i>"),
                self.inputs,
                widgets.HBox(
                    [*self.toggles.values(), self.autocast, self.show_all], layout=_WRAPPING
                ),
                self.message,
                self.summary,
                self.tabs,
            ]
        )
        self.widget.add_class("opmagic-explorer")
        self._last_path = ""  # the last diagram drawn, dimmed while the inputs are bad
        self._update_matches()
        self._load_operator()
        self.namespace.observe(self._on_search, "value")
        self.search.observe(self._on_search, "value")
        with warnings.catch_warnings():  # Enter: ipywidgets 8 still sends it, and only here
            warnings.simplefilter("ignore", DeprecationWarning)
            self.search.on_submit(self._on_submit)
        self.matches.observe(self._on_match, "value")
        self.overload.observe(self._on_overload, "value")
        for name, box in self.toggles.items():
            box.observe(functools.partial(self._on_toggle, name), "value")
        self.autocast.observe(self._on_autocast, "value")
        self.show_all.observe(self._on_show_all, "value")
        self.trace_button.on_click(self._on_trace)
        self.opcheck_button.on_click(self._on_opcheck)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        """Display as the widget; where no widget can show (a terminal), say what to use."""
        bundle = self.widget._repr_mimebundle_(**kwargs)
        data = bundle[0] if isinstance(bundle, tuple) else bundle
        if isinstance(data, dict) and "text/plain" in data:
            data["text/plain"] = repr(self)
        return bundle

    def __repr__(self) -> str:
        return (
            f"opmagic explorer of {self.model.op_name or 'no operator'}: a Jupyter widget, shown "
            "by JupyterLab or Notebook. In a terminal use opmagic.resolve(op, *args) or "
            "python -m opmagic resolve OP --args '...'."
        )

    # ------------------------------------------------------------------ handlers

    @_guarded
    def _on_search(self, _change: Any = None) -> None:
        """The search text or the namespace changed: list the matching operators."""
        self._update_matches()

    @_guarded
    def _on_submit(self, _text: Any = None) -> None:
        """Enter in the search: take the first match (the list is already up to date)."""
        self._update_matches()
        if self.matches.options:
            self.matches.value = self.matches.options[0]

    @_guarded
    def _on_match(self, change: dict) -> None:
        """An operator was picked from the matches: load it."""
        if not self._loading and change["new"] and change["new"] != self.model.qualname:
            self.model.select(change["new"])
            self._load_operator()

    @_guarded
    def _on_overload(self, change: dict) -> None:
        """Another overload was picked: rebuild the inputs for its schema."""
        if not self._loading and change["new"] is not None and change["new"] != self.model.overload:
            self.model.select_overload(change["new"])
            self._load_operator(keep_overloads=True)

    @_guarded
    def _on_input(self) -> None:
        """An input control changed (the slot already holds the new value): redraw."""
        self.refresh()

    @_guarded
    def _on_toggle(self, name: str, change: dict) -> None:
        """A context checkbox changed: resolve in the new context."""
        self.model.set_context(**{name: change["new"]})
        self.refresh()

    @_guarded
    def _on_autocast(self, change: dict) -> None:
        """The autocast device changed (or autocast went off)."""
        self.model.set_context(autocast=None if change["new"] == AUTOCAST_OFF else change["new"])
        self.refresh()

    @_guarded
    def _on_show_all(self, change: dict) -> None:
        """The "all keys" box changed: redraw both diagrams."""
        self.model.show_all = change["new"]
        self._draw_table()
        self.refresh()

    @_guarded
    def _on_trace(self, _button: Any) -> None:
        """Run the call on the sample inputs in the contexts and show every operator it made
        (the op's own error is shown in the trace)."""
        _fill(self.trace_view, "tracing…", self.model.trace, lambda traced: traced._repr_html_())

    @_guarded
    def _on_opcheck(self, _button: Any) -> None:
        """Run opcheck on the sample inputs and show each test's result."""
        _fill(self.opcheck_view, "running opcheck…", self.model.opcheck, _opcheck_html)

    # ------------------------------------------------------------------ drawing

    def refresh(self) -> None:
        """Build the inputs, resolve in the contexts, redraw the answer, path and steps."""
        start = time.perf_counter()
        outcome = self.model.outcome()
        if outcome.resolution is None:
            self._show_message(outcome.message or "")
            return
        resolution = outcome.resolution
        self._last_path = _fitting(resolution.diagram(self.model.show_all).svg())
        self.path_view.value = self._last_path
        self.steps_view.value = steps_html(resolution)
        self.message.value = ""
        colour = FAIL_COLOUR if resolution.error else "inherit"
        self.summary.value = (
            f"<div style='white-space:normal;line-height:1.4'><b>{escape(self.model.op_name)}</b>: "
            f"<span style='color:{colour}'>{escape(answer_line(resolution))}</span> "
            f"<span style='color:#888'>(updated in "
            f"{(time.perf_counter() - start) * 1000:.0f} ms)</span></div>"
        )

    def _show_message(self, text: str) -> None:
        """Show why there is no path where the answer was; keep the last diagram, dimmed,
        so the page keeps its height."""
        self.message.value = _error_html(text)
        self.summary.value = ""
        self.path_view.value = (
            f"<div class='opmagic-stale' style='{_STALE}'>{self._last_path}</div>"
            if self._last_path
            else ""
        )
        self.steps_view.value = ""

    def _update_matches(self) -> None:
        """List the operators matching the search, keeping the selected one selected."""
        self._update_namespaces()
        namespace = None if self.namespace.value == ALL_NAMESPACES else self.namespace.value
        found = find_ops(self.search.value, namespace)
        current = self.model.qualname
        with self._quiet():
            self.matches.options = found
            self.matches.value = current if current in found else None

    def _update_namespaces(self) -> None:
        """Offer the namespaces there are now: cells run after the explorer opened add some."""
        options = (ALL_NAMESPACES, *namespaces())
        if tuple(self.namespace.options) != options:
            chosen = self.namespace.value
            self.namespace.options = options
            self.namespace.value = chosen if chosen in options else ALL_NAMESPACES

    def _load_operator(self, keep_overloads: bool = False) -> None:
        """Show the selected operator: overloads, input builder, table, kernels, path."""
        model = self.model
        if not keep_overloads:
            with self._quiet():
                self.overload.options = [(o or "default", o) for o in model.overloads]
                self.overload.value = model.overload if model.overloads else None
        self.inputs.children = [_slot_row(slot, self._on_input) for slot in model.slots]
        self.opcheck_view.value = ""
        self._draw_table()
        self.refresh()

    @contextlib.contextmanager
    def _quiet(self) -> Iterator[None]:
        """Change widgets without their handlers reacting."""
        self._loading = True
        try:
            yield
        finally:
            self._loading = False

    def _draw_table(self) -> None:
        """Redraw the table diagram and the kernels tab of the selected operator."""
        table = self.model.table()
        if table is None:
            self.table_view.value = self.kernels_view.value = ""
            return
        self.table_view.value = _fitting(table.diagram(self.model.show_all).svg())
        self.kernels_view.value = styled(listing_html(table, self.model.show_all))


def _classed(widget: widgets.Widget, name: str) -> widgets.Widget:
    """``widget`` with one more CSS class."""
    widget.add_class(name)
    return widget


def _fitting(svg: str) -> str:
    """An SVG that shrinks to its pane's width (never wider than drawn), keeping its shape."""
    return svg.replace("<svg ", '<svg style="max-width:100%;height:auto" ', 1)


def _fill(
    view: widgets.HTML, busy: str, compute: Callable[[], Any], render: Callable[[Any], str]
) -> None:
    """Show ``busy`` in a tab's ``view`` while ``compute()`` runs, then its result as
    ``render`` draws it, or why there is none: opmagic's refusal, or the op's own error (the
    op's code ran and failed: that is the answer)."""
    view.value = busy
    try:
        result = compute()
    except OpmagicError as exc:
        view.value = _error_html(str(exc))
        return
    except Exception as exc:
        view.value = _error_html(f"{type(exc).__name__}: {exc}")
        return
    view.value = render(result)


def _opcheck_html(results: dict[str, str]) -> str:
    """opcheck's tests, each with its result (green on success)."""
    rows = "".join(
        f"<tr><td>{escape(test)}</td><td style='color:"
        f"{'#2e7d32' if result == 'SUCCESS' else '#c62828'}'>{escape(result)}</td></tr>"
        for test, result in results.items()
    )
    return f"<table>{rows}</table>"


def _error_html(text: str) -> str:
    """A message in red, line breaks kept."""
    return (
        f"<div style='color:{FAIL_COLOUR}; white-space:pre-wrap; line-height:1.4'>"
        f"{escape(text, quote=False)}</div>"
    )


def _slot_row(slot: ArgumentSlot, changed: Callable[[], None]) -> widgets.Widget:
    """The input widgets of one argument, writing into the slot and calling ``changed``;
    the row wraps when the notebook is narrow."""
    label = widgets.HTML(
        f"<code>{escape(slot.name)}: {escape(slot.parameter.type)}</code>",
        layout={"width": "auto", "min_width": "140px", "margin": "0 8px 0 0"},
    )
    if slot.kind == "value":
        text = widgets.Text(continuous_update=False, layout={"width": "200px"})
        row = widgets.HBox([label, _bound(text, slot, "value", changed)], layout=_WRAPPING)
        return _classed(row, f"opmagic-arg-{slot.name}")
    spec = slot.tensor
    controls = [
        (widgets.Dropdown(options=devices(), layout={"width": "80px"}), "device"),
        (widgets.Dropdown(options=list(DTYPES), layout={"width": "100px"}), "dtype"),
        (
            widgets.Checkbox(description="requires_grad", indent=False, layout=_AUTO),
            "requires_grad",
        ),
        (widgets.Dropdown(options=LAYOUTS, layout={"width": "90px"}), "layout"),
        (
            widgets.Dropdown(
                options=VIEWS, description="view", style=_COMPACT, layout={"width": "120px"}
            ),
            "view",
        ),
        (
            widgets.Text(
                description="shape",
                continuous_update=False,
                style=_COMPACT,
                layout={"width": "140px"},
            ),
            "shape",
        ),
    ]
    row = [_bound(widget, spec, attribute, changed) for widget, attribute in controls]
    if slot.optional:
        present = widgets.Checkbox(description="pass a tensor", indent=False, layout=_AUTO)
        row.insert(0, _bound(present, slot, "present", changed))
    return _classed(widgets.HBox([label, *row], layout=_WRAPPING), f"opmagic-arg-{slot.name}")


def _bound(
    widget: widgets.ValueWidget, target: Any, attribute: str, changed: Callable[[], None]
) -> widgets.ValueWidget:
    """``widget`` showing ``target.attribute`` and writing changes back (then ``changed()``).

    It gets the CSS class ``opmagic-<attribute>`` (``opmagic-device``), for styling and for
    finding it in a page.
    """
    widget.value = getattr(target, attribute)
    _classed(widget, f"opmagic-{attribute}")

    def write(change: dict) -> None:
        setattr(target, attribute, change["new"])
        changed()

    widget.observe(write, "value")
    return widget
