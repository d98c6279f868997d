"""The operator observer shim: a log of every operator call on this thread (and on the threads
torch hands its work to), against real calls."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from opmagic._torch import op_observer
from opmagic._torch.modules import module_call_codes
from opmagic.errors import CacheDirectoryError

ROOT = Path(__file__).resolve().parents[2]


class Describer:
    """A ``describe`` callback that hands out one segment id per question and remembers them."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.questions: list[tuple[str, str, tuple[Any, ...], bool]] = []
        self.fail_on = fail_on

    def __call__(self, op: int, name: str, overload: str, inputs: tuple, decides: bool):
        if name == self.fail_on:
            raise ValueError(f"refusing {name}")
        self.questions.append((name, overload, inputs, decides))
        torch.ones(1)  # ops the callback runs itself are not logged
        return len(self.questions) - 1, ("summary",) if decides else None, 0


def observe(
    fn, describe: Describer | None = None, still_valid: bool = False, **options: Any
) -> tuple[list, list, Any, Describer]:
    """Log ``fn()``; ``still_valid``: what ``check`` answers (False: ask about every call).
    Returns the tracing thread's events."""
    ops, threads, error, describe = observe_threads(fn, describe, still_valid, **options)
    return ops, threads[0][3], error, describe


def observe_threads(
    fn, describe: Describer | None = None, still_valid: bool = False, **options: Any
) -> tuple[list, list, Any, Describer]:
    """Log ``fn()``: every thread's log."""
    describe = describe or Describer()
    op_observer.start(describe, lambda op, name, overload: still_valid, "tests", **options)
    try:
        fn()
    finally:
        ops, threads, error = op_observer.stop()
    return ops, threads, error, describe


def nesting(ops: list, events: list) -> list[str]:
    """The log as indented names: operators, and ranges and nodes in brackets."""
    depth, lines = 0, []
    for event in events:
        kind = event[0]
        if kind == op_observer.EXIT:
            depth -= 1
            continue
        if kind >= 0:
            name, overload = ops[kind]
            label = f"{name}.{overload}" if overload else name
        else:
            label = f"[{event[1]}]"
        lines.append("  " * depth + label)
        depth += 1
    return lines


def test_logs_calls_nested_as_they_ran_with_their_arguments() -> None:
    x = torch.randn(2, 3)
    ops, events, error, describe = observe(lambda: torch.nn.functional.linear(x, torch.ones(4, 3)))
    assert error is None
    lines = nesting(ops, events)
    assert "aten::linear" in lines
    assert "  aten::t" in lines  # called by linear's CompositeImplicitAutograd kernel
    assert lines.count("aten::ones") == 1  # the describer's own torch.ones is not logged
    linear = next(q for q in describe.questions if q[0] == "aten::linear")
    assert linear[2][0] is x and linear[3] is False
    enter = next(e for e in events if e[0] >= 0 and ops[e[0]] == ("aten::linear", ""))
    kinds, values = enter[4]
    assert kinds == "ttv" and values[0] == (torch.float32, "cpu", (2, 3), False)


def test_describe_gets_each_kind_of_argument_as_the_python_value_it_was() -> None:
    generator = torch.Generator().manual_seed(1234)
    x, index = torch.randn(2, 3), torch.tensor([0, 2])

    def calls() -> None:
        x + 1
        torch.randn(2, generator=generator)
        torch.full((2,), 1 + 2j)
        x.to(torch.device("meta"), torch.float64)
        x[:, index] = 0.5
        torch.ops.aten.div.Tensor_mode(x, x, rounding_mode="floor")

    _, _, error, describe = observe(calls)
    assert error is None
    asked = {(name, overload): inputs for name, overload, inputs, _ in describe.questions}
    one = asked[("aten::add", "Tensor")][1]  # a wrapped number reaches the kernel as a tensor
    assert isinstance(one, torch.Tensor) and one.item() == 1
    size, passed = asked[("aten::randn", "generator")][:2]  # a new wrapper of the same one
    assert size == [2] and passed.initial_seed() == generator.initial_seed()
    assert asked[("aten::full", "")][1] == 1 + 2j
    assert asked[("aten::to", "device")][1] == torch.device("meta")
    indices = asked[("aten::index_put_", "")][1]
    assert indices[0] is None and indices[1] is index
    assert asked[("aten::div", "Tensor_mode")][2] == "floor"


