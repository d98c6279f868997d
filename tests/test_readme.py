"""Every example in README.md and in the feature pages of docs/ runs as written: each file's
Python and cell blocks, in order, in one IPython shell of a fresh process (the examples define
operators of their own)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PYTHONPATH = os.environ.get("PYTHONPATH", "")
# fenced blocks a user pastes into a notebook cell: Python, and C++/CUDA cells of the magics
_RUNNABLE = ("python", "cpp", "cuda")
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)

_RUNNER = textwrap.dedent(
    """
    import json, sys
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    for number, cell in enumerate(json.loads(sys.stdin.read()), 1):
        result = shell.run_cell(cell, store_history=True)
        if not result.success:
            error = result.error_in_exec or result.error_before_exec
            print(f"README block {number} failed: {type(error).__name__}: {error}\\n{cell}")
            sys.exit(1)
    """
)


def readme_cells(path: Path = README) -> list[str]:
    """The runnable blocks of the README (or of another page), in order."""
    return [code for lang, code in _FENCE.findall(path.read_text()) if lang in _RUNNABLE]


def test_the_readme_has_examples_to_run() -> None:
    cells = readme_cells()
    assert len(cells) >= 8
    assert any(cell.startswith("%%torch_library") for cell in cells)
    assert any(cell.startswith("%%custom_op") for cell in cells)


@pytest.mark.slow
def test_every_readme_example_runs_as_written(build_cache: Path, tmp_path: Path) -> None:
    _run_blocks(readme_cells(), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("page", DOCS, ids=[page.stem for page in DOCS])
def test_every_docs_example_runs_as_written(page: Path, build_cache: Path, tmp_path: Path) -> None:
    cells = readme_cells(page)
    assert cells, f"{page.name} has no runnable example"
    _run_blocks(cells, tmp_path)


def _run_blocks(cells: list[str], folder: Path) -> None:
    """Run the blocks in one IPython shell of a fresh process, in ``folder``."""
    done = subprocess.run(  # in a directory of its own: examples save files where they run
        [sys.executable, "-c", _RUNNER],
        cwd=folder,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), PYTHONPATH]))},
        input=json.dumps(cells),
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
