"""How a trace looks: a tree of calls (text and collapsible HTML), a call graph, a DataFrame,
and the surprises summary. Everything here formats facts ``opmagic.dispatch.trace`` recorded.

Each call shows as ``op  key → key → key  kernel kind  time``: the keys whose kernels ran, how
the kernel that ended the path was registered, and the call's wall time (children included,
tracer overhead taken out). The tree is cut into sections where the code goes from forward
to backward and back (a training step: forward, backward, the optimizer's step), and inside
them into the ``nn.Module`` each run of calls came from; an autograd node, a compiled region
and a compilation show as one row over the calls they ran.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import TYPE_CHECKING

import graphviz

from ..dispatch.trace import (
    AutogradNode,
    Compilation,
    CompiledRegion,
    Surprises,
    Trace,
    TracedCall,
    TracedGroup,
    ValueSummary,
)
from ..dispatch.trace.compare import TraceComparison, TracedValue
from ..display import Displayable, renders
from .diagram import Diagram, dot_label
from .layout import wrap
from .style import FAIL_COLOUR, KIND_COLOURS, KIND_FILLS, styled

if TYPE_CHECKING:
    import pandas

    from ..dispatch.trace.result import TracedItem

FRAME_COLUMNS = [
    "depth",
    "phase",
    "node",
    "module",
    "op",
    "path",
    "kernel_kind",
    "source",
    "time_us",
    "inputs",
    "outputs",
    "kernel_source",
    "thread",
    "error",
]
DIAGRAM_CALLS = 150  # calls a diagram draws before it says how many it left out
ARROW = " → "
WARMUP_HINT = "trace(..., warmup=True) leaves it out"
EMPTY = "The traced code made no operator calls."
ACCUMULATES = "adds the gradient into a leaf tensor's .grad"


def _time(ns: int) -> str:
    """A duration for people: ``12 µs``, ``1.3 ms``, ``2.1 s``."""
    if ns < 1_000_000:
        return f"{ns / 1000:.0f} µs"
    if ns < 1_000_000_000:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.2f} s"


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _headline(trace: Trace) -> list[str]:
    """The summary line, then what the traced code raised (on its own line so it reads whole)."""
    total = len(trace)
    made = sum(1 for item in trace.calls if isinstance(item, TracedCall))
    text = (
        f"trace: {_plural(total, 'operator call')} ({made} made by the traced code itself"
        f"{_groups_counted(trace)}), {_time(trace.time_ns)} "
        f"(tracing added {_time(trace.overhead_ns)})"
    )
    lines = [text]
    once = [call for call in trace.walk() if call.first_call]
    if once:
        lines.append(
            f"⚠ {_plural(len(once), 'call')} paid a one-time cost (marked ⚠; {WARMUP_HINT})"
        )
    if trace.exception is not None:
        lines.append(f"raised {type(trace.exception).__name__}: {trace.exception}")
    return lines


def _groups_counted(trace: Trace) -> str:
    """``, 9 autograd nodes, 1 compiled region`` for the groups a trace holds."""
    nodes, regions = len(trace.nodes()), len(trace.regions())
    parts = [_plural(nodes, "autograd node")] if nodes else []
    parts += [_plural(regions, "compiled region")] if regions else []
    return "".join(f", {part}" for part in parts)


def _kind_of(call: TracedCall) -> str:
    """The colour key of a call's final kernel (``TableEntry.kind``, or missing on error)."""
    if call.error:
        return "missing"
    return call.kernel.kind if call.kernel is not None else "missing"


# ------------------------------------------------------------------ what each item says


def _label(item: TracedItem) -> str:
    """The name column of an item: a call's op, a group's name."""
    if isinstance(item, TracedCall):
        return item.op
    if isinstance(item, Compilation):
        return f"compiling {item.name}"
    return item.name


