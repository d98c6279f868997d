"""``python -m opmagic``: in a real subprocess as a terminal user runs it, and in-process for
the context options, --svg diagrams and kernels --missing."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from opmagic import kernels
from opmagic.__main__ import _EXAMPLES, main

from .view.svgfacts import svg_facts

ROOT = Path(__file__).resolve().parents[1]
MM_ARGS = ["--args", "torch.randn(2, 2, 3), torch.randn(2, 3, 4)"]


def run_cli(*args: str, columns: int = 100) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": str(columns)}
    return subprocess.run(
        [sys.executable, "-m", "opmagic", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
def test_table():
    result = run_cli("table", "aten::add.Tensor")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("aten::add.Tensor(Tensor self")
    words = " ".join(result.stdout.split())
    assert "AutogradCPU, AutogradCUDA + 16 more keys via Autograd" in words
    assert "PythonDispatcher" not in words  # a fallback: listed with --all, which it names
    assert "with no kernel (a call reaching them fails); all keys: python -m opmagic table" in words
    full = run_cli("table", "aten::add.Tensor", "--all")
    assert "TESTING_ONLY_GenericMode" in full.stdout and "missing" in full.stdout
    assert "PythonDispatcher" in full.stdout


@pytest.mark.parametrize("columns", [60, 80, 150])
def test_output_fits_the_terminal(
    columns: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Every line within $COLUMNS, but for a lone path longer than the line."""
    monkeypatch.setenv("COLUMNS", str(columns))
    for args in (
        ["table", "aten::add.Tensor"],
        ["kernels", "--namespace", "prims"],  # long enough to fold; aten takes seconds
        ["kernels", "-n", "prims", "--wide"],
        ["resolve", "aten::mm", *MM_ARGS, "--vmap"],
    ):
        assert main(args) == 0
        for line in capsys.readouterr().out.splitlines():
            assert len(line) <= columns or " " not in line.strip(), (args, line)


@pytest.mark.slow
def test_table_of_a_packet_without_default_lists_every_overload():
    result = run_cli("table", "aten::add")
    assert result.returncode == 0
    assert "aten::add.Scalar(" in result.stdout and "aten::add.Tensor(" in result.stdout


@pytest.mark.slow
def test_resolve_with_contexts():
    args = "torch.randn(2, 3, requires_grad=True), torch.randn(3, 4)"
    plain = run_cli("resolve", "aten::mm", "--args", args)
    assert plain.returncode == 0, plain.stderr
    assert "path: AutogradCPU -> CPU" in plain.stdout
    autocast = run_cli("resolve", "aten::mm", "--args", args, "--autocast", "cpu")
    assert "path: AutocastCPU -> AutogradCPU -> CPU" in autocast.stdout
    inference = run_cli("resolve", "aten::mm", "--args", args, "--inference-mode")
    assert "path: CPU" in inference.stdout and "inference_mode on" in inference.stdout
    kwargs = run_cli(
        "resolve",
        "aten::add.Tensor",
        "--args",
        "torch.ones(1), torch.ones(1)",
        "--kwargs",
        "dict(alpha=2)",
        "--no-grad",
    )
    assert "no_grad" in kwargs.stdout


@pytest.mark.slow
def test_kernels_long_and_wide_are_folded_with_the_command_for_all_rows():
    long = run_cli("kernels", "--namespace", "aten", "--key", "Meta", "--long", "--rows", "5")
    assert long.returncode == 0, long.stderr
    lines = long.stdout.splitlines()
    assert lines[0].startswith("aten::") and lines[1].startswith("  Meta: ")
    total = len(kernels("aten", ["Meta"]))
    assert (
        " ".join(lines[-2:]).split()
        == (
            f"... {total - 5:,} more rows ({total:,} in all); all of them: python -m opmagic "
            "kernels --namespace aten --key Meta --long --rows all"
        ).split()
    )
    everything = run_cli("kernels", "aten", "--key", "Meta", "--long", "--rows", "all")
    assert "more rows" not in everything.stdout and "NaN" not in everything.stdout
    assert everything.stdout.count("  Meta: ") == total
    wide = run_cli("kernels", "-n", "aten", "-k", "CPU", "-k", "Meta")  # wide, as %kernels
    total_ops = len(kernels("aten", ["CPU"], wide=True))
    assert wide.stdout.splitlines()[0].split() == ["op", "CPU", "Meta"]
    assert "fallback" in wide.stdout and f"{total_ops - 60:,} more rows" in wide.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("table", "aten::addd"), "Unknown operator 'aten::addd'. Did you mean"),
        (("resolve", "aten::mm", "--args", "torch.nope()"), "could not evaluate --args"),
        (("resolve", "aten::mm", "--args", "1, 2"), "No overload of aten::mm accepts"),
        (("resolve", "aten::mm", "--kwargs", "[1]"), "--kwargs must evaluate to a dict"),
        (("kernels", "-n", "nosuchns"), "No operators in namespace 'nosuchns'"),
        (("kernels", "-k", "Autograd"), "'Autograd' is an alias key"),
        (("kernels", "--rows", "0"), "expected a positive number or 'all'"),
    ],
)
def test_errors_are_one_line_on_stderr_with_status_2(args, message):
    result = run_cli(*args)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


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
    assert "PythonDispatcher" in svg_facts(svg.read_text()).all_text


