"""%export_ops: a thin front on opmagic.export (its options, its errors as the magics give
them); --verify is run by tests/notebooks/test_export_notebook.py."""

from __future__ import annotations

from pathlib import Path

from IPython.core.error import UsageError

from opmagic import Export, ExportError

from ..shell import Cells

OP = "%%custom_op mag_exp::f\ndef f(x: torch.Tensor) -> torch.Tensor:\n    return x + 1\n"


def test_export_ops_writes_the_package_and_returns_the_export(cells: Cells, tmp_path: Path):
    number = cells.run(OP).execution_count
    cells.run("x = 1")
    result = cells.run(f"%export_ops {tmp_path / 'pkg'} --name mag_pkg --version 2.0 "
                       f"--cells {number}")
    exported = result.result
    assert isinstance(exported, Export)
    assert (exported.name, exported.version) == ("mag_pkg", "2.0")
    assert [c.label for c in exported.cells] == [f"[{number}]"]
    assert (tmp_path / "pkg" / "mag_pkg" / "ops.py").is_file()
    cells.run(f"%export_ops {tmp_path / 'pkg'} --name mag_pkg --overwrite")


def test_bad_lines_are_usage_errors(cells: Cells, tmp_path: Path):
    cells.run(OP)
    missing = cells.fail(f"%export_ops {tmp_path / 'pkg'}")
    assert isinstance(missing, UsageError) and "--name" in str(missing)
    numbers = cells.fail(f"%export_ops {tmp_path / 'pkg'} --name p --cells 3,x")
    assert isinstance(numbers, UsageError)
    assert str(numbers) == "%export_ops: --cells takes cell numbers, e.g. --cells 3,5; got '3,x'."
    assert not (tmp_path / "pkg").exists()


def test_an_export_error_keeps_its_class_and_names_the_magic(cells: Cells, tmp_path: Path):
    error = cells.fail(f"%export_ops {tmp_path / 'pkg'} --name torch")
    assert isinstance(error, ExportError)
    assert str(error).startswith("%export_ops: The package name 'torch' would shadow")
    assert error._render_traceback_() and "Traceback" not in error._render_traceback_()[0]