def _detail(item: TracedItem) -> str:
    """The middle column of an item: a call's path and kernel kind, what a group is."""
    if isinstance(item, TracedCall):
        path = ARROW.join(item.path) or "(no kernel ran)"
        return f"{path}  [{_short_kind(item.kernel_kind)}]"
    if isinstance(item, AutogradNode):
        made_by = item.forward
        if made_by is None:
            return ACCUMULATES if item.name.endswith("AccumulateGrad") else "autograd node"
        text = f"backward of {made_by.op}"
        module = _module_label(made_by) if made_by is not None else None
        return text + (f" in {module}" if module else "")
    if isinstance(item, CompiledRegion):
        breaks = item.graph_breaks
        return "compiled region" + (f", {_plural(breaks, 'graph break')}" if breaks else "")
    if isinstance(item, Compilation):
        return f"{_plural(item.calls, 'call')} while compiling, not shown"
    return item.kind


def _extra_lines(item: TracedItem) -> list[str]:
    """What an item says under its row: an error, a one-time cost, a formula, notes."""
    lines = []
    if isinstance(item, TracedCall):
        if item.error:
            lines.append(f"✗ {item.error}")
        if item.first_call:
            lines.append(f"⚠ one-time cost: {item.first_call} ({WARMUP_HINT})")
    elif isinstance(item, AutogradNode) and item.formula is not None:
        lines.append(f"formula: {item.formula}")
    elif isinstance(item, CompiledRegion):
        lines += [f"{op}: {fate}" for op, fate in item.custom_ops]
    if item.thread:
        lines.append(f"on thread {item.thread}")
    return lines


def _module_label(call: TracedCall | None) -> str | None:
    """``self_attn.out_proj (Linear)``, ``(TransformerEncoderLayer)`` for the outermost
    module's own code; None outside modules."""
    if call is None or call.module_type is None:
        return None
    return f"{call.module} ({call.module_type})" if call.module else f"({call.module_type})"


def _item_module(item: TracedItem) -> TracedCall | None:
    """The call whose module an item is shown under: a call itself, a node's forward call."""
    if isinstance(item, TracedCall):
        return item
    if isinstance(item, AutogradNode):
        return item.forward
    return None


def _phase(item: TracedItem) -> str:
    """``backward`` for autograd nodes and the calls they made, else ``forward``."""
    if isinstance(item, AutogradNode):
        return "backward"
    return item.phase if isinstance(item, TracedCall) else "forward"


@dataclass
class _Section:
    """A run of top-level items of one phase."""

    phase: str
    items: list[TracedItem]

    @property
    def title(self) -> str:
        nodes = sum(1 for item in self.items if isinstance(item, AutogradNode))
        calls = sum(sum(1 for _ in item.walk()) for item in self.items)
        time_ns = sum(item.time_ns for item in self.items)
        counted = f"{_plural(nodes, 'autograd node')}, " if nodes else ""
        return f"{self.phase}: {counted}{_plural(calls, 'call')}, {_time(time_ns)}"


def _sections(items: Sequence[TracedItem]) -> list[_Section]:
    """The top-level items cut where the phase changes (one section without a backward)."""
    sections: list[_Section] = []
    for item in items:
        phase = _phase(item)
        if not sections or sections[-1].phase != phase:
            sections.append(_Section(phase, []))
        sections[-1].items.append(item)
    return sections


def _module_runs(
    items: Sequence[TracedItem], phase: str
) -> Iterator[tuple[str | None, list[TracedItem]]]:
    """Consecutive items run by the same module: ``(module label or None, items)``. In a
    backward section an item of no module (a leaf's AccumulateGrad) stays in the run."""
    current: tuple[str | None, list[TracedItem]] | None = None
    for item in items:
        label = _module_label(_item_module(item))
        if label is None and phase == "backward" and current is not None:
            label = current[0]
        if current is None or current[0] != label:
            if current is not None:
                yield current
            current = (label, [])
        current[1].append(item)
    if current is not None:
        yield current


@dataclass
class _ModuleFold:
    """The items a module (and the modules inside it) ran, one after the other."""

    path: tuple[str, ...]  # the module's path, split at its dots; () the outermost
    module_type: str | None = None
    entries: list[TracedItem | _ModuleFold] = field(default_factory=list)

    @property
    def title(self) -> str:
        name = ".".join(self.path)
        kind = self.module_type or ("outermost module" if not name else None)
        label = f"{name} ({kind})" if name and kind else name or f"({kind})"
        items = list(self.items())
        nodes = sum(1 for item in items if isinstance(item, AutogradNode))
        calls = sum(sum(1 for _ in item.walk()) for item in items)
        counted = f"{_plural(nodes, 'autograd node')}, " if nodes else ""
        return f"{label}: {counted}{_plural(calls, 'call')}"

    def items(self) -> Iterator[TracedItem]:
        for entry in self.entries:
            if isinstance(entry, _ModuleFold):
                yield from entry.items()
            else:
                yield entry


