"""How comparisons look: text that fits the terminal, HTML with failures highlighted and the
plot, the DataFrame, the matplotlib figure, and the progress bar."""

from __future__ import annotations

import io
import re

import pytest
import torch
from IPython.utils.capture import capture_output
from matplotlib.figure import Figure
from torch.utils import benchmark
from torch.utils.benchmark.utils.common import TaskSpec

from opmagic.verify.compare import CaseResult, Comparison, SweepProgress, compare, progress
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
    assert header[:5] == ["size", "dtype", "verdict", "abs", "err"] and "ref GB/s" in lines[1]
    assert re.match(r"  16 +float32 +pass +0 +0 +\S+ [nµm]s", lines[2])
    assert re.match(r"  16 +float16 +FAIL: values ", lines[5])
    failures = [line for line in lines if line.startswith("  FAIL float16 cpu, size")]
    assert len(failures) == 3 and "values: output: 16 / 16 elements differ" in failures[0]
    words = " ".join(text.split())
    assert "values compared with torch's default tolerances per dtype (abs/rel err:" in words
    assert words.endswith("IQR their interquartile range against the median (! marks noise)")
    assert str(mixed) == view.comparison_text(mixed)  # str() is the text view


def test_a_narrow_terminal_drops_the_least_needed_columns_first(mixed) -> None:
    wide = view.comparison_text(mixed, width=200).splitlines()[1]
    narrow = view.comparison_text(mixed, width=70)
    header = narrow.splitlines()[1]
    assert "ref GB/s" in wide and "rel err" in wide
    assert "ref GB/s" not in header and "rel err" not in header
    for column in ("size", "dtype", "verdict", "time", "speedup"):
        assert column in header
    assert all(len(line) <= 70 for line in narrow.splitlines())


def test_the_html_highlights_failing_rows_and_embeds_the_plot(mixed) -> None:
    html = mixed._repr_html_()
    rows = re.findall(r"<tr( style=\"[^\"]*\")?><td", html)
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


def _measured(*times: float) -> benchmark.Measurement:
    """A torch.utils.benchmark Measurement of these run times."""
    return benchmark.Measurement(1, list(times), TaskSpec("run()", "pass"))


@pytest.fixture
def noisy() -> Comparison:
    """Three cases: steady, noisy (IQR 83% of the median), and 30x faster than the reference."""
    steady, spread = _measured(1e-3, 1e-3, 1.01e-3, 1e-3), _measured(1e-3, 2e-3, 1e-3, 3e-3)
    slow = _measured(3e-2, 3e-2, 3e-2, 3e-2)
    rows = (
        CaseResult(1024, "float32", "cpu", "", (), 0.0, 0.0, steady, steady, None, None, 8192),
        CaseResult(4096, "float32", "cpu", "", (), 0.0, 0.0, spread, steady, None, None, 32768),
        CaseResult(16384, "float32", "cpu", "", (), 0.0, 0.0, steady, slow, None, None, 131072),
    )
    return Comparison("my_add", "torch.add", rows, 3, False, "torch's defaults")


def test_noise_and_a_suspect_speedup_are_marked_in_every_view(noisy) -> None:
    text = view.comparison_text(noisy, width=120)
    lines = text.splitlines()
    assert " 83%! " in lines[3] and "!" not in lines[2] + lines[4]
    words = " ".join(text.split())
    assert "warning: The case's timings are noise (float32 cpu, size 4096: the interq" in words
    assert "warning: A speedup of 30x (float32 cpu, size 16384)" in words
    html = noisy._repr_html_()
    assert 'title="the interquartile range is 83% of the median">83%!</b>' in html
    assert html.count(">warning: ") == 2
    frame = noisy.frame()
    assert frame["noise"].isna().tolist() == [True, False, True]
    assert frame["noise"][1] == "the interquartile range is 83% of the median"
    assert frame["time_iqr_us"][1] == pytest.approx(1250)


def test_the_html_table_fits_a_narrow_notebook_pane(mixed) -> None:
    """592 px (a 1024x768 window with JupyterLab's file browser open): bandwidths go to the
    DataFrame, the table's cells (but the verdict) never break; the browser test measures it."""
    html = mixed._repr_html_()
    header = re.search(r"<tr>((?:<th>[^<]*</th>)+)</tr>", html)[1]
    assert re.findall(r"<th>([^<]*)</th>", header) == [
        "size", "dtype", "verdict", "abs err", "rel err", "time", "ref time", "speedup", "IQR",
    ]  # fmt: skip
    assert "GB/s, ref GB/s: in .frame()" in html
    assert "GB/s" in view.comparison_text(mixed, width=200).splitlines()[1]


def test_in_a_notebook_the_sweep_s_end_waits_for_its_results_to_be_drawn(
    ipython, monkeypatch
) -> None:
    """The table and the plot take seconds after the last case: until the cell has ended
    (its result drawn), the progress line says they are being drawn, then how it ended."""
    monkeypatch.setattr(ipython, "kernel", object(), raising=False)  # as in ipykernel's shell
    monkeypatch.setattr(progress, "PROGRESS_DELAY_S", 0.0)
    ipython.user_ns.update(compare=compare, torch=torch)
    callbacks = list(ipython.events.callbacks["post_execute"])
    with capture_output() as captured:
        result = ipython.run_cell(
            "compare(torch.add, torch.add, lambda n, dtype, device: (torch.ones(n),) * 2, "
            "sizes=[8], min_run_time=0.002)"
        )
    assert result.success, result.error_in_exec
    texts = [o.data.get("text/plain", "") for o in captured.outputs]
    assert re.fullmatch(r"compare: 1 cases in [\d.]+ (µs|ms|s); drawing the results…", texts[-2])
    assert re.fullmatch(r"compare: 1 cases in [\d.]+ (µs|ms|s)", texts[-1])  # once the cell ended
    assert ipython.events.callbacks["post_execute"] == callbacks  # no callback left behind


def test_a_sweep_stopped_before_its_first_case_is_a_sentence() -> None:
    stopped = Comparison("my_add", "torch.add", (), 4, False, "torch's defaults", True)
    assert str(stopped) == "my_add vs torch.add: interrupted after 0 of 4 cases"
    assert "<table" not in stopped._repr_html_()
    assert "my_add vs torch.add: interrupted after 0 of 4 cases</div>" in stopped._repr_html_()
