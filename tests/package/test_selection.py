"""Which cells are exported (opmagic/package/selection.py): cells in effect, in cell order;
the others left out with the reason; cells= checked; clashing definitions refused."""

from __future__ import annotations

import pytest

from opmagic.cells.history import CellEntry, CellSource, CheckRun
from opmagic.errors import ExportError
from opmagic.package.selection import select


def entry(label: str, state: str = "in effect", detail: str = "", **more) -> CellEntry:
    number = int(label.strip("[]"))
    return CellEntry(
        key=label,
        label=label,
        order=number,
        state=state,
        detail=detail,
        sources=more.pop("sources", (CellSource("python", "x = 1\n"),)),
        checks=more.pop("checks", ()),
        statement_lines=frozenset(),
        **more,
    )


HISTORY = (
    entry("[1]", "nothing in effect", "it ran before the opmagic session started"),
    entry("[2]", defines=frozenset({("def", "a::f")})),
    entry("[3]", "failed", "ValueError: boom"),
    entry("[4]", "replaced", "re-run as cell [6]"),
    entry("[5]", "nothing in effect", checks=(CheckRun("opcheck", "a::f.default", ()),)),
    entry("[6]", failed_rerun="its later run, cell [7], failed: SyntaxError: x"),
    entry("[8]", sources=(CellSource("cuda_kernel", "extern ...", {"path": "nvrtc"}),)),
)


def test_cells_in_effect_are_exported_and_the_others_say_why() -> None:
    selection = select(HISTORY, None)
    assert [e.label for e in selection.cells] == ["[2]", "[6]"]
    assert [(c.label, c.reason) for c in selection.left_out] == [
        ("[1]", "it ran before the opmagic session started"),
        ("[3]", "it failed (ValueError: boom)"),
        ("[4]", "re-run as cell [6]"),
        ("[5]", "it registered nothing; its checks are tests of the package"),
        ("[8]", 'a %%cuda_kernel cell of extern "C" kernels (the NVRTC quick path) runs its '
                "launchers through opmagic; write it as a .cu with TORCH_LIBRARY_IMPL(ns, CUDA, "
                "m) blocks (the nvcc full path) to export it"),
    ]


def test_cells_picks_cells_by_number() -> None:
    selection = select(HISTORY, [6])
    assert [e.label for e in selection.cells] == ["[6]"]
    assert ("[2]", "not among cells=") in [(c.label, c.reason) for c in selection.left_out]


@pytest.mark.parametrize(
    ("cells", "message"),
    [
        ([3], r"cells= names cell \[3\], which cannot be exported: it failed \(ValueError: boom\)"),
        ([9], r"cells= names cell \[9\], which is not a cell of this session \(its cells: "
              r"\[1\], \[2\], \[3\], \[4\], \[5\], \[6\], \[8\]\)"),
    ],
)
def test_cells_naming_what_cannot_be_exported_is_an_error(cells, message) -> None:
    with pytest.raises(ExportError, match=message):
        select(HISTORY, cells)


def test_nothing_to_export_says_what_became_of_each_cell() -> None:
    with pytest.raises(ExportError, match=r"Nothing to export: .*cell \[3\]: it failed"):
        select(HISTORY[2:4], None)
    with pytest.raises(ExportError, match="no cell of this session has registered"):
        select((), None)


def test_two_cells_defining_the_same_operator_are_refused() -> None:
    clash = (
        entry("[2]", defines=frozenset({("def", "a::f")}),
              defined_elsewhere=(("def a::f", "[7]"),)),
        entry("[7]", defines=frozenset({("def", "a::f")})),
    )
    with pytest.raises(ExportError, match=r"cells \[2\] and \[7\] both define def a::f"):
        select(clash, None)
    assert [e.label for e in select(clash, [7]).cells] == ["[7]"]
    namespaces = (
        entry("[2]", defines=frozenset({("namespace", "a")})),
        entry("[3]", defines=frozenset({("namespace", "a")})),
    )
    with pytest.raises(ExportError, match=r"cells \[2\] and \[3\] both define namespace a"):
        select(namespaces, None)
