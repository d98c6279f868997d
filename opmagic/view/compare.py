"""How comparisons look: a text table that fits the terminal, an HTML table with failures
highlighted and the plot below it, a DataFrame (``"frame"``), a matplotlib figure
(``"plot"``), and the progress bar of a running sweep (``"live"``).

matplotlib is imported only when a plot is drawn.
"""

from __future__ import annotations

import base64
import io
import shutil
import sys
import textwrap
import types
from collections.abc import Callable
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING, Any

from ..display import renders
from ..verify.compare import CaseResult, Comparison, SweepProgress
from .style import DIM_COLOUR, FAIL_COLOUR, FAIL_FILL, STATUS_COLOURS, styled

if TYPE_CHECKING:
    import pandas
    from matplotlib.figure import Figure

_MIN_WIDTH = 60  # narrower terminals get the essential columns anyway


@dataclass(frozen=True)
class _Column:
    """A column of the text and HTML tables."""

    header: str
    cell: Callable[[CaseResult], str]
    drop_order: int  # columns with the highest numbers go first when the terminal is narrow
    when: Callable[[Comparison], bool] = lambda comparison: True


def format_seconds(seconds: float | None) -> str:
    """``"2.13 µs"``, ``"1.20 ms"``, ``"0.851 s"``; ``"-"`` when not timed."""
    if seconds is None:
        return "-"
    for unit, scale in (("ns", 1e-9), ("µs", 1e-6), ("ms", 1e-3)):
        if seconds < scale * 1000:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds:.3g} s"


def _number(value: float | None, spec: str = ".2g") -> str:
    """A number for a table cell; ``"-"`` when missing, ``"0"`` for exactly zero."""
    if value is None:
        return "-"
    return "0" if value == 0 else format(value, spec)


def _speedup(row: CaseResult) -> str:
    return "-" if row.speedup is None else f"{row.speedup:.2f}x"


