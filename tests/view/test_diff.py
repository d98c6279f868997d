"""How a dispatcher diff looks: text within the terminal's width and folded, HTML grouped by
namespace with aten overrides first, the DataFrame's columns, one operator side by side."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator

import pytest
import torch

import opmagic
from opmagic.dispatch.diff import DispatchDiff
from opmagic.view.diff import SHOWN


@pytest.fixture(scope="module")
def found() -> Iterator[DispatchDiff]:
    """A diff with an aten override, a new namespace's operators and derived entries."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about overriding aten kernels
        with opmagic.diff() as diff:
            aten = torch.library.Library("aten", "IMPL")
            aten.impl("sin", lambda x: x, "CPU")
            defs = torch.library.Library("dfview", "DEF")
            defs.define("a_rather_long_operator_name_for_wrapping(Tensor x) -> Tensor")
            defs.impl("a_rather_long_operator_name_for_wrapping", lambda x: x, "CPU")
            defs.define("b(Tensor x) -> Tensor")
            defs.impl("b", lambda x: x, "CPU")
    defs.impl("b", lambda x: x, "CompositeImplicitAutograd")  # derived entries, in a second diff
    yield diff
    aten._destroy()
    defs._destroy()


@pytest.mark.parametrize("columns", [60, 80, 150])
def test_text_fits_the_terminal(found, monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    for line in str(found).splitlines():
        assert len(line) <= columns or " " not in line.strip(), line


def test_text_puts_aten_overrides_first_and_counts_the_rest(found):
    lines = str(found).splitlines()
    assert re.match(r"dispatcher diff: 2 operators, 3 kernels; 1 aten override \(", lines[0])
    assert lines[1] == "aten overrides (they change what every model runs):"
    assert lines[2].split()[:3] == ["aten::sin", "CPU", "replaced"]
    assert "operators:" in lines and "kernels (per operator and key):" in lines


def test_html_groups_by_namespace_with_aten_overrides_first(found):
    html = found._repr_html_()
    assert html.index("<b>aten overrides</b>") < html.index("<b>dfview</b>")
    assert "aten::sin" in html.split("<b>dfview</b>")[0]
    assert html.count("<table>") == 2


def test_the_frame_has_a_row_per_change(found):
    frame = found.frame()
    assert list(frame.columns[:6]) == ["op", "key", "change", "before", "after", "site"]
    assert len(frame) == len(found) == 5
    assert frame[frame.key == ""].op.tolist() == [
        "dfview::a_rather_long_operator_name_for_wrapping",
        "dfview::b",
    ]


def test_one_operator_side_by_side(monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # wide enough for the columns side by side
    defs = torch.library.Library("dfside", "DEF")
    try:
        defs.define("c(Tensor x) -> Tensor")
        defs.impl("c", lambda x: x, "CPU")
        with opmagic.diff() as found:
            defs.impl("c", lambda x: x, "CompositeImplicitAutograd")
    finally:
        defs._destroy()
    table = found.table("dfside::c")
    lines = str(table).splitlines()
    assert lines[0] == "dfside::c(Tensor x) -> Tensor"
    assert lines[1].split() == ["key", "before", "after"]
    assert re.match(
        r"  Undefined, Autograd\w+, Autograd\w+ \+ \d+ more keys +no kernel +via Co", lines[2]
    )
    assert lines[-2] == "registrations that changed:"
    assert "CompositeImplicitAutograd  added  Python · " in lines[-1]
    assert any(line.split()[-1] == "same" for line in lines if line.startswith("  CPU "))
    assert table.frame().changed.sum() == len(table.changed)
    assert "<b>AutogradCUDA</b>" in table._repr_html_()
    derived = str(found).splitlines()[-1]
    assert "no kernel or fallback → via CompositeImplicitAutograd" in derived


def test_long_sections_are_folded_with_the_call_that_lists_everything():
    defs = torch.library.Library("dffold", "DEF")
    try:
        with opmagic.diff() as found:
            for number in range(SHOWN + 5):
                defs.define(f"op{number}(Tensor x) -> Tensor")
    finally:
        defs._destroy()
    lines = str(found).splitlines()
    assert lines[-1].startswith(f"... 5 more changes ({SHOWN + 5} in all); all of them: d.frame()")


def test_a_snapshot_says_what_it_holds():
    text = str(opmagic.snapshot())
    assert re.match(
        r"dispatcher snapshot: [\d,]+ operators, \d+ backend fallbacks, \d+ torch", text
    )
