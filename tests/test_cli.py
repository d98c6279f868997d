"""``python -m opmagic``: the context options, --svg diagrams and kernels --missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from opmagic.__main__ import main

from .view.svgfacts import svg_facts

MM_ARGS = ["--args", "torch.randn(2, 2, 3), torch.randn(2, 3, 4)"]


def test_resolve_under_contexts_writes_the_path_diagram(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    svg = tmp_path / "path.svg"
    assert main(["resolve", "aten::mm", *MM_ARGS, "--vmap", "--fake", "--svg", str(svg)]) == 0
    out = capsys.readouterr().out
    assert "path: FuncTorchDynamicLayerFrontMode -> FuncTorchBatched" in out
    assert "TorchDispatchMode FakeTensorMode active" in out
    facts = svg_facts(svg.read_text())
    assert {"FuncTorchDynamicLayerFrontMode", "FuncTorchBatched", "Meta"} <= facts.path_nodes()


def test_table_svg_draws_every_key_with_all(tmp_path: Path) -> None:
    svg = tmp_path / "table.svg"
    assert main(["table", "aten::add.Tensor", "--all", "--svg", str(svg)]) == 0
    assert "PythonDispatcher" in svg_facts(svg.read_text()).nodes


def test_table_svg_needs_one_overload(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    assert main(["table", "aten::add", "--svg", str(tmp_path / "x.svg")]) == 2
    assert "name one for --svg" in capsys.readouterr().err


def test_kernels_missing(capsys: pytest.CaptureFixture) -> None:
    assert main(["kernels", "-n", "aten", "-k", "CPU", "--missing", "Meta", "--wide"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["CPU", "Meta"]
    assert all(line.split()[-1] in ("missing", "fallback", "fallthrough") for line in lines[2:])


def test_logging_mode_and_bad_autocast(capsys: pytest.CaptureFixture) -> None:
    args = ["--args", "torch.randn(2, 2), torch.randn(2, 2)"]
    assert main(["resolve", "aten::mm", *args, "--logging-mode"]) == 0
    assert "TorchDispatchMode LoggingMode active" in capsys.readouterr().out
    assert main(["resolve", "aten::mm", *args, "--autocast", "nope"]) == 2
    assert "autocast cannot be turned on for device 'nope'" in capsys.readouterr().err
