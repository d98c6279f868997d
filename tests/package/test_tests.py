"""Tests generated from the session's checks (opmagic/package/tests.py): a case per sample,
the samples saved for torch.load(weights_only=True) with their devices, skips for devices and
builds that are not there, notes for checks that make no test."""

from __future__ import annotations

import ast
import io
import json
import os
import subprocess
import sys

import pytest
import torch

from opmagic.cells.history import CheckRun, CheckSample
from opmagic.package.tests import Operator, _param, generated_tests

OPERATORS = (
    Operator("gen::f", "gen::f(Tensor x) -> Tensor", "[2]", "ops.py", has_fake=True),
    Operator("gen::g", "gen::g(Tensor x) -> Tensor", "[3]", "csrc/cuda/g.cu", has_fake=False,
             cuda_only=True),
    Operator("gen::h", "gen::h(Tensor x) -> Tensor", "[3]", "ops.py", has_fake=True),
)
X = torch.arange(3.0, requires_grad=True)
RUNS = (
    CheckRun("opcheck", "gen::f.default", (CheckSample((X,), {"alpha": 2}),), {}, "[4]"),
    CheckRun("opcheck", "gen::f.default", (CheckSample((X.detach().to("meta"),)),),
             {"test_utils": ("test_schema",)}, "[4]"),
    CheckRun("compare", "gen::g", (CheckSample((X,), {}, X * 2, (X,)),),
             {"reference": "torch.mul", "rtol": 1e-3, "atol": 1e-5}, "[5]"),
    CheckRun("gradcheck", "gen::f.default", (CheckSample((X,)),), {}, "[4]"),
    CheckRun("opcheck", "aten::sin.default", (CheckSample((X,)),), {}, "[6]"),
    CheckRun("doctor", "gen::f.default", (CheckSample((X,)),), {}, "[7]"),
)


def test_every_sample_is_a_case_and_every_op_with_a_fake_and_a_sample_compiles() -> None:
    tests = generated_tests("gen_pkg", OPERATORS, RUNS)
    assert tests.counts == {"opcheck": 2, "gradcheck": 1, "compare": 1, "compile": 1}
    tree = ast.parse(tests.module)
    functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
    assert functions[-5:] == [
        "test_the_operators_have_the_schemas_of_ops_json",
        "test_opcheck",
        "test_gradcheck",
        "test_matches_the_reference",
        "test_compiles_with_fullgraph",
    ]
    assert "import gen_pkg" in tests.module
    assert "pytest.param('gen::f.default', 'opcheck-2', ('test_schema',)" in tests.module
    assert "pytest.param('gen::g', 'compare-3', 0.001, 1e-05, id='g-cell5-3', " \
           "marks=[_CUDA_BUILD])" in tests.module
    assert "pytest.param('gen::f.default', 'opcheck-1', None, id='f.default-cell4-1')" in (
        tests.module
    )


def test_the_samples_load_with_weights_only_and_keep_devices_and_requires_grad() -> None:
    tests = generated_tests("gen_pkg", OPERATORS, RUNS)
    samples = torch.load(io.BytesIO(tests.samples), weights_only=True)
    first = samples["opcheck-1"]
    assert first["devices"] == ["cpu"] and first["kwargs"] == {"alpha": 2}
    assert first["args"][0].requires_grad and first["args"][0].device.type == "cpu"
    assert samples["opcheck-2"]["devices"] == ["meta"]
    compared = samples["compare-3"]
    torch.testing.assert_close(compared["expected"], X.detach() * 2)
    assert compared["expected_args_devices"] == ["cpu"]


def test_checks_that_make_no_test_are_noted() -> None:
    tests = generated_tests("gen_pkg", OPERATORS, RUNS)
    assert tests.notes == [
        "cell [6]'s opcheck of aten::sin.default is not of an operator of the package: not a "
        "test of it",
        "cell [7]'s doctor of gen::f.default: no test is made of this kind of check yet",
        "gen::h has a fake but no sample to compile it on: run check_op or %%custom_op --check "
        "on it once, then export again",
    ]


def test_a_cuda_sample_skips_without_a_cuda_device() -> None:
    # no CUDA tensor can be made here: the case line of a sample whose tensor was on cuda:0
    line = _param("gen::f.default", "opcheck-1", "[4]", ["cuda:0", "cpu"], OPERATORS[0], "")
    assert line.endswith("marks=[_needs('cuda')]),")


PACKAGE_INIT = '''"""A package defining gen_run::plus_one as an export would."""
import torch

LOADED = ()
CUDA_BUILD = False


@torch.library.custom_op("gen_run::plus_one", mutates_args=())
def plus_one(x: torch.Tensor) -> torch.Tensor:
    return x + 1


plus_one.register_fake(lambda x: torch.empty_like(x))
plus_one.register_autograd(lambda ctx, grad: grad, setup_context=lambda ctx, inputs, output: None)
'''


@pytest.mark.slow
def test_the_generated_tests_run_and_a_wrong_expectation_fails(tmp_path) -> None:
    operator = Operator(
        "gen_run::plus_one", "gen_run::plus_one(Tensor x) -> Tensor", "[2]", "ops.py", True
    )
    x = torch.randn(4, requires_grad=True)
    runs = [
        CheckRun("opcheck", "gen_run::plus_one.default", (CheckSample((x,)),), {}, "[3]"),
        CheckRun("opcheck", "gen_run::plus_one.default", (CheckSample((x.detach(),)),),
                 {"test_utils": ("test_schema", "test_faketensor")}, "[3]"),
        CheckRun("gradcheck", "gen_run::plus_one.default", (CheckSample((x,)),), {}, "[3]"),
        CheckRun("compare", "gen_run::plus_one", (
            CheckSample((x.detach(),), {}, x.detach() + 1, (x.detach(),)),
            CheckSample((x.detach(),), {}, x.detach() + 2, (x.detach(),)),  # a wrong one
        ), {"reference": "f", "rtol": None, "atol": None}, "[4]"),
    ]
    tests = generated_tests("gen_run_pkg", [operator], runs)
    (tmp_path / "gen_run_pkg").mkdir()
    (tmp_path / "gen_run_pkg" / "__init__.py").write_text(PACKAGE_INIT)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_ops.py").write_text(tests.module)
    (tmp_path / "tests" / "samples.pt").write_bytes(tests.samples)
    snapshot = {"operators": [{"name": operator.name, "schema": operator.schema,
                               "cuda_only": False}]}
    (tmp_path / "ops.json").write_text(json.dumps(snapshot))
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=tmp_path, capture_output=True, text=True, check=False, timeout=900,
        env={**os.environ, "PYTHONPATH": str(tmp_path), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )
    summary = run.stdout.strip().splitlines()[-1]
    assert "1 failed, 6 passed" in summary, run.stdout[-3000:]
    assert "FAILED tests/test_ops.py::test_matches_the_reference[plus_one-cell4-5]" in run.stdout