def _module_folds(items: Sequence[TracedItem], phase: str) -> list[TracedItem | _ModuleFold]:
    """The items nested in folds by the module each came from (a node: its forward call's),
    as the modules nest: ``(TransformerEncoderLayer)`` around ``self_attn`` around
    ``self_attn.out_proj``. Items of no module close the folds, except in a backward section
    (a leaf's AccumulateGrad belongs with the node before it)."""
    top: list[TracedItem | _ModuleFold] = []
    open_folds: list[_ModuleFold] = []
    for item in items:
        call = _item_module(item)
        if call is None or call.module is None:
            if phase == "backward" and open_folds:
                open_folds[-1].entries.append(item)
            else:
                open_folds.clear()
                top.append(item)
            continue
        path = tuple(call.module.split(".")) if call.module else ()
        while open_folds and open_folds[-1].path != path[: len(open_folds[-1].path)]:
            open_folds.pop()
        depth = len(open_folds[-1].path) + 1 if open_folds else 0
        for end in range(depth, len(path) + 1):
            fold = _ModuleFold(path[:end])
            (open_folds[-1].entries if open_folds else top).append(fold)
            open_folds.append(fold)
        open_folds[-1].module_type = open_folds[-1].module_type or call.module_type
        open_folds[-1].entries.append(item)
    return top


# ------------------------------------------------------------------ text


def _short_kind(kind: str) -> str:
    """``via CompositeImplicitAutograd`` -> ``CompositeImplicit``: kinds short enough for a row."""
    return kind.removeprefix("via ").removesuffix("Autograd") or kind


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


def _text_rows(items: Sequence[TracedItem]) -> Iterator[tuple[str, TracedItem]]:
    """Rows of a forest: top-level items flush left, their subtrees drawn below them."""
    for item in items:
        yield _label(item), item
        yield from _subtree(item.children, "")


def _subtree(items: Sequence[TracedItem], prefix: str) -> Iterator[tuple[str, TracedItem]]:
    for index, item in enumerate(items):
        last = index == len(items) - 1
        yield prefix + ("└─ " if last else "├─ ") + _label(item), item
        yield from _subtree(item.children, prefix + ("   " if last else "│  "))