def test_table_svg_needs_one_overload(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    assert main(["table", "aten::add", "--svg", str(tmp_path / "x.svg")]) == 2
    assert "name one for --svg" in capsys.readouterr().err


def test_kernels_missing(capsys: pytest.CaptureFixture) -> None:
    args = ["kernels", "-n", "aten", "-k", "CPU", "--missing", "Meta", "--wide", "--rows", "all"]
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["op", "CPU", "Meta"]
    rows = [line.split() for line in lines[1:] if line.startswith(" ") or len(line.split()) > 1]
    assert rows and all(row[-1] in ("missing", "fallback", "fallthrough") for row in rows)


def test_logging_mode_and_bad_autocast(capsys: pytest.CaptureFixture) -> None:
    args = ["--args", "torch.randn(2, 2), torch.randn(2, 2)"]
    assert main(["resolve", "aten::mm", *args, "--logging-mode"]) == 0
    assert "TorchDispatchMode LoggingMode active" in capsys.readouterr().out
    assert main(["resolve", "aten::mm", *args, "--autocast", "nope"]) == 2
    assert "autocast cannot be turned on for device 'nope'" in capsys.readouterr().err


# ------------------------------------------------------------------ diff

OVERRIDING_MODULE = (
    "import torch\n"
    "lib = torch.library.Library('aten', 'IMPL')\n"
    "def fast_sin(x):\n"
    "    return x * 0\n"
    "lib.impl('sin', fast_sin, 'CPU')\n"
)


@pytest.fixture
def overriding_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An importable module that overrides aten::sin's CPU kernel; undone after the test."""
    name = f"cli_override_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(OVERRIDING_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    module = sys.modules.pop(name, None)
    if module is not None:
        module.lib._destroy()


def test_diff_of_an_import_names_its_aten_override_and_fails_ci_with_the_flag(
    overriding_module: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # the site, a temporary path, on its row
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns (once a process) about the override
        status = main(["diff", "--import", overriding_module, "--fail-on-aten-override"])
    assert status == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("dispatcher diff: 1 kernel; 1 aten override")
    assert lines[1] == "aten overrides (they change what every model runs):"
    assert lines[2].split()[:3] == ["aten::sin", "CPU", "replaced"]
    assert f"{overriding_module}.py:2, was C++ · aten/src/ATen/RegisterCPU" in lines[2]


def test_diff_without_changes_passes_the_flag(capsys: pytest.CaptureFixture) -> None:
    assert main(["diff", "--exec", "import json", "--fail-on-aten-override"]) == 0
    assert capsys.readouterr().out.strip().startswith("dispatcher diff: nothing changed")


def test_diff_says_which_import_failed(capsys: pytest.CaptureFixture) -> None:
    assert main(["diff", "--import", "json", "--import", "no_such_module_here"]) == 2
    assert capsys.readouterr().err.strip() == (
        "opmagic: --import no_such_module_here failed: ModuleNotFoundError: No module named "
        "'no_such_module_here'"
    )


@pytest.mark.slow
def test_diff_in_a_fresh_interpreter(overriding_module: str, tmp_path: Path) -> None:
    env_path = f"{tmp_path}{os.pathsep}{ROOT}"
    for flag, status in (("--fail-on-aten-override", 1), (None, 0)):
        args = ["diff", "--import", overriding_module, *([flag] if flag else [])]
        result = subprocess.run(
            [sys.executable, "-m", "opmagic", *args],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": env_path, "COLUMNS": "100"},
            timeout=120,
            check=False,
        )
        assert result.returncode == status, result.stderr
        assert "aten::sin" in result.stdout and "aten override" in result.stdout


@pytest.mark.slow
def test_help_answers_without_importing_torch_and_shows_examples() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "opmagic", "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    imported = {
        line.rsplit("|", 1)[1].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "opmagic.magics.arguments" in imported  # the options were read
    assert "torch" not in imported and "IPython" not in imported
    examples = result.stdout.split("examples:\n", 1)[1]
    for command in ("table", "resolve", "kernels", "diff", "doctor"):
        assert f"  python -m opmagic {command} " in examples


@pytest.mark.parametrize(
    "example",
    [example for examples in _EXAMPLES.values() for example, _ in examples],
    ids=lambda example: example[:40],
)
def test_every_example_of_the_help_runs(
    example: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    assert main(shlex.split(example)) == 0
    assert capsys.readouterr().out.strip()


DOCTOR_MODULE = """
import torch

@torch.library.custom_op("cli_doctor::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2
"""


@pytest.mark.slow
def test_doctor_of_a_module_op_exits_1_on_findings_and_0_once_fixed(tmp_path: Path) -> None:
    """Spawns Python. The op in an importable module: a finding fails CI; with its fix, it
    passes."""
    (tmp_path / "cli_doctor_ops.py").write_text(DOCTOR_MODULE)
    # wide enough for the site, a temporary path, on its line (longer under pytest-xdist)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}", "COLUMNS": "1000"}

    def doctor_cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "opmagic", "doctor", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )

    found = doctor_cli("cli_doctor_ops:twice", "--until", "make_fx", "--args", "torch.randn(3)")
    assert found.returncode == 1, found.stderr
    assert found.stdout.startswith("doctor cli_doctor::twice: 1 finding: no-fake")
    assert "site: " in found.stdout and "cli_doctor_ops.py:4" in found.stdout
    fix = found.stdout.split("   fix:\n", 1)[1].split("\n  ladder", 1)[0]
    (tmp_path / "cli_doctor_ops.py").write_text(
        DOCTOR_MODULE + "\n" + "\n".join(line[7:] for line in fix.splitlines()) + "\n"
    )
    healthy = doctor_cli("cli_doctor_ops:twice", "--until", "make_fx")
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert "healthy" in healthy.stdout.splitlines()[0]
    bad = doctor_cli("cli_doctor_ops", "--until", "make_fx")
    assert bad.returncode == 2 and "expected MODULE:ATTR" in bad.stderr