def test_asks_once_per_operator_and_dispatch_state_and_keeps_the_answers() -> None:
    x = torch.randn(3)

    def calls() -> None:
        for _ in range(5):
            torch.sin(x)
        with torch.no_grad():
            torch.sin(x)

    op_observer.start(Describer(), lambda *op: True, "another owner")  # their answers are
    op_observer.stop()  # theirs: the next owner starts afresh
    _, events, _, describe = observe(calls, still_valid=True)
    assert [q[0] for q in describe.questions] == ["aten::sin", "aten::sin"]  # grad, no_grad
    segments = [e[1] for e in events if e[0] >= 0]
    assert segments == [0, 0, 0, 0, 0, 1]
    _, again, _, asked = observe(calls, still_valid=True)  # check says the answers hold
    assert asked.questions == [] and [e[1] for e in again if e[0] >= 0] == segments
    _, _, _, asked = observe(calls, still_valid=False)  # registrations changed: ask again
    assert len(asked.questions) == 2


def test_always_asks_when_python_code_decides_the_path() -> None:
    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    x = torch.randn(3)

    def calls() -> None:
        with PassThrough():
            torch.sin(x)
            torch.sin(x)

    ops, events, _, describe = observe(calls)
    decided = [q[3] for q in describe.questions if q[0] == "aten::sin"]
    # each call asks (the mode decides); the mode's own calls of sin ask once, then hit
    assert decided == [True, False, True]
    enters = [e for e in events if e[0] >= 0 and ops[e[0]][0] == "aten::sin"]
    assert enters[0][4] == ("summary",)


def test_an_exception_leaving_a_call_marks_its_exit() -> None:
    def calls() -> None:
        with pytest.raises(RuntimeError):
            torch.ones(2) @ torch.ones(3)

    _, events, _, _ = observe(calls)
    exits = [e[1] for e in events if e[0] == op_observer.EXIT]
    assert exits[-1] is True  # matmul raised
    assert exits[0] is False  # the first torch.ones returned


def test_an_exception_in_describe_stops_the_log_and_is_handed_back() -> None:
    ops, events, error, _ = observe(
        lambda: (torch.randn(2).sin(), torch.ones(2)), Describer(fail_on="aten::sin")
    )
    assert isinstance(error, ValueError) and "aten::sin" in str(error)
    assert all(ops[e[0]][0] != "aten::ones" for e in events if e[0] >= 0)
    assert not op_observer.running()


def test_threads_torch_did_not_hand_work_to_are_not_logged() -> None:
    worker = threading.Thread(target=lambda: torch.ones(2).cos())
    ops, threads, _, _ = observe_threads(
        lambda: (worker.start(), worker.join(), torch.ones(1).sin())
    )
    names = {name for name, _ in ops}
    assert "aten::sin" in names and "aten::cos" not in names
    assert len(threads) == 1


def test_autograd_nodes_and_the_engines_ranges_are_logged_with_their_numbers() -> None:
    """A node's record carries the sequence number its forward call carried, and the thread
    that made it; the engine's evaluate_function range holds the node (a range asked for)."""
    x = torch.randn(3, requires_grad=True)
    ranges = ("autograd::engine::evaluate_function: ",)
    ops, events, error, _ = observe(lambda: x.sin().sum().backward(), ranges=ranges)
    assert error is None
    lines = nesting(ops, events)
    assert "[autograd::engine::evaluate_function: SinBackward0]" in lines
    assert "  [SinBackward0]" in lines  # the node inside the engine's range
    sin = next(e for e in events if e[0] >= 0 and ops[e[0]] == ("aten::sin", ""))
    node = next(e for e in events if e[0] == op_observer.NODE and e[1] == "SinBackward0")
    assert sin[5] >= 0 and node[5] == sin[5]  # the sequence number ties them
    assert node[7] == next(iter(threads_of(ops, events)))  # the forward thread
    _, plain, _, _ = observe(lambda: x.sin().sum().backward())  # ranges not asked for
    assert not [e for e in plain if e[0] == op_observer.RANGE]


