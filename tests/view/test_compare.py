"""How comparisons look: text that fits the terminal, HTML with failures highlighted and the
plot, the DataFrame, the matplotlib figure, and the progress bar."""

from __future__ import annotations

import io
import re

import pytest
import torch
from matplotlib.figure import Figure

from opmagic.verify.compare import Comparison, SweepProgress, compare
from opmagic.view import compare as view
from opmagic.view.style import FAIL_FILL


def half_wrong(x: torch.Tensor) -> torch.Tensor:
    """sin, off by 0.01 in float16 (a bug for one dtype only)."""
    out = torch.sin(x)
    return out + 0.01 if x.dtype == torch.float16 else out


@pytest.fixture(scope="module")
def mixed() -> Comparison:
    """Two dtypes x three sizes; the float16 cases fail on values."""
    return compare(
        half_wrong,
        torch.sin,
        lambda size, dtype, device: torch.randn(size, dtype=dtype, device=device),
        sizes=[16, 256, 4096],
        dtypes=["float32", "float16"],
        min_run_time=0.002,
        progress=False,
    )


def test_the_text_table_has_a_row_per_case_and_every_mismatch_below(mixed) -> None:
    text = view.comparison_text(mixed, width=200)
    lines = text.splitlines()
    assert lines[0] == "half_wrong vs torch.sin (cpu): 3 of 6 cases pass; 3 FAIL (values)"
    header = lines[1].split()
    assert header[:4] == ["size", "dtype", "verdict", "max"] and "ref GB/s" in lines[1]
    assert re.match(r"  16 +float32 +pass +0 +0 +\S+ [nµm]s", lines[2])
    assert re.match(r"  16 +float16 +FAIL: values ", lines[5])
    failures = [line for line in lines if line.startswith("  FAIL float16 cpu, size")]
    assert len(failures) == 3 and "values: output: 16 / 16 elements differ" in failures[0]
    assert lines[-1].endswith("torch's default tolerances per dtype; times are medians")
    assert str(mixed) == view.comparison_text(mixed)  # str() is the text view


def test_a_narrow_terminal_drops_the_least_needed_columns_first(mixed) -> None:
    wide = view.comparison_text(mixed, width=200).splitlines()[1]
    narrow = view.comparison_text(mixed, width=70)
    header = narrow.splitlines()[1]
    assert "ref GB/s" in wide and "max rel err" in wide
    assert "ref GB/s" not in header and "max rel err" not in header
    for column in ("size", "dtype", "verdict", "time", "speedup"):
        assert column in header
    assert all(len(line) <= 70 for line in narrow.splitlines())


def test_the_html_highlights_failing_rows_and_embeds_the_plot(mixed) -> None:
    html = mixed._repr_html_()
    rows = re.findall(r"<tr( style=\"[^\"]*\")?><td>", html)
    assert [bool(style) for style in rows] == [False] * 3 + [True] * 3
    assert f"background:{FAIL_FILL}" in html
    assert html.count('<img src="data:image/png;base64,') == 1
    assert "float16 cpu, size 16: values: output: 16 / 16 elements differ" in html


def test_the_frame_has_a_row_per_case_with_times_in_microseconds(mixed) -> None:
    frame = mixed.frame()
    assert list(frame["size"]) == [16, 256, 4096] * 2
    assert list(frame["status"]) == ["pass"] * 3 + ["FAIL"] * 3
    first = mixed.rows[0]
    assert frame["time_us"][0] == pytest.approx(first.time * 1e6)
    assert frame["speedup"][0] == pytest.approx(first.speedup)
    assert "backward_time_us" not in frame.columns
    assert frame["mismatches"][3].startswith("values: output: 16 / 16 elements differ")


def test_the_plot_has_time_and_speedup_per_dtype_and_bandwidth_when_asked(mixed) -> None:
    figure = mixed.plot()
    assert isinstance(figure, Figure)
    time_axes, speedup_axes = figure.axes
    labels = [line.get_label() for line in time_axes.get_lines()]
    assert labels[:2] == ["float32: half_wrong", "float32: torch.sin"]
    assert "FAIL" in labels  # the failing float16 cases are marked
    assert [line.get_label() for line in speedup_axes.get_lines()][:2] == ["float32", "float16"]
    assert figure._repr_png_().startswith(b"\x89PNG")  # notebooks show it without pyplot
    assert len(mixed.plot(bandwidth=True).axes) == 3


def test_progress_reads_as_a_bar_and_says_how_the_sweep_ended() -> None:
    running = SweepProgress(3, 12, "float32 cpu, size 4096", 1.25)
    assert str(running) == (
        "compare █████░░░░░░░░░░░░░░░ 3/12 cases · float32 cpu, size 4096 · 1.2 s"
    )
    assert '<progress value="3" max="12"></progress>' in running._repr_html_()
    stopped = SweepProgress(5, 12, "", 2.0, finished=True, stopped=True)
    assert str(stopped) == "compare: stopped after 5 of 12 cases (2 s)"
    assert str(SweepProgress(12, 12, "", 3.0, finished=True)) == "compare: 12 cases in 3 s"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_live_progress_rewrites_one_terminal_line(monkeypatch) -> None:
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    live = SweepProgress(1, 2, "a", 0.6).view("live")
    live.update(SweepProgress(2, 2, "", 0.9, finished=True))
    assert terminal.getvalue() == (
        "\r\x1b[2Kcompare ██████████░░░░░░░░░░ 1/2 cases · a · 600 ms"
        "\r\x1b[2Kcompare: 2 cases in 900 ms\n"
    )
