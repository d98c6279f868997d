"""ops.py (opmagic/package/python.py): the exported cells' Python as plain torch.library code,
with what it needs from other cells, and nothing that needs IPython or opmagic. The generated
code is run here to show it registers what the cells did."""

from __future__ import annotations

import textwrap

import pytest
import torch

from opmagic.cells.history import CellEntry, CellSource
from opmagic.errors import ExportError
from opmagic.package.python import operator_cell, python_module


def cell(
    label: str,
    order: int,
    text: str,
    lines: set[int] = frozenset(),
    kind: str = "python",
    options: dict | None = None,
    state: str = "in effect",
) -> CellEntry:
    """A history entry, as the session makes them."""
    return CellEntry(
        key=label,
        label=label,
        order=order,
        state=state,
        detail="",
        sources=(CellSource(kind, textwrap.dedent(text), options or {}),),
        checks=(),
        statement_lines=frozenset(lines),
    )


CUSTOM_OP = cell(
    "[3]",
    3,
    '''\
    # %%custom_op pyexp::scaled --check "torch.randn(3),"
    SCALE = 3.0

    @fake
    def _(x):
        return torch.empty_like(x)

    def scaled(x: torch.Tensor) -> torch.Tensor:
        return x * SCALE

    @kernel("cpu")
    def _(x):
        return x * SCALE

    autocast("cpu", torch.float16)
    print(scaled(torch.ones(1)))

    @setup_context
    def _(ctx, inputs, output):
        pass

    @backward
    def _(ctx, grad):
        return grad * SCALE
    ''',
    kind="custom_op",
    options={"name": "pyexp::scaled", "function": "scaled", "mutates_args": (),
             "device_types": None, "schema": None, "tags": ("pt2_compliant_tag",)},
)


def test_a_custom_op_cell_becomes_custom_op_and_its_register_calls() -> None:
    text, required = operator_cell(CUSTOM_OP.sources[0], "[3]")
    maker = '@torch.library.custom_op("pyexp::scaled", mutates_args=(), tags=(torch.Tag.'
    assert maker + "pt2_compliant_tag,))\ndef scaled(x: torch.Tensor)" in text
    cell_part = text.split("registered once")[0]
    assert "@fake" not in cell_part and "@kernel" not in cell_part
    assert "autocast(" not in cell_part
    assert "def _pyexp" not in text and "def _scaled_fake(x):" in text
    assert "def _scaled_kernel(x):" in text
    tail = text.split("# what %%custom_op registered once the cell ran:\n")[1].splitlines()
    assert tail == [
        "scaled.register_fake(_scaled_fake)",
        "scaled.register_kernel('cpu', _scaled_kernel)",
        'scaled.register_autocast("cpu", torch.float16)',
        "scaled.register_autograd(_scaled_backward, setup_context=_scaled_setup_context)",
    ]
    assert len(required) >= 4


def test_the_exported_module_registers_the_op_as_the_cell_did() -> None:
    module = python_module("pkg", [CUSTOM_OP], [cell("[1]", 1, "import torch\n")])
    assert "print(scaled" not in module.text  # a call to try it: not part of the package
    assert "SCALE = 3.0" in module.text  # read by the functions: pulled in
    namespace: dict = {}
    try:
        exec(compile(module.text, "ops.py", "exec"), namespace)
        x = torch.randn(3, requires_grad=True)
        torch.testing.assert_close(torch.ops.pyexp.scaled(x), x * 3)
        torch.ops.pyexp.scaled(x).sum().backward()
        torch.testing.assert_close(x.grad, torch.full((3,), 3.0))
        with torch._subclasses.fake_tensor.FakeTensorMode():
            assert torch.ops.pyexp.scaled(torch.empty(5)).shape == (5,)
    finally:
        namespace["scaled"]._lib._destroy()


def test_names_are_found_in_other_cells_and_ipython_lines_are_left_out() -> None:
    earlier = cell("[1]", 1, "import numpy as np\nget_ipython().run_line_magic('time', 'x')\n")
    unrelated = cell("[2]", 2, "import math\nOFFSET = 1\n")
    plain = cell(
        "[4]",
        4,
        """\
        lib = torch.library.Library("pyexp2", "DEF")
        lib.define("sin(Tensor x) -> Tensor")
        def sin_impl(x):
            return torch.from_numpy(np.sin(x.numpy())) + OFFSET
        lib.impl("sin", sin_impl, "CPU")
        y = sin_impl(torch.ones(2))
        get_ipython().run_line_magic('timeit', 'sin_impl(y)')
        """,
        lines={1, 2, 5},
    )
    module = python_module("pkg", [plain], [earlier, unrelated, plain])
    assert "import numpy as np" in module.text and "OFFSET = 1" in module.text
    assert "import math" not in module.text and "get_ipython" not in module.text
    assert "y = sin_impl" not in module.text
    assert module.cells == ("[1]", "[2]", "[4]")
    assert module.imports == {"numpy"}
    assert module.notes == ()


def test_a_name_no_cell_defines_is_noted() -> None:
    plain = cell(
        "[2]", 2, "def f(x):\n    return helper(x)\ntorch.library.register_fake('a::b')(f)\n", {3}
    )
    module = python_module("pkg", [plain], [plain])
    assert module.notes == (
        "ops.py reads helper (cell [2]), which no exported code defines: define or import it "
        "in a cell, then export again",
    )


def test_a_statement_that_registers_through_opmagic_is_refused() -> None:
    plain = cell("[2]", 2, "import opmagic\nopmagic.custom_op_from_source(SRC, 'a::b')\n", {2})
    with pytest.raises(ExportError, match=r"cell \[2\], line 2 registers through opmagic"):
        python_module("pkg", [plain], [plain])


def test_a_companion_inside_a_block_is_refused_with_its_line() -> None:
    nested = cell(
        "[5]",
        5,
        """\
        def f(x: torch.Tensor) -> torch.Tensor:
            return x
        if True:
            @fake
            def _(x):
                return x
        """,
        kind="custom_op",
        options={"name": "a::f", "function": "f", "mutates_args": ()},
    )
    with pytest.raises(ExportError, match=r"cell \[5\], line 4: fake is used inside a block"):
        operator_cell(nested.sources[0], "[5]")


def test_keyword_only_parameters_without_a_default_are_read() -> None:
    """A top-level function's keyword-only parameter with no default (``None`` among the
    syntax tree's defaults) is walked past, and a companion in a default is still found."""
    keywords = cell(
        "[6]",
        6,
        """\
        def f(x: torch.Tensor, *, scale: float) -> torch.Tensor:
            return x * scale
        def g(x, *, hook=fake, scale):
            return x
        """,
        kind="custom_op",
        options={"name": "a::f", "function": "f", "mutates_args": ()},
    )
    with pytest.raises(ExportError, match=r"cell \[6\], line 3: fake is used inside a block"):
        operator_cell(keywords.sources[0], "[6]")