def threads_of(ops: list, events: list) -> set[int]:
    """The RecordFunction thread ids the nodes of a log name as their forward threads."""
    return {e[7] for e in events if e[0] == op_observer.NODE}


def test_calls_on_threads_torch_hands_work_to_get_logs_of_their_own() -> None:
    """The autograd engine runs a backward re-entered deeply on a thread of its pool, with
    the caller's thread-local state: the observer's callbacks with it."""

    class Reenter(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, depth):
            ctx.depth = depth
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            if ctx.depth > 0:
                with torch.enable_grad():
                    y = torch.ones(1, requires_grad=True)
                    torch.autograd.grad(Reenter.apply(y, ctx.depth - 1).sum(), y)
            return grad.cos(), None

    x = torch.ones(1, requires_grad=True)
    ops, threads, error, _ = observe_threads(lambda: Reenter.apply(x, 80).sum().backward())
    assert error is None and len(threads) == 2
    (main, _, main_id, _), (other, _, other_id, events) = threads
    assert main == threading.get_native_id() and other != main and other_id != main_id
    assert "aten::cos" in {ops[e[0]][0] for e in events if e[0] >= 0}


def test_origins_name_the_users_frame_and_the_modules_inside_the_stop_frame() -> None:
    layer = torch.nn.Linear(3, 2)
    model = torch.nn.Sequential(layer)
    x = torch.randn(1, 3)

    def code(frame_code) -> bool:
        return frame_code.co_filename == __file__

    def run() -> None:
        model(x)

    stop = sys._getframe()
    ops, events, _, _ = observe(
        run, user_code=code, module_calls=module_call_codes(), stop_frame=stop
    )
    linear = next(e for e in events if e[0] >= 0 and ops[e[0]] == ("aten::linear", ""))
    frame_code, line, modules = linear[6]
    assert frame_code is run.__code__ and line == run.__code__.co_firstlineno + 1
    assert modules == (model, layer)  # outermost first
    inner = events[events.index(linear) + 1]  # linear's first call: a C++ kernel's, inherited
    assert inner[0] >= 0 and inner[6] is None


def test_modules_around_the_stop_frame_are_not_read() -> None:
    found = {}

    class Outer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(3, 2)

        def forward(self, x: torch.Tensor) -> None:
            stop = sys._getframe()  # a trace started in here: Outer runs around it
            found["log"] = observe(
                lambda: self.layer(x),
                module_calls=module_call_codes(),
                stop_frame=stop,
                user_code=lambda c: c.co_filename == __file__,
            )

    outer = Outer()
    outer(torch.randn(1, 3))
    ops, events, _, _ = found["log"]
    linear = next(e for e in events if e[0] >= 0 and ops[e[0]] == ("aten::linear", ""))
    assert linear[6][2] == (outer.layer,)


def test_a_python_kernels_calls_read_their_own_origin() -> None:
    @torch.library.custom_op("opmagic_observer_test::clip", mutates_args=())
    def clip(x: torch.Tensor) -> torch.Tensor:
        return x.clamp(-1, 1)

    class Flags(Describer):
        def __call__(self, op, name, overload, inputs, decides):
            segment, summary, _ = super().__call__(op, name, overload, inputs, decides)
            return segment, summary, op_observer.RUNS_PYTHON if "clip" in name else 0

    ops, events, _, _ = observe(
        lambda: clip(torch.randn(2)), Flags(), user_code=lambda c: c.co_filename == __file__
    )
    clamp = next(e for e in events if e[0] >= 0 and ops[e[0]] == ("aten::clamp", ""))
    assert clamp[6][0].co_name == "clip"


