"""``import opmagic`` and ``%load_ext opmagic`` stay light: heavy modules load when first used,
and each result type's view module is imported the first time such a result is displayed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# what a session must not pay for before it uses the feature that needs it
HEAVY = (
    "pandas",
    "matplotlib",
    "torch.utils.benchmark",
    "graphviz",
    "ipywidgets",
    "IPython",
    "setuptools",
    "torch.utils.cpp_extension",
    "torch._dynamo",
    "torch._inductor",
)

PROBE = f"""
import json, sys
import torch
import opmagic
imported = [name for name in {HEAVY!r} if name in sys.modules]
views = sorted(name for name in sys.modules if name.startswith("opmagic.view."))
table = opmagic.dispatch_table("aten::add.Tensor")
text = str(table)
drawn = sorted(name for name in sys.modules if name.startswith("opmagic.view."))
from IPython.core.interactiveshell import InteractiveShell
InteractiveShell.instance().run_line_magic("load_ext", "opmagic")
loaded = [name for name in ("setuptools", "torch.utils.cpp_extension") if name in sys.modules]
print(json.dumps({{"heavy": imported, "views": views, "drawn": drawn, "text": text[:40],
                  "load_ext": loaded}}))
"""

# every renderer a view module registers, by the module whose body registered it
REGISTRATIONS = """
import json, pkgutil, importlib, sys
import opmagic
from opmagic import display, view
registered = {}
renders = display.renders
def recording(cls, form):
    module = sys._getframe(1).f_globals["__name__"]
    registered.setdefault(module, set()).add(f"{cls.__module__}.{cls.__qualname__}")
    return renders(cls, form)
display.renders = recording
for module in pkgutil.walk_packages(view.__path__, "opmagic.view."):
    importlib.import_module(module.name)
print(json.dumps({module: sorted(types) for module, types in registered.items()}))
"""


def _child(code: str) -> dict:
    """Run ``code`` in a fresh Python importing this checkout; its JSON report."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    output = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    ).stdout
    return json.loads(output.splitlines()[-1])


@pytest.mark.slow
def test_import_opmagic_loads_no_heavy_module_and_no_view_until_a_result_is_shown(
    build_cache: Path,
) -> None:
    """(``%load_ext``'s warm-ups run in the test run's build cache.)"""
    report = _child(PROBE)
    assert report["heavy"] == []
    assert report["views"] == []
    assert report["text"].startswith("aten::add.Tensor")  # drawn by its view, imported now
    assert "opmagic.view.table" in report["drawn"]
    assert "opmagic.view.trace" not in report["drawn"]  # only what was displayed
    assert report["load_ext"] == []  # the warm-ups import no setuptools


@pytest.mark.slow
def test_each_view_module_is_named_for_every_type_it_draws() -> None:
    from opmagic.view import DRAWS

    registered = _child(REGISTRATIONS)
    outside = {
        module.removeprefix("opmagic.view."): [t for t in types if not t.startswith("opmagic.view")]
        for module, types in registered.items()
    }
    assert {module: tuple(types) for module, types in outside.items() if types} == DRAWS
