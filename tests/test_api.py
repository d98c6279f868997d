"""The package's public names: ``import opmagic`` imports no torch; each name of ``__all__``
comes from ``opmagic._api`` on first use, and every name ``_api`` gathers is in ``__all__``."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import opmagic

ROOT = Path(__file__).resolve().parents[1]
DEFINED_HERE = {"explore", "load_ipython_extension", "unload_ipython_extension"}


def _gathered() -> set[str]:
    """The names ``opmagic/_api.py`` imports (the views' package aside)."""
    tree = ast.parse((ROOT / "opmagic" / "_api.py").read_text())
    return {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    } - {"view"}


def test_every_public_name_is_gathered_once_and_resolves() -> None:
    assert set(opmagic.__all__) - DEFINED_HERE == _gathered()
    assert len(opmagic.__all__) == len(set(opmagic.__all__))
    for name in opmagic.__all__:
        assert getattr(opmagic, name) is not None, name
    with pytest.raises(AttributeError, match="module 'opmagic' has no attribute 'nope'"):
        opmagic.nope  # noqa: B018


@pytest.mark.slow
def test_import_opmagic_imports_no_torch_until_a_name_is_used() -> None:
    probe = (
        "import sys, opmagic\n"
        "before = 'torch' in sys.modules\n"
        "r = opmagic.dispatch_table('aten::sin')\n"
        "loaded = 'opmagic.view.table' in sys.modules\n"
        "str(r)\n"
        "print(before, 'torch' in sys.modules, loaded, 'opmagic.view.table' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120
    )
    # torch with the first name used; a result's view module when it is first shown
    assert done.stdout.split() == ["False", "True", "False", "True"], done.stderr