def test_values_summarise_outputs_below_autograd() -> None:
    x = torch.tensor([1.0, -2.0, 4.0], requires_grad=True)

    def calls() -> None:
        y = x * 2
        z = y.sin()
        assert z.grad_fn._sequence_nr() - y.grad_fn._sequence_nr() == 1  # none taken between

    ops, events, error, _ = observe(calls, values=True)
    assert error is None
    mul = events.index(next(e for e in events if e[0] >= 0 and ops[e[0]][0] == "aten::mul"))
    depth, exit_event = 0, None
    for event in events[mul + 1 :]:
        depth += 1 if event[0] != op_observer.EXIT else -1
        if depth < 0:
            exit_event = event
            break
    ((tensor, numbers),) = exit_event[4]
    assert tensor == (torch.float32, "cpu", (3,), True)
    assert numbers == pytest.approx((-4.0, 8.0, 2.0))


def test_hidden_calls_are_counted_not_logged_and_not_remembered() -> None:
    class Hider(Describer):
        def __call__(self, op, name, overload, inputs, decides):
            segment, summary, _ = super().__call__(op, name, overload, inputs, decides)
            return segment, summary, op_observer.HIDE if name == "aten::linear" else 0

    x, w = torch.randn(2, 3), torch.randn(4, 3)
    _, events, _, _ = observe(lambda: torch.nn.functional.linear(x, w), Hider())
    assert [e[0] for e in events] == [op_observer.HIDDEN, op_observer.EXIT]
    assert events[1][5] >= 2  # linear's calls (t, matmul, ...) counted, not logged
    _, _, _, asked = observe(lambda: torch.nn.functional.linear(x, w), still_valid=True)
    assert any(q[0] == "aten::linear" for q in asked.questions)  # "hide" was not kept


def test_refuses_a_second_observer_on_the_thread() -> None:
    op_observer.start(Describer(), lambda *op: False, "tests")
    try:
        assert op_observer.running()
        with pytest.raises(RuntimeError, match="already running"):
            op_observer.start(Describer(), lambda *op: False, "tests")
    finally:
        op_observer.stop()
    assert not op_observer.running()


def test_enum_tables_turn_logged_ints_back_into_torch_objects() -> None:
    tables = op_observer.enum_tables()
    assert tables["ScalarType"][6] is torch.float32
    assert torch.bfloat16 in tables["ScalarType"]
    assert tables["Layout"][0] is torch.strided
    assert torch.channels_last in tables["MemoryFormat"]


