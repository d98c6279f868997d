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
    # a static initialiser that starts a thread which crashes 1.5 s later
    "thread_crash": MINIMAL_INCLUDES
    + NULL_STRING
    + textwrap.dedent(
        """
        #include <chrono>
        #include <thread>
        int start_worker() {
          std::thread([] {
            std::this_thread::sleep_for(std::chrono::milliseconds(1500));
            volatile size_t length = std::strlen(std::getenv("OPMAGIC_NO_SUCH_VARIABLE"));
          }).detach();
          return 0;
        }
        static int started = start_worker();
        TORCH_LIBRARY(crash_thread, m) { m.def("f(Tensor x) -> Tensor"); }
        """
    ),
    # a thread started and joined while loading leaves nothing running: it loads
    "thread_joined": MINIMAL_INCLUDES
    + textwrap.dedent(
        """
        #include <thread>
        static int computed = [] { int v = 0; std::thread([&] { v = 1; }).join(); return v; }();
        TORCH_LIBRARY(crash_joined, m) { m.def("f(Tensor x) -> Tensor"); }
        """
    ),
    # a joinable namespace-scope std::thread: std::terminate when it is destroyed at exit
    "joinable_thread": MINIMAL_INCLUDES
    + textwrap.dedent(
        """
        #include <thread>
        static std::thread worker([] {});
        TORCH_LIBRARY(crash_joinable, m) { m.def("f(Tensor x) -> Tensor"); }
        """
    ),
    # an atexit handler that crashes when the process exits
    "atexit_crash": MINIMAL_INCLUDES
    + NULL_STRING
    + textwrap.dedent(
        """
        void on_exit_handler() {
          volatile size_t length = std::strlen(std::getenv("OPMAGIC_NO_SUCH_VARIABLE"));
        }
        static int registered = std::atexit(on_exit_handler);
        TORCH_LIBRARY(crash_atexit, m) { m.def("f(Tensor x) -> Tensor"); }
        """
    ),
    # an alarm that would kill the process 30 s later
    "alarm": MINIMAL_INCLUDES
    + textwrap.dedent(
        """
        #include <unistd.h>
        static unsigned armed = alarm(30);
        TORCH_LIBRARY(crash_alarm, m) { m.def("f(Tensor x) -> Tensor"); }
        """
    ),
    # a static initialiser that never returns
    "static_hang": MINIMAL_INCLUDES
    + textwrap.dedent(
        """
        #include <chrono>
        #include <thread>
        int wait_forever() {
          while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
          return 0;
        }
        static int value = wait_forever();
        TORCH_LIBRARY(crash_hang, m) { m.def("f(Tensor x) -> Tensor"); }
        """
    ),
    # a block that never returns
    "block_hang": MINIMAL_INCLUDES
    + textwrap.dedent(
        """
        TORCH_LIBRARY(crash_block_hang, m) {
          m.def("f(Tensor x) -> Tensor");
          volatile bool forever = true;
          while (forever) {}
        }
        """
    ),
    # in a header it includes: a torch::Library of its own for aten, whose text never names it
    "header_impl": MINIMAL_INCLUDES
    + '#include "HEADER"\n'
    + textwrap.dedent(
        """
        TORCH_LIBRARY(crash_header, m) { m.def("f(Tensor x) -> Tensor"); }
        """
    ),
}
# the header of "header_impl": an IMPL for an existing operator, outside any block
EVIL_HEADER = MINIMAL_INCLUDES + textwrap.dedent(
    """
    inline at::Tensor not_sin(const at::Tensor& x) { return x.mul(0); }
    static torch::Library not_sin_library(torch::Library::IMPL, "aten", c10::DispatchKey::CPU,
                                          __FILE__, __LINE__);
    static int not_sin_registered = (not_sin_library.impl("sin", not_sin), 0);
    """
)
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

