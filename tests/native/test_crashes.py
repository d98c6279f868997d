"""C++ that crashes or registers outside its blocks never ends the process that loads it.

Every case runs in a child Python (one for the module): were the probe broken, the child
would die, not the test run. The child compiles each source (after, for some, a good version
it replaces), reports what ``compile_library`` raised and whether the good version still
works, one JSON line per case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .sources import MINIMAL_INCLUDES, op_source

ROOT = Path(__file__).resolve().parents[2]
NULL_STRING = "#include <cstdlib>\n#include <cstring>\n"

CASES = {
    # a null dereference (strlen of a missing variable) inside a registration block
    "block_null": MINIMAL_INCLUDES
    + NULL_STRING
    + textwrap.dedent(
        """
        size_t name_length() { return std::strlen(std::getenv("OPMAGIC_NO_SUCH_VARIABLE")); }
        TORCH_LIBRARY(crash_block, m) {
          m.def("f(Tensor x) -> Tensor");
          name_length();
        }
        """
    ),
    # a static initialiser that throws: std::terminate inside dlopen
    "static_throw": MINIMAL_INCLUDES
    + textwrap.dedent(
        """
        #include <stdexcept>
        int explode() { throw std::runtime_error("no configuration"); }
        static int value = explode();
        TORCH_LIBRARY(crash_throw, m) { m.def("f(Tensor x) -> Tensor"); }
        """
    ),
    # a static initialiser that dereferences null
    "static_null": MINIMAL_INCLUDES
    + NULL_STRING
    + textwrap.dedent(
        """
        size_t read_null() { return std::strlen(std::getenv("OPMAGIC_NO_SUCH_VARIABLE")); }
        static size_t value = read_null();
        TORCH_LIBRARY(crash_static, m) { m.def("f(Tensor x) -> Tensor"); }
        """
    ),
    # the legacy registration API, outside any block
    "register_operators": MINIMAL_INCLUDES
    + textwrap.dedent(
        """
        at::Tensor triple(const at::Tensor& x) { return x.mul(3); }
        static auto registry =
            torch::RegisterOperators().op("crash_legacy::triple(Tensor x) -> Tensor", &triple);
        """
    ),
    # a namespace-scope torch::Library of its own
    "static_library": MINIMAL_INCLUDES
    + textwrap.dedent(
        """
        at::Tensor triple(const at::Tensor& x) { return x.mul(3); }
        static torch::Library lib(torch::Library::FRAGMENT, "crash_own", std::nullopt,
                                  __FILE__, __LINE__);
        static int defined = (lib.def("triple(Tensor x) -> Tensor", &triple), 0);
        """
    ),
    # the stable ABI: a null dereference in a STABLE_TORCH_LIBRARY block
    "stable_block_null": NULL_STRING
    + textwrap.dedent(
        """
        #include <torch/csrc/stable/library.h>
        size_t name_length() { return std::strlen(std::getenv("OPMAGIC_NO_SUCH_VARIABLE")); }
        STABLE_TORCH_LIBRARY(crash_stable, m) {
          m.def("f(Tensor x) -> Tensor");
          name_length();
        }
        """
    ),
}
# the case, and the good version it replaces (None: nothing before)
REPLACING = {
    "register_operators": op_source(
        "crash_legacy",
        op="triple",
        schema="triple(Tensor x) -> Tensor",
        kernel="at::Tensor triple(const at::Tensor& x) { return x.mul(3); }",
    ),
    "block_null": op_source(
        "crash_block",
        op="f",
        schema="f(Tensor x) -> Tensor",
        kernel="at::Tensor f(const at::Tensor& x) { return x.mul(3); }",
    ),
}

CHILD = textwrap.dedent(
    """
    import json, sys, torch
    from opmagic import compile_library
    from opmagic.errors import LoadError
    cases, replacing = json.loads(sys.stdin.read())
    for name, source in cases.items():
        previous = None
        if name in replacing:
            previous = compile_library(replacing[name], label="cell [1]", first_line=2,
                                       progress=None)
        report = {"case": name}
        try:
            compile_library(source, replace=previous, label="cell [2]", first_line=2,
                            progress=None)
            report["loaded"] = True
        except LoadError as error:
            report.update(message=str(error), line=error.line)
        if previous is not None:
            namespace = previous.namespaces[0]
            op = previous.operators[0].name.split("::")[1]
            report["previous"] = getattr(torch.ops, namespace).__getattr__(op)(torch.ones(1)).item()
            previous.close()
        print(json.dumps(report), flush=True)
    print(json.dumps({"case": "end"}), flush=True)
    """
)


@pytest.fixture(scope="module")
def outcomes(build_cache) -> dict[str, dict]:
    """What the child reported for each case (it must outlive them all)."""
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=json.dumps([CASES, REPLACING]),
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": pythonpath},
        check=False,
        timeout=1800,
    )
    reports = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert result.returncode == 0 and reports[-1] == {"case": "end"}, result.stderr[-3000:]
    return {report["case"]: report for report in reports}


@pytest.mark.slow
def test_a_null_dereference_in_a_block_names_the_function_and_keeps_the_previous_version(
    outcomes,
):
    report = outcomes["block_null"]
    assert report["message"].startswith("cell [2], line 7: libcrash_block.so crashed while ")
    assert (
        "registering its TORCH_LIBRARY(crash_block) block (cell [2], line 8)" in report["message"]
    )
    assert "SIGSEGV" in report["message"] and "in name_length()" in report["message"]
    assert "cell [1] stays registered" in report["message"] and report["line"] == 6
    assert report["previous"] == 3.0  # the good version, still registered


@pytest.mark.slow
def test_a_static_initialiser_that_throws_names_the_exception_and_the_line(outcomes):
    message = outcomes["static_throw"]["message"]
    assert message.startswith("cell [2], line 6: libcrash_throw.so crashed while it was loaded")
    assert "uncaught std::runtime_error: no configuration" in message
    assert "in explode()" in message


@pytest.mark.slow
def test_a_static_initialiser_that_crashes_is_reported(outcomes):
    message = outcomes["static_null"]["message"]
    assert "crashed while it was loaded, in a static initialiser" in message
    assert "SIGSEGV" in message and "in read_null()" in message


@pytest.mark.slow
def test_register_operators_outside_a_block_is_refused_with_its_line(outcomes):
    report = outcomes["register_operators"]
    assert report["message"].startswith("cell [2], line 7: ")  # the line naming the operator
    assert (
        "registers crash_legacy::triple when it is loaded, outside a registration block"
        in (report["message"])
    )
    assert report["previous"] == 3.0  # the version it would have replaced is untouched


@pytest.mark.slow
def test_a_torch_library_object_of_its_own_is_refused_with_its_line(outcomes):
    message = outcomes["static_library"]["message"]
    assert message.startswith("cell [2], line 7: ")  # the torch::Library's own __LINE__
    assert "registers crash_own::triple when it is loaded" in message


@pytest.mark.slow
def test_a_crash_in_a_stable_block_is_reported(outcomes):
    message = outcomes["stable_block_null"]["message"]
    assert "registering its STABLE_TORCH_LIBRARY(crash_stable) block" in message
    assert "SIGSEGV" in message and "in name_length()" in message
