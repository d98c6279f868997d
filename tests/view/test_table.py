"""Text forms of tables (and paths): grouping, left alignment, fitting the terminal's width."""

from __future__ import annotations

import pytest
import torch

from opmagic import dispatch_table, resolve
from opmagic.view.table import grouped_entries, table_text

WIDTHS = [60, 80, 120]


def test_own_kernels_by_default_every_key_on_request():
    table = dispatch_table("aten::add.Tensor")
    groups = list(grouped_entries(table))
    assert all(e.is_own for g in groups for e in g.entries)
    autograd = [g for g in groups if g.category == "autograd"]
    assert len(autograd) == 1 and len(autograd[0].entries) > 10
    assert (
        autograd[0].keys_label
        == f"AutogradCPU, AutogradCUDA + {len(autograd[0].entries) - 2} more keys"
    )
    # within a category, keys served alike share a row even when others sit between them
    backends = [g for g in groups if g.category == "backend"]
    services = [(g.first.kind, g.first.alias, g.first.source) for g in backends]
    assert len(services) == len(set(services))
    every = list(grouped_entries(table, show_all=True))
    assert sum(len(g.entries) for g in every) == len(table.entries)
    text = " ".join(table_text(table).split())  # whatever the terminal's width
    assert "not listed: " in text and "with no kernel" in text
    assert "PythonDispatcher" not in text
    assert "print(opmagic.dispatch_table('aten::add.Tensor').diagram(show_all=True))" in text
    full = table_text(table, show_all=True)
    assert "PythonDispatcher" in full and "not listed" not in full


@pytest.mark.parametrize("width", WIDTHS)
def test_text_fits_the_terminal_and_is_left_aligned(
    width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every line fits $COLUMNS (a single path longer than the line is the one exception)."""
    monkeypatch.setenv("COLUMNS", str(width))
    x = torch.randn(2, 3, requires_grad=True)
    with torch.autocast("cpu"):
        resolution = resolve(torch.ops.aten.mm, x, torch.randn(3, 4))
    for text in (str(dispatch_table("aten::add.Tensor")), str(resolution)):
        for line in text.splitlines():
            assert len(line) <= width or " " not in line.strip(), line
    if width >= 120:  # the key and its kernel on one line, kinds starting in one column
        lines = str(dispatch_table("aten::sin")).split("(not listed")[0].splitlines()
        start = lines[1].index("kind · source")
        keys = [line for line in lines[2:] if line.startswith("    ") and line[4] != " "]
        inline = [line for line in keys if len(line) > start]
        assert len(inline) > 8
        assert all(line[start - 2 : start] == "  " and line[start] != " " for line in inline)
