"""Text and HTML forms: grouping, alignment, escaping."""

from __future__ import annotations

import torch

from opmagic import dispatch_table
from opmagic.view.text import grouped_entries, table_text


def test_runs_of_identical_service_become_one_row_and_missing_keys_are_counted():
    table = dispatch_table("aten::add.Tensor")
    groups = list(grouped_entries(table))
    autograd = [g for g in groups if g.category == "autograd"]
    assert len(autograd) == 1 and len(autograd[0].entries) > 10
    assert autograd[0].keys_label.endswith(f"({len(autograd[0].entries)} keys)")
    shown = sum(len(g.entries) for g in groups)
    missing = sum(1 for e in table.entries if e.kind == "missing")
    assert shown + missing == len(table.entries)
    with_missing = list(grouped_entries(table, include_missing=True))
    assert sum(len(g.entries) for g in with_missing) == len(table.entries)


def test_rows_are_aligned_in_columns():
    lines = table_text(dispatch_table("aten::sin")).splitlines()
    header = lines[1]
    start = header.index("category")
    rows = [line for line in lines[2:] if line.startswith("  ") and not line.startswith("  (")]
    assert all(len(r) > start and r[start - 2 : start] == "  " for r in rows[:10])


def test_small_groups_list_every_key():
    lib = torch.library.Library("opmagic_test_text", "FRAGMENT")
    try:
        lib.define("two(Tensor x) -> Tensor")
        lib.impl("two", lambda x: x, "CPU")
        lib.impl("two", lambda x: x, "Meta")
        text = str(dispatch_table("opmagic_test_text::two"))
        assert "  Meta " in text and "  CPU " in text
    finally:
        lib._destroy()