def calls_text(items: Sequence[TracedItem], width: int | None = None) -> list[str]:
    """One line per call or group (tree, name, path or what it is, time), fitted to ``width``
    columns; sections and modules as heading lines where a trace has them."""
    width = width or shutil.get_terminal_size().columns
    rows = list(_text_rows(items))
    if not rows:
        return [EMPTY]
    name_width = min(max(len(name) for name, _ in rows), max(24, width // 3))
    sections = _sections(items)
    headed = len(sections) > 1
    lines = []
    for section in sections:
        if headed:
            lines.append(_clip(f"── {section.title} ", width).ljust(width, "─")[:width])
        shown = None
        for module, run in _module_runs(section.items, section.phase):
            if module is not None or shown is not None:
                lines.append(_clip(f"· in {module}" if module else "· outside modules", width))
            shown = module
            for name, item in _text_rows(run):
                lines += _text_row(name, item, name_width, width)
    return lines


def _text_row(name: str, item: TracedItem, name_width: int, width: int) -> list[str]:
    """An item's line (name, detail, time right-aligned) and the lines under it."""
    time = _time(item.time_ns).rjust(9)
    marked = "⚠ " if isinstance(item, TracedCall) and item.first_call else ""
    middle_width = max(10, width - name_width - len(time) - 4)
    left = _clip(name, name_width).ljust(name_width)
    middle = _clip(marked + _detail(item), middle_width).ljust(middle_width)
    lines = [f"{left}  {middle}  {time}"]
    indent = " " * (len(name) - len(name.lstrip(" │├└─")) + 3)
    lines += [_clip(f"{indent}{line}", width) for line in _extra_lines(item)]
    notes = item.notes if isinstance(item, TracedCall) else ()
    lines += [_clip(f"{indent}▸ {note}", width) for note in notes]
    return lines


@renders(Trace, "text")
def trace_text(trace: Trace, width: int | None = None) -> str:
    """The headline, the call tree, then the surprises, fitted to the terminal's width."""
    width = width or shutil.get_terminal_size().columns
    headline = [wrapped for line in _headline(trace) for wrapped in wrap(line, width)]
    lines = [*headline, *calls_text(trace.calls, width)]
    lines += [_clip(f"▸ {note}", width) for note in trace.notes]
    surprises = trace.surprises()
    if len(surprises):
        lines += ["", surprises_text(surprises, width)]
    return "\n".join(lines)


@renders(TracedCall, "text")
@renders(TracedGroup, "text")
def call_text(call: TracedItem, width: int | None = None) -> str:
    """One call (or group) and the calls under it, as the trace's tree shows them."""
    width = width or shutil.get_terminal_size().columns
    rows = list(_text_rows([call]))
    name_width = min(max(len(name) for name, _ in rows), max(24, width // 3))
    return "\n".join(
        line for name, item in rows for line in _text_row(name, item, name_width, width)
    )


@renders(Surprises, "text")
def surprises_text(surprises: Surprises, width: int | None = None) -> str:
    """``kind  op ×count  detail`` per surprise, fitted to ``width``."""
    width = width or shutil.get_terminal_size().columns
    if not len(surprises):
        return "surprises: none"
    kind_width = max(len(s.kind) for s in surprises)
    labels = [f"{s.op}{f' ×{s.count}' if s.count > 1 else ''}" for s in surprises]
    op_width = min(max(len(label) for label in labels), max(20, width // 3))
    lines = ["surprises:"]
    for surprise, label in zip(surprises, labels, strict=True):
        head = f"  {surprise.kind:<{kind_width}}  {_clip(label, op_width):<{op_width}}  "
        detail = wrap(surprise.detail, max(20, width - len(head))) or [""]
        lines.append(head + detail[0])
        lines += [" " * len(head) + more for more in detail[1:]]
    return "\n".join(lines)


# ------------------------------------------------------------------ HTML


def _main_html(item: TracedItem) -> tuple[str, str]:
    """The left part of an item's row (what it is) and its plain text, for the tooltip."""
    if not isinstance(item, TracedCall):
        kind = f'<span class="dim">[{escape(item.kind)}]</span>'
        text = f"{_label(item)}  {_detail(item)}"
        return (
            f'<span class="op">{escape(_label(item))}</span> {escape(_detail(item))} {kind}',
            text,
        )
    colour = KIND_COLOURS.get(_kind_of(item), "#000")
    path = ARROW.join(escape(k) for k in item.path) or '<span class="dim">(no kernel ran)</span>'
    source = escape(item.source)
    marked = '<span class="once" title="one-time cost">⚠</span> ' if item.first_call else ""
    text = f"{item.op} ({item.inputs}) {ARROW.join(item.path)} [{item.kernel_kind}] {item.source}"
    if item.called_from is not None:
        text += f"\ncalled from {item.called_from}"
    return (
        f'{marked}<span class="op">{escape(item.op)}</span> <span class="dim">'
        f"({escape(item.inputs)})</span> {path} "
        f'<span style="color:{colour}">[{escape(item.kernel_kind)}]</span> '
        f'<span class="dim">{source}</span>',
        text,
    )


def _row_html(item: TracedItem, tag: str) -> str:
    """An item's row: what it is, cut with an ellipsis where the pane ends, then its time
    (always in view; the whole row is the tooltip)."""
    main, text = _main_html(item)
    return (
        f'<{tag} class="row"><span class="main" title="{escape(text)}">{main}</span>'
        f'<span class="time">{_time(item.time_ns)}</span></{tag}>'
    )


def _under_html(item: TracedItem) -> str:
    """The lines under an item's row: its error, one-time cost, formula, custom ops, thread."""
    lines = []
    for line in _extra_lines(item):
        colour = f' style="color:{FAIL_COLOUR}"' if line.startswith("✗") else ""
        lines.append(f'<div class="under"{colour}>{escape(line)}</div>')
    return "".join(lines)


def _note_html(note: object) -> str:
    """A note (a Triton launch, ...) as a line of the tree: its HTML view, else its text."""
    shown = note._repr_html_() if isinstance(note, Displayable) else None
    return f'<div class="call">▸ {shown or escape(str(note))}</div>'


def _item_html(item: TracedItem) -> str:
    css = "call" if isinstance(item, TracedCall) else "group"
    under = _under_html(item)
    notes = "".join(_note_html(note) for note in getattr(item, "notes", ()))
    if not item.children:
        return f'<div class="{css} leaf">{_row_html(item, "div")}{under}{notes}</div>'
    children = notes + "".join(_item_html(c) for c in item.children)
    return (
        f'<details class="{css}">{_row_html(item, "summary")}{under}'
        f'<div class="calls">{children}</div></details>'
    )


def _items_html(items: Sequence[TracedItem]) -> str:
    """Top-level items, in sections (forward, backward) and module folds where the trace
    has them."""
    sections = _sections(items)
    parts = []
    for section in sections:
        body = "".join(_entry_html(entry) for entry in _module_folds(section.items, section.phase))
        if len(sections) > 1:
            body = (
                f'<details class="section" open="open"><summary>{escape(section.title)}'
                f"</summary>{body}</details>"
            )
        parts.append(body)
    return "".join(parts)


def _entry_html(entry: TracedItem | _ModuleFold) -> str:
    """An item, or a module's fold around the items (and folds) it ran."""
    if not isinstance(entry, _ModuleFold):
        return _item_html(entry)
    rows = "".join(_entry_html(inner) for inner in entry.entries)
    time_ns = sum(item.time_ns for item in entry.items())
    return (
        f'<details class="module" open="open"><summary class="row"><span class="main">'
        f'{escape(entry.title)}</span><span class="time">{_time(time_ns)}</span></summary>'
        f'<div class="calls">{rows}</div></details>'
    )


@renders(Trace, "html")
def trace_html(trace: Trace) -> str:
    """The headline, the surprises, then the calls as a collapsible tree (op → path → kernel)
    in sections (forward, backward) and module runs."""
    surprises = trace.surprises()
    summary = surprises_html(surprises, wrapped=False) if len(surprises) else ""
    calls = _items_html(trace.calls) or f'<div class="dim">{EMPTY}</div>'
    calls += "".join(_note_html(note) for note in trace.notes)
    headline = "".join(f'<div class="headline">{escape(line)}</div>' for line in _headline(trace))
    return styled(f'{headline}{summary}<div class="calls-pane">{calls}</div>')


@renders(TracedCall, "html")
@renders(TracedGroup, "html")
def call_html(call: TracedItem) -> str:
    """One call (or group) with the calls under it, collapsible."""
    return styled(f'<div class="calls-pane">{_item_html(call)}</div>')


@renders(Surprises, "html")
def surprises_html(surprises: Surprises, wrapped: bool = True) -> str:
    """The surprises as a table: kind, operator, how many calls, what happened."""
    if not len(surprises):
        body = '<div class="dim">surprises: none</div>'
    else:
        rows = "".join(
            f"<tr><td>{escape(s.kind)}</td><td>{escape(s.op)}</td><td>{s.count}</td>"
            f"<td>{escape(s.detail)}</td></tr>"
            for s in surprises
        )
        body = (
            '<details open="open"><summary>surprises</summary><table class="wraps"><tr>'
            f"<th>kind</th><th>op</th><th>calls</th><th>what happened</th></tr>{rows}"
            "</table></details>"
        )
    return styled(body) if wrapped else body


# ------------------------------------------------------------------ DataFrame


def _outputs_text(call: TracedCall) -> str | None:
    """A call's output summaries (``trace(..., values=True)``) in one line."""
    if call.outputs is None:
        return None
    shown = []
    for output in call.outputs:
        if isinstance(output, ValueSummary):
            shown.append(str(output))
        elif output is not None:  # a tensor list's
            shown.append("[" + ", ".join(str(v) for v in output) + "]")
    return "; ".join(shown)


@renders(Trace, "frame")
def trace_frame(trace: Trace) -> pandas.DataFrame:
    """A row per operator call, depth-first: depth, phase and autograd node, module (its path;
    the outermost module's own code as ``(ItsClass)``), op, path, kernel kind, where in the
    user's code it was made (``source``), time (µs), inputs, outputs (with values), the
    kernel's registration (``kernel_source``), thread, error."""
    import pandas as pd

    rows = [
        (
            call.depth,
            call.phase,
            call.node.name if call.node is not None else None,
            call.module or (f"({call.module_type})" if call.module_type else None),
            call.op,
            ARROW.join(call.path),
            call.kernel_kind,
            str(call.called_from) if call.called_from is not None else None,
            call.time_ns / 1000,
            call.inputs,
            _outputs_text(call),
            call.source,
            call.thread,
            call.error,
        )
        for call in trace.walk()
    ]
    return pd.DataFrame(rows, columns=FRAME_COLUMNS)


# ------------------------------------------------------------------ comparison


def _comparison_headline(comparison: TraceComparison) -> str:
    a, b = comparison.labels
    only = [
        f"{count} only in {label}"
        for count, label in zip(comparison.only, comparison.labels, strict=True)
        if count
    ]
    counted = f"{_plural(comparison.compared, 'call')} compared" + "".join(
        f", {part}" for part in only
    )
    tolerance = f"rtol {comparison.rtol:g}, atol {comparison.atol:g}"
    if comparison.first is None:
        return f"compare_traces({a}, {b}): {counted}; every output agrees ({tolerance})."
    index = comparison.first[0].index + 1
    return (
        f"compare_traces({a}, {b}): {counted}; the first divergence is call {index} of "
        f"{a}: {comparison.difference} ({tolerance})."
    )


def _comparison_rows(comparison: TraceComparison) -> list[tuple[str, str, str]]:
    """``(what, a's, b's)`` rows of the diverging pair."""
    assert comparison.first is not None
    left, right = comparison.first

    def facts(value: TracedValue) -> list[str]:
        call = value.call
        return [
            " › ".join(value.where),
            f"{ARROW.join(call.path) or '(no kernel ran)'}  [{call.kernel_kind}]",
            _module_label(call) or "—",
            str(call.called_from) if call.called_from is not None else "—",
            call.inputs or "—",
            _outputs_text(call) or "—",
        ]

    names = ("where", "path", "module", "called from", "inputs", "outputs")
    return list(zip(names, facts(left), facts(right), strict=True))


@renders(TraceComparison, "text")
def comparison_text(comparison: TraceComparison, width: int | None = None) -> str:
    """The headline, then the diverging call of each trace side by side, fitted to ``width``."""
    width = width or shutil.get_terminal_size().columns
    lines = wrap(_comparison_headline(comparison), width)
    if comparison.first is None:
        return "\n".join(lines)
    head = 13
    column = max(20, (width - head - 2) // 2)
    rows = [("", *comparison.labels), *_comparison_rows(comparison)]
    for name, left, right in rows:
        lefts, rights = wrap(left, column) or [""], wrap(right, column) or [""]
        for i in range(max(len(lefts), len(rights))):
            cell = lefts[i] if i < len(lefts) else ""
            other = rights[i] if i < len(rights) else ""
            label = name if i == 0 else ""
            lines.append(f"{label:<{head}}{cell:<{column}}  {other}".rstrip())
    return "\n".join(lines)


@renders(TraceComparison, "html")
def comparison_html(comparison: TraceComparison) -> str:
    """The headline, then the diverging call of each trace side by side, in a table that
    wraps to the width it is given."""
    headline = f'<div class="headline">{escape(_comparison_headline(comparison))}</div>'
    if comparison.first is None:
        return styled(headline)
    a, b = comparison.labels
    rows = "".join(
        f"<tr><th>{escape(name)}</th><td>{escape(left)}</td><td>{escape(right)}</td></tr>"
        for name, left, right in _comparison_rows(comparison)
    )
    return styled(
        f'{headline}<table class="wraps"><tr><th></th><th>{escape(a)}</th><th>{escape(b)}</th>'
        f"</tr>{rows}</table>"
    )


# ------------------------------------------------------------------ diagram


class _CallGraph:
    """The call forest as a ``graphviz.Digraph``: calls as boxes, decompositions and groups
    (autograd nodes, compiled regions) as nested clusters.

    Edges are added at the top level: an edge inside a cluster would pull its caller in.
    """

    def __init__(self, graph: graphviz.Digraph, limit: int) -> None:
        self.graph = graph
        self.edges: list[tuple[str, str, dict[str, str]]] = []
        self.count = 0
        self.clusters = 0
        self.limit = limit
        self.left_out = 0

    def node(self, call: TracedCall, target: graphviz.Digraph) -> str | None:
        if self.count >= self.limit:
            self.left_out += sum(1 for _ in call.walk())
            return None
        self.count += 1
        name = f"c{self.count}"
        kind = _kind_of(call)
        lines = (
            call.op,
            " → ".join(call.path) or "(no kernel ran)",
            f"{call.kernel_kind}, {_time(call.time_ns)}",
        )
        target.node(
            name,
            label=dot_label(lines),
            fillcolor=KIND_FILLS.get(kind, "#fff"),
            color=FAIL_COLOUR if call.error else "#616161",
        )
        return name

    def calls(
        self, calls: Sequence[TracedItem], parent: str | None, target: graphviz.Digraph
    ) -> None:
        previous = None
        for call in calls:
            if not isinstance(call, TracedCall):
                self.group(call, parent, target)
                previous = None
                continue
            name = self.node(call, target)
            if name is None:
                continue
            if parent is not None:
                self.edges.append((parent, name, {}))
            elif previous is not None:  # the traced code's own calls, in order
                self.edges.append((previous, name, {"style": "dotted", "arrowhead": "none"}))
            previous = name
            if not call.children:
                continue
            kernel = call.kernel
            if kernel is not None and kernel.alias == "CompositeImplicitAutograd":
                with target.subgraph(name=f"cluster_{name}") as cluster:
                    cluster.attr(
                        label=dot_label([f"{call.op} decomposes into"]),
                        style="dashed",
                        color="#1565c0",
                        fontsize="10",
                    )
                    self.calls(call.children, name, cluster)
            else:
                self.calls(call.children, name, target)

    def group(self, group: TracedGroup, parent: str | None, target: graphviz.Digraph) -> None:
        """An autograd node, compiled region or compilation: a cluster around its calls."""
        self.clusters += 1
        with target.subgraph(name=f"cluster_g{self.clusters}") as cluster:
            cluster.attr(
                label=dot_label([f"{_label(group)}: {_detail(group)}"]),
                style="rounded",
                color="#6a1b9a" if isinstance(group, AutogradNode) else "#37474f",
                fontsize="10",
            )
            if group.children:
                self.calls(group.children, parent, cluster)
            else:
                cluster.node(f"g{self.clusters}", label="(no operator call)", shape="plaintext")


@renders(Trace, "diagram")
def trace_diagram(trace: Trace, max_calls: int = DIAGRAM_CALLS) -> Diagram:
    """The call graph: each call a box (op, path, kernel kind, time), an edge to each call its
    kernels made; a CompositeImplicitAutograd decomposition is drawn inside a dashed cluster,
    an autograd node or compiled region inside a cluster named after it. At most
    ``max_calls`` calls are drawn."""
    dot = graphviz.Digraph(
        "trace",
        graph_attr={"rankdir": "LR", "ordering": "out", "fontname": "Helvetica", "fontsize": "11"},
        node_attr={
            "shape": "box",
            "style": "rounded,filled",
            "fontname": "Helvetica",
            "fontsize": "10",
        },
        edge_attr={"color": "#757575"},
    )
    graph = _CallGraph(dot, max_calls)
    graph.calls(trace.calls, None, dot)
    if graph.left_out:
        dot.node(
            "more",
            label=dot_label([f"{graph.left_out} more calls not drawn (max_calls={max_calls})"]),
            shape="plaintext",
        )
    for tail, head, attrs in graph.edges:
        dot.edge(tail, head, **attrs)
    return Diagram(dot, trace_text(trace))