def test_the_build_is_keyed_on_everything_it_reads(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    identity = op_observer.build_identity()
    # what torch's extension build reads is in the identity, read without importing it
    from torch.utils import cpp_extension

    torch_root = Path(identity["torch_install"])
    assert torch_root == Path(torch.__file__).parent
    read = [*cpp_extension.include_paths(), *cpp_extension.library_paths()]
    assert all(Path(p).is_relative_to(torch_root) for p in read)
    assert identity["compiler"] == cpp_extension.get_cxx_compiler()
    assert identity["torch"] == torch.__version__ and identity["python"] == sys.version
    assert identity["flags"] == op_observer.FLAGS
    assert "Free Software Foundation" in identity["compiler_version"]  # g++ --version
    directory = op_observer.build_directory()
    assert directory.parent == tmp_path / "opmagic" / "v1" / "observer"
    monkeypatch.setenv("CPATH", str(tmp_path))  # the compiler would read other headers
    assert op_observer.build_directory() != directory
    monkeypatch.delenv("CPATH")
    monkeypatch.setenv("CXX", "g++")  # another compiler command, as torch builds with $CXX
    assert op_observer.build_identity()["compiler"] == cpp_extension.get_cxx_compiler()
    assert op_observer.build_directory() != directory
    monkeypatch.delenv("CXX")
    assert op_observer.build_directory() == directory


def test_an_observer_cache_others_could_write_to_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    op_observer.build_directory()  # creates the cache
    (tmp_path / "opmagic" / "v1" / "observer").chmod(0o777)
    events: list = []
    with pytest.raises(CacheDirectoryError, match=r"observer is unsafe: it is writable by"):
        op_observer._ObserverBuild().get(events.append)  # a new process's observer
    assert events == []  # refused before anything was built or loaded


@pytest.mark.skipif(os.getuid() != 0, reason="giving a directory to another user needs root")
def test_an_observer_build_of_another_user_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    op_observer.build_directory()  # creates the cache
    os.chown(tmp_path / "opmagic" / "v1" / "observer", 4242, -1)
    with pytest.raises(CacheDirectoryError, match="observer is unsafe: it belongs to uid 4242"):
        op_observer._ObserverBuild().get(None)


BACKGROUND_BUILD = """
import sys, threading
from IPython.core.interactiveshell import InteractiveShell
from opmagic._torch import op_observer
from opmagic._torch.modules import module_call_codes

shell = InteractiveShell.instance()
shell.run_line_magic("load_ext", "opmagic")
builds = [t for t in threading.enumerate() if t.name == "opmagic build: the operator observer"]
print("building at load:", len(builds))
print("second start:", op_observer.build_in_background())
import torch, opmagic
t = opmagic.trace(torch.add, torch.ones(2), torch.ones(2))
print("traced:", [call.op for call in t.calls])
print("builds left:", sum(t.is_alive() for t in builds))
print("second process start:", op_observer.build_in_background())
"""


@pytest.mark.slow
def test_load_ext_builds_the_observer_in_the_background_and_the_first_trace_waits(
    tmp_path,
) -> None:
    """On a fresh cache ``%load_ext opmagic`` starts the build; the first trace waits for
    that build (saying so) instead of starting a second one."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, "-c", BACKGROUND_BUILD], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.splitlines() == [
        "building at load: 1",
        "second start: None",  # one build at a time
        "traced: ['aten::add.Tensor']",
        "builds left: 0",
        "second process start: None",  # built: nothing to do
    ], run.stdout
    assert run.stderr.count("opmagic: waiting for the operator observer") == 1, run.stderr
    assert "opmagic: built the operator observer in" in run.stderr
    assert "compiling the operator observer" not in run.stderr  # no second, foreground build


TRACE = """
import torch, opmagic
from opmagic._torch import op_observer
from opmagic._torch.modules import module_call_codes
t = opmagic.trace(torch.add, torch.ones(2), torch.ones(2))
print(op_observer.build_directory())
"""


def _trace_in(environment: Path, cache: Path) -> tuple[Path, str]:
    """Trace in a child process whose torch is the one in ``environment`` (a directory first
    on its path); its observer's build directory and its stderr."""
    run = subprocess.run(
        [sys.executable, "-c", TRACE],
        env={
            **os.environ,
            "XDG_CACHE_HOME": str(cache),
            "PYTHONPATH": os.pathsep.join((str(environment), str(ROOT))),
        },
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return Path(run.stdout.strip()), run.stderr


@pytest.mark.slow
def test_two_environments_with_the_same_torch_each_keep_their_build(tmp_path) -> None:
    """Another install of the same torch (here: torch reached through a symlink, as a second
    virtual environment has it at another path) gets a build of its own, instead of the two
    rebuilding one in turn; the second build's wait estimate is the first build's time."""
    first_env, second_env = tmp_path / "first", tmp_path / "second"
    first_env.mkdir()
    second_env.mkdir()
    (second_env / "torch").symlink_to(Path(torch.__file__).parent)
    cache = tmp_path / "cache"
    first, log = _trace_in(first_env, cache)
    assert "compiling the operator observer" in log, log
    took = json.loads((first / "build.json").read_text())["seconds"]
    second, log = _trace_in(second_env, cache)
    assert second != first
    estimate = round(took, 1)  # the estimate is kept to a tenth of a second
    assert f"the last build on this machine took {estimate:.0f} s" in log, log
    again, log = _trace_in(first_env, cache)
    assert again == first and "operator observer" not in log, log  # loaded, not rebuilt