LOAD_LIMIT = 5  # seconds: OPMAGIC_LOAD_TIMEOUT of the child (a probe takes ~1 s)
CHILD = textwrap.dedent(
    """
    import json, os, sys, torch
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
        report["sin"] = torch.sin(torch.ones(1)).item()  # aten::sin untouched
        report["children"] = open(f"/proc/self/task/{os.getpid()}/children").read().split()
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
def outcomes(build_cache, tmp_path_factory) -> dict[str, dict]:
    """What the child reported for each case (it must outlive them all). Builds may take
    :data:`LOAD_LIMIT` seconds to load: the hanging ones are stopped after that."""
    header = tmp_path_factory.mktemp("crash-headers") / "not_sin.h"
    header.write_text(EVIL_HEADER)
    cases = {name: source.replace("HEADER", str(header)) for name, source in CASES.items()}
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=json.dumps([cases, REPLACING]),
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": pythonpath, "OPMAGIC_LOAD_TIMEOUT": str(LOAD_LIMIT)},
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
    assert "registers crash_legacy::triple outside its registration blocks" in report["message"]
    assert report["previous"] == 3.0  # the version it would have replaced is untouched


@pytest.mark.slow
def test_a_torch_library_object_of_its_own_is_refused_with_its_line(outcomes):
    message = outcomes["static_library"]["message"]
    assert message.startswith("cell [2], line 7: ")  # the torch::Library's own __LINE__
    assert "registers crash_own::triple outside its registration blocks" in message


@pytest.mark.slow
def test_a_crash_in_a_stable_block_is_reported(outcomes):
    message = outcomes["stable_block_null"]["message"]
    assert "registering its STABLE_TORCH_LIBRARY(crash_stable) block" in message
    assert "SIGSEGV" in message and "in name_length()" in message


@pytest.mark.slow
def test_a_thread_a_static_initialiser_leaves_running_is_refused_with_its_function(outcomes):
    report = outcomes["thread_crash"]
    assert "loaded" not in report, report
    assert report["message"].startswith("cell [2], line 9: libcrash_thread.so leaves 1 thread")
    assert "running once it is loaded, registered and unregistered" in report["message"]
    assert "in start_worker()'s lambda" in report["message"] and report["line"] == 8
    assert outcomes["thread_joined"].get("loaded"), outcomes["thread_joined"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "found"),
    [
        ("joinable_thread", "std::terminate without an exception (e.g. a std::thread destroyed"),
        ("atexit_crash", "SIGSEGV"),
    ],
)
def test_exit_time_code_that_crashes_is_refused(outcomes, case, found):
    message = outcomes[case]["message"]
    assert "crashed when its static objects were destroyed and its atexit handlers ran" in message
    assert found in message


@pytest.mark.slow
def test_an_atexit_handler_that_crashes_is_named(outcomes):
    report = outcomes["atexit_crash"]
    assert "in on_exit_handler()" in report["message"] and report["line"] == 6


@pytest.mark.slow
def test_an_alarm_left_armed_is_refused(outcomes):
    message = outcomes["alarm"]["message"]
    assert "leaves a timer that sends SIGALRM in " in message, message


@pytest.mark.slow
def test_a_static_initialiser_that_never_returns_is_a_load_error_at_its_line(outcomes):
    report = outcomes["static_hang"]
    assert report["message"].startswith(
        f"cell [2], line 7: libcrash_hang.so did not finish while it was loaded, in a static "
        f"initialiser (a namespace-scope variable's initialiser or a static object's "
        f"constructor) within {LOAD_LIMIT} s, in wait_forever()"
    ), report["message"]
    assert "set OPMAGIC_LOAD_TIMEOUT" in report["message"] and report["line"] == 6
    assert report["children"] == []  # the probe's child was killed (and reaped)


@pytest.mark.slow
def test_a_block_that_never_returns_is_a_load_error_at_the_block(outcomes):
    report = outcomes["block_hang"]
    assert report["message"].startswith(
        "cell [2], line 5: libcrash_block_hang.so did not finish while registering its "
        "TORCH_LIBRARY(crash_block_hang) block within"
    ), report["message"]
    assert report["line"] == 4 and report["children"] == []


@pytest.mark.slow
def test_a_header_registering_for_a_namespace_the_cell_never_names_is_refused(outcomes):
    report = outcomes["header_impl"]
    assert "libcrash_header.so registers aten::sin (at " in report["message"]
    assert "not_sin.h:6) outside its registration blocks" in report["message"]
    assert report["sin"] == pytest.approx(0.8414709848)  # aten::sin's own kernel, still


# loads the library of the source on stdin; argv[1] "crash": calls its op, which aborts
_LOAD_CHILD = textwrap.dedent(
    """
    import json, sys, torch
    from opmagic import compile_library
    library = compile_library(sys.stdin.read(), progress=None)
    if sys.argv[1] == "crash":
        torch.ops.crash_later.f(torch.ones(1))
    print(json.dumps({"notes": library.notes, "cached": library.build.cached}))
    """
)


def _load_in_child(source: str, action: str) -> subprocess.CompletedProcess:
    """Run :data:`_LOAD_CHILD` on ``source`` in a fresh process."""
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", _LOAD_CHILD, action],
        input=source,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": pythonpath},
        check=False,
        timeout=600,
    )


@pytest.mark.slow
def test_a_build_that_crashed_a_process_is_never_loaded_again_without_saying_so(build_cache):
    source = op_source(
        "crash_later",
        op="f",
        schema="f(Tensor x) -> Tensor",
        kernel="at::Tensor f(const at::Tensor& x) { std::abort(); return x; }",
    )
    clean = json.loads(_load_in_child(source, "load").stdout)
    assert clean["notes"] == []  # it passes the probe: the crash comes when it is called
    crashed = _load_in_child(source, "crash")
    assert crashed.returncode == -6, crashed.stderr[-2000:]  # SIGABRT ended the process
    for _ in range(2):  # remembered: every later load says so, and tries it in a child first
        later = _load_in_child(source, "load")
        (note,) = json.loads(later.stdout)["notes"]
        assert "this build was loaded in a process (pid " in note
        assert "ended without exiting normally: it crashed or was killed" in note