def _bandwidth(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _several_devices(comparison: Comparison) -> bool:
    return len({row.device for row in comparison.rows}) > 1


_COLUMNS = (
    _Column("size", lambda r: "-" if r.size is None else str(r.size), 0),
    _Column("dtype", lambda r: r.dtype, 0),
    _Column("device", lambda r: r.device, 2, _several_devices),
    _Column("verdict", lambda r: r.verdict, 0),
    _Column("max abs err", lambda r: _number(r.max_abs_error), 4),
    _Column("max rel err", lambda r: _number(r.max_rel_error), 6),
    _Column("time", lambda r: format_seconds(r.time), 0),
    _Column("ref time", lambda r: format_seconds(r.reference_time), 1),
    _Column("speedup", _speedup, 0),
    _Column("GB/s", lambda r: _bandwidth(r.bandwidth), 5),
    _Column("ref GB/s", lambda r: _bandwidth(r.reference_bandwidth), 7),
    _Column("fwd+bwd", lambda r: format_seconds(r.backward_time), 3, lambda c: c.backward),
    _Column(
        "ref fwd+bwd",
        lambda r: format_seconds(r.reference_backward_time),
        3,
        lambda c: c.backward,
    ),
)


def heading(comparison: Comparison) -> str:
    """``"mylib::myadd vs torch.add (cpu): all 8 cases pass"``."""
    devices = sorted({row.device for row in comparison.rows})
    where = f" ({', '.join(devices)})" if len(devices) == 1 else ""
    return f"{comparison.candidate} vs {comparison.reference}{where}: {comparison.summary}"


@renders(Comparison, "text")
def comparison_text(comparison: Comparison, width: int | None = None) -> str:
    """The table at the terminal's width (the least needed columns left out when it is
    narrow), then every mismatch, one per line, wrapped."""
    width = max(width or shutil.get_terminal_size().columns, _MIN_WIDTH)
    columns = [c for c in _COLUMNS if c.when(comparison)]
    table = [[c.header for c in columns]] + [
        [c.cell(row) for c in columns] for row in comparison.rows
    ]
    while True:
        widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
        droppable = [i for i, c in enumerate(columns) if c.drop_order > 0]
        if 2 + sum(widths) + 2 * (len(widths) - 1) <= width or not droppable:
            break
        drop = max(droppable, key=lambda i: columns[i].drop_order)
        del columns[drop]
        for line in table:
            del line[drop]
    lines = textwrap.wrap(heading(comparison), width, subsequent_indent="    ")
    lines += [
        "  " + "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in table
    ]
    for row in comparison.rows:
        for mismatch in row.mismatches:
            lines += textwrap.wrap(
                f"{row.status} {row.label}: {mismatch}",
                width,
                initial_indent="  ",
                subsequent_indent="      ",
            )
    footer = f"values compared with {comparison.tolerances}; times are medians"
    lines += textwrap.wrap(footer, width, initial_indent="  ", subsequent_indent="  ")
    return "\n".join(lines)


@renders(Comparison, "html")
def comparison_html(comparison: Comparison) -> str:
    """The table (failing rows highlighted), the mismatches, and the plot when it has a line."""
    columns = [c for c in _COLUMNS if c.when(comparison)]
    head = "".join(f"<th>{escape(c.header)}</th>" for c in columns)
    body = []
    for row in comparison.rows:
        fill = f' style="background:{FAIL_FILL}"' if row.status != "pass" else ""
        cells = []
        for column in columns:
            text = escape(column.cell(row))
            if column.header == "verdict":
                text = f'<b style="color:{STATUS_COLOURS[row.status]}">{text}</b>'
            cells.append(f"<td>{text}</td>")
        body.append(f"<tr{fill}>{''.join(cells)}</tr>")
    mismatches = "".join(
        f'<li><span style="color:{STATUS_COLOURS[row.status]}">{escape(row.status)}</span> '
        f"{escape(row.label)}: {escape(str(mismatch))}</li>"
        for row in comparison.rows
        for mismatch in row.mismatches
    )
    colour = STATUS_COLOURS["pass" if comparison.passed else "FAIL"]
    return styled(
        f'<b style="color:{colour}">{escape(heading(comparison))}</b>'
        f"<table><tr>{head}</tr>{''.join(body)}</table>"
        + (f"<ul>{mismatches}</ul>" if mismatches else "")
        + f'<div class="dim">values compared with {escape(comparison.tolerances)}; '
        "times are medians of torch.utils.benchmark's blocked autorange</div>"
        + _plot_html(comparison)
    )


def _plot_html(comparison: Comparison) -> str:
    """The plot as an inline PNG when some dtype has timings at two sizes or more."""
    timed: dict[tuple[str, str], set[int]] = {}
    for row in comparison.rows:
        if row.time is not None and row.size is not None:
            timed.setdefault((row.dtype, row.device), set()).add(row.size)
    if not any(len(sizes) > 1 for sizes in timed.values()):
        return ""
    try:
        png = comparison_plot(comparison)._repr_png_()
    except ImportError:
        return '<div class="dim">(pip install matplotlib to see the plot)</div>'
    return f'<img src="data:image/png;base64,{base64.b64encode(png).decode()}"/>'


@renders(Comparison, "frame")
def comparison_frame(comparison: Comparison) -> pandas.DataFrame:
    """A row per case: verdict, errors, times in µs, speedup and bandwidths in GB/s."""
    import pandas as pd

    def micro(seconds: float | None) -> float | None:
        return None if seconds is None else seconds * 1e6

    records = []
    for row in comparison.rows:
        record = {
            "size": row.size,
            "dtype": row.dtype,
            "device": row.device,
            "inputs": row.inputs,
            "status": row.status,
            "mismatches": "; ".join(str(m) for m in row.mismatches),
            "max_abs_error": row.max_abs_error,
            "max_rel_error": row.max_rel_error,
            "time_us": micro(row.time),
            "reference_time_us": micro(row.reference_time),
            "speedup": row.speedup,
            "bandwidth_GBps": row.bandwidth,
            "reference_bandwidth_GBps": row.reference_bandwidth,
        }
        if comparison.backward:
            record["backward_time_us"] = micro(row.backward_time)
            record["reference_backward_time_us"] = micro(row.reference_backward_time)
        records.append(record)
    frame = pd.DataFrame.from_records(records, columns=list(records[0]) if records else None)
    return frame.astype({"size": "Int64"}) if records else frame


@renders(Comparison, "plot")
def comparison_plot(comparison: Comparison, bandwidth: bool = False) -> Figure:
    """Time per call and speedup against size, a line per dtype (and device); failing cases
    marked with a red x. A plain matplotlib Figure (not pyplot's): notebooks show it once."""
    from matplotlib.figure import Figure

    series: dict[str, list[CaseResult]] = {}
    several = len({row.device for row in comparison.rows}) > 1
    for row in comparison.rows:
        if row.time is not None and row.size is not None:
            name = f"{row.dtype} {row.device}" if several else row.dtype
            series.setdefault(name, []).append(row)
    panels = ["time", "speedup"] + (["bandwidth"] if bandwidth else [])
    figure = Figure(figsize=(4.8 * len(panels), 3.8), layout="constrained")
    axes = dict(zip(panels, figure.subplots(1, len(panels), squeeze=False)[0], strict=True))
    marked_failures = False  # the legend names the red x once
    for index, (name, rows) in enumerate(series.items()):
        rows = sorted(rows, key=lambda r: r.size)
        sizes = [r.size for r in rows]
        colour = f"C{index % 10}"
        ax = axes["time"]
        ax.plot(
            sizes,
            [r.time * 1e6 for r in rows],
            "o-",
            color=colour,
            label=f"{name}: {comparison.candidate}",
        )
        ax.plot(
            sizes,
            [_micro(r.reference_time) for r in rows],
            "s--",
            color=colour,
            alpha=0.7,
            label=f"{name}: {comparison.reference}",
        )
        axes["speedup"].plot(sizes, [_nan(r.speedup) for r in rows], "o-", color=colour, label=name)
        if bandwidth:
            axes["bandwidth"].plot(
                sizes,
                [_nan(r.bandwidth) for r in rows],
                "o-",
                color=colour,
                label=f"{name}: {comparison.candidate}",
            )
            axes["bandwidth"].plot(
                sizes,
                [_nan(r.reference_bandwidth) for r in rows],
                "s--",
                color=colour,
                alpha=0.7,
                label=f"{name}: {comparison.reference}",
            )
        failing = [r for r in rows if r.status != "pass"]
        if failing:
            ax.plot(
                [r.size for r in failing],
                [r.time * 1e6 for r in failing],
                "x",
                color=FAIL_COLOUR,
                markersize=11,
                markeredgewidth=2.5,
                label="_nolegend_" if marked_failures else "FAIL",
            )
            marked_failures = True
    axes["speedup"].axhline(1.0, color=DIM_COLOUR, linewidth=1, linestyle=":")
    titles = {
        "time": ("time per call (µs)", "time per call"),
        "speedup": ("reference time / candidate time", "speedup (above 1: candidate faster)"),
        "bandwidth": ("achieved GB/s (inputs + outputs)", "bandwidth"),
    }
    all_sizes = [row.size for rows in series.values() for row in rows]
    for panel, ax in axes.items():
        ylabel, title = titles[panel]
        ax.set_title(title)
        ax.set_xlabel("size")
        ax.set_ylabel(ylabel)
        if all_sizes and max(all_sizes) > 10 * max(min(all_sizes), 1):
            ax.set_xscale("log", base=2)
        if panel in ("time", "bandwidth") and series:
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        if series:
            ax.legend(fontsize="small")
    if not series:
        axes["time"].text(
            0.5,
            0.5,
            "no case was timed",
            ha="center",
            va="center",
            transform=axes["time"].transAxes,
        )
    figure.suptitle(f"{comparison.candidate} vs {comparison.reference}")
    figure._repr_png_ = types.MethodType(_figure_png, figure)  # notebooks display it
    return figure


def _micro(seconds: float | None) -> float:
    return float("nan") if seconds is None else seconds * 1e6


def _nan(value: float | None) -> float:
    return float("nan") if value is None else value


def _figure_png(figure: Figure) -> bytes:
    """The figure as PNG bytes (what IPython shows for ``_repr_png_``)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90)
    return buffer.getvalue()


def _bar(progress: SweepProgress, cells: int) -> str:
    filled = round(cells * progress.done / progress.total) if progress.total else cells
    return "█" * filled + "░" * (cells - filled)


@renders(SweepProgress, "text")
def progress_text(progress: SweepProgress) -> str:
    """``compare ████░░░░ 3/8 cases · float32 cpu, size 4096 · 1.2 s``, or how it ended."""
    task, unit = progress.task, progress.unit
    if progress.finished:
        if progress.stopped:
            return (
                f"{task}: stopped after {progress.done} of {progress.total} {unit} "
                f"({progress.elapsed:.1f} s)"
            )
        return f"{task}: {progress.total} {unit} in {progress.elapsed:.1f} s"
    return (
        f"{task} {_bar(progress, 20)} {progress.done}/{progress.total} {unit} · "
        f"{progress.case} · {progress.elapsed:.1f} s"
    )


@renders(SweepProgress, "html")
def progress_html(progress: SweepProgress) -> str:
    """An HTML ``<progress>`` bar with the count, the running case and the time."""
    if progress.finished:
        return styled(f'<span class="dim">{escape(progress_text(progress))}</span>')
    return styled(
        f'<progress value="{progress.done}" max="{progress.total}"></progress> '
        f"{progress.done}/{progress.total} {escape(progress.unit)} · {escape(progress.case)} · "
        f"{progress.elapsed:.1f} s"
    )


class LiveProgress:
    """A sweep's progress shown in place: one notebook output updated, else one line on
    stderr (rewritten on a terminal; on a pipe, only how the sweep ended)."""

    def __init__(self, progress: SweepProgress) -> None:
        self.handle: Any = None
        self.notebook = _in_notebook()
        self.update(progress)

    def update(self, progress: SweepProgress) -> None:
        """Show ``progress`` instead of what was shown."""
        if self.notebook:
            from IPython.display import display

            bundle = {"text/plain": progress_text(progress), "text/html": progress_html(progress)}
            if self.handle is None:
                self.handle = display(bundle, raw=True, display_id=True)
            else:
                self.handle.update(bundle, raw=True)
            return
        stream = sys.stderr
        text = progress_text(progress)[: max(shutil.get_terminal_size().columns - 1, 20)]
        if stream.isatty():
            stream.write(f"\r\x1b[2K{text}" + ("\n" if progress.finished else ""))
        elif progress.finished:
            stream.write(f"{text}\n")
        stream.flush()


def _in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (which shows rich outputs)."""
    if "IPython" not in sys.modules:
        return False
    from IPython import get_ipython

    return getattr(get_ipython(), "kernel", None) is not None


@renders(SweepProgress, "live")
def live_progress(progress: SweepProgress) -> LiveProgress:
    """Start showing a sweep's progress; the sweep then calls ``.update(event)``."""
    return LiveProgress(progress)
