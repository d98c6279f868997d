"""``compare``: verdicts on real operators, timings from torch.utils.benchmark, sweeps that
stop cleanly (Ctrl-C keeps the rows measured so far), progress reports, bad arguments."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import timeit
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils import benchmark

import opmagic
from opmagic.errors import CompareError
from opmagic.verify.compare import (
    CaseResult,
    Comparison,
    SweepProgress,
    callable_name,
    compare,
    progress,
    timing,
)

ROOT = Path(__file__).resolve().parents[2]
QUICK = 0.002  # min_run_time: the tests check where timings come from, not their values


def _nan_at_three(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = x + y
    out[3] = float("nan")
    return out


# (operator, its kernel): real operators of a test library, called through the dispatcher
KERNELS = {
    "exact_add": lambda x, y: torch.add(x, y),
    "gelu_tanh": lambda x, y: F.gelu(x, approximate="tanh") + y,  # a small numeric bug
    "unsqueezed": lambda x, y: (x + y).unsqueeze(0),  # wrong shape
    "in_double": lambda x, y: x.double() + y.double(),  # wrong dtype
    "nan_add": _nan_at_three,
    "column_major": lambda x, y: (x + y).t().contiguous().t(),  # same values, other strides
    "raises": lambda x, y: x.mm(y),  # 1-d tensors: mm raises
}


@pytest.fixture(scope="module")
def ops() -> Iterator[object]:
    """``torch.ops.t_compare``: each of KERNELS as an operator with a CPU kernel."""
    lib = torch.library.Library("t_compare", "DEF")
    for name, kernel in KERNELS.items():
        lib.define(f"{name}(Tensor x, Tensor y) -> Tensor")
        lib.impl(name, kernel, "CPU")
    yield torch.ops.t_compare
    lib._destroy()


def pairs(size: int, dtype: torch.dtype, device: torch.device) -> tuple:
    """Two random tensors of one case."""
    return torch.randn(size, dtype=dtype, device=device), torch.randn(
        size, dtype=dtype, device=device
    )


def matrices(size: int, dtype: torch.dtype, device: torch.device) -> tuple:
    """Two random square matrices of one case (strides matter for them)."""
    return torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)


def reference(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """What the buggy kernels should compute (gelu + y for the gelu one)."""
    return F.gelu(x) + y


def run(candidate, ref, inputs=pairs, **options) -> Comparison:
    options.setdefault("sizes", [64, 256])
    options.setdefault("progress", False)
    return compare(candidate, ref, inputs, min_run_time=QUICK, **options)


def test_an_exact_kernel_passes_every_case_with_zero_error(ops) -> None:
    result = run(ops.exact_add, torch.add, dtypes=["float32", torch.float16])
    assert result.passed and result.summary == "all 4 cases pass"
    assert [(r.size, r.dtype, r.device) for r in result.rows] == [
        (64, "float32", "cpu"),
        (256, "float32", "cpu"),
        (64, "float16", "cpu"),
        (256, "float16", "cpu"),
    ]
    assert all(r.max_abs_error == 0 and r.max_rel_error == 0 for r in result.rows)
    assert result.candidate == "t_compare::exact_add" and result.reference == "torch.add"


def test_a_small_numeric_bug_fails_on_values_with_its_size(ops) -> None:
    result = run(ops.gelu_tanh, reference, sizes=[4096])
    (row,) = result.rows
    assert row.verdict == "FAIL: values" and not result.passed
    (mismatch,) = row.mismatches
    assert mismatch.where == "output"
    assert " / 4096 elements differ" in mismatch.detail and "allowed" in mismatch.detail
    assert 1e-5 < row.max_abs_error < 1e-2  # the tanh approximation's error: small, not zero
    assert result.summary == "0 of 1 cases pass; 1 FAIL (values)"


def test_tolerances_given_replace_torchs_defaults(ops) -> None:
    loose = run(ops.gelu_tanh, reference, rtol=0.0, atol=0.01)
    assert loose.passed and loose.tolerances == "rtol=0, atol=0.01"
    with pytest.raises(CompareError, match="Give rtol and atol together"):
        run(ops.gelu_tanh, reference, rtol=0.1)


@pytest.mark.parametrize(
    ("op", "verdict", "detail"),
    [
        ("unsqueezed", "FAIL: shape", "[1, 64] vs reference [64]"),
        ("in_double", "FAIL: dtype", "float64 vs reference float32"),
        (
            "nan_add",
            "FAIL: NaN",
            "1 of 64 elements are NaN where the reference is not (first at index (3,)); new "
            "tensors start as NaN, so these may be elements the candidate never wrote",
        ),
    ],
)
def test_shape_dtype_and_nan_mismatches_are_named(ops, op, verdict, detail) -> None:
    row = run(getattr(ops, op), torch.add, sizes=[64]).rows[0]
    assert row.verdict == verdict
    assert row.mismatches[0].detail == detail
    assert row.mismatches[0].where == "output"


def test_nan_mismatches_leave_the_other_elements_judged_by_value(ops) -> None:
    row = run(ops.nan_add, torch.add, sizes=[64]).rows[0]
    assert [m.kind for m in row.mismatches] == ["NaN"]  # the other 63 elements are exact
    assert row.max_abs_error == 0


def test_stride_mismatches_are_named(ops) -> None:
    row = run(ops.column_major, torch.add, inputs=matrices, sizes=[8]).rows[0]
    assert row.verdict == "FAIL: stride"
    assert row.mismatches[0].detail == "(1, 8) vs reference (8, 1)"


def test_a_kernel_that_raises_is_an_error_row_and_the_sweep_goes_on(ops) -> None:
    result = run(ops.raises, torch.add)
    assert [r.status for r in result.rows] == ["error", "error"]
    row = result.rows[0]
    assert row.verdict == "error: candidate"
    assert str(row.mismatches[0]).startswith("candidate raised RuntimeError: ")
    assert row.timing is None and row.speedup is None


def test_in_place_kernels_are_judged_by_their_arguments_afterwards() -> None:
    def wrong_in_place(x: torch.Tensor, y: torch.Tensor) -> None:
        x.add_(y).add_(1)

    row = run(wrong_in_place, torch.Tensor.add_, sizes=[16]).rows[0]
    kinds = [(m.kind, m.where) for m in row.mismatches]
    assert ("values", "argument 0 after the call") in kinds


def test_an_output_element_the_candidate_never_writes_fails() -> None:
    """New tensors start as NaN in the candidate's call, so the half it forgets cannot pass
    with what the allocator handed back (on a GPU, often the reference's freed result)."""

    def forgets_the_second_half(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        half = x.numel() // 2
        out[:half] = x[:half] + y[:half]
        return out

    def counts(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty(x.shape, dtype=torch.int64)
        out[1:] = 7
        return out

    row = run(forgets_the_second_half, torch.add, sizes=[64]).rows[0]
    (mismatch,) = row.mismatches
    assert (row.verdict, mismatch.kind) == ("FAIL: NaN", "NaN")
    assert mismatch.detail.startswith("32 of 64 elements are NaN where the reference is not")
    assert "never wrote" in mismatch.detail
    ints = run(counts, lambda x, y: torch.full(x.shape, 7), sizes=[8]).rows[0]
    assert ints.verdict == "FAIL: values"  # int64's largest value where nothing was written
    assert not torch.are_deterministic_algorithms_enabled()  # the setting is restored


def test_a_candidate_that_changes_an_argument_fails_as_a_mutation() -> None:
    def clobbers_x(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = x + y
        x.zero_()  # right result, but the caller's x is gone
        return out

    row = run(clobbers_x, torch.add, sizes=[16]).rows[0]
    assert row.verdict == "FAIL: mutation"
    (mismatch,) = row.mismatches
    assert mismatch.where == "argument 0" and "the reference does not" in mismatch.detail
    assert row.timing is not None and row.reference_time is not None  # still timed
    assert run(torch.add, torch.add, sizes=[16]).passed  # an argument left alone is no finding


def test_noisy_timings_and_suspect_speedups_are_said() -> None:
    """A case whose runs spread over 10% of the median (torch.utils.benchmark's threshold) or
    that ran fewer than three times is marked; a speedup above 10x is doubted."""
    from torch.utils.benchmark.utils.common import TaskSpec

    def measurement(*times: float) -> benchmark.Measurement:
        return benchmark.Measurement(1, list(times), TaskSpec("run()", "pass"))

    steady, noisy = measurement(1e-3, 1e-3, 1.01e-3, 1e-3), measurement(1e-3, 2e-3, 1e-3, 3e-3)
    rows = [
        CaseResult(64, "float32", "cpu", "", (), 0, 0, steady, steady, None, None, 8),
        CaseResult(128, "float32", "cpu", "", (), 0, 0, noisy, steady, None, None, 8),
        CaseResult(256, "float32", "cpu", "", (), 0, 0, measurement(1e-3), steady, None, None, 8),
    ]
    assert rows[0].noise is None and rows[0].spread < 0.1
    assert rows[1].noise == "the interquartile range is 83% of the median"  # 1.25 ms of 1.5
    assert rows[2].noise == "only 1 run measured"
    comparison = Comparison("fast", "slow", tuple(rows), 3, False, "torch's defaults")
    (noise,) = comparison.warnings
    assert noise.startswith("The 2 cases' timings are noise (float32 cpu, size 128: the")

    def loop_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # a Python loop
        return torch.stack([a + b for a, b in zip(x, y, strict=True)])

    result = run(torch.add, loop_add, sizes=[512])
    assert result.rows[0].speedup > 10
    assert any(w.startswith("A speedup of ") for w in result.warnings)


def test_a_list_of_argument_tuples_is_used_as_given(ops) -> None:
    cases = [(torch.randn(3, 5), torch.randn(3, 5)), (torch.randn(100), torch.randn(100))]
    result = compare(ops.exact_add, "aten::add.Tensor", cases, min_run_time=QUICK, progress=False)
    assert [(r.size, r.inputs) for r in result.rows] == [
        (15, "(float32[3, 5], float32[3, 5])"),
        (100, "(float32[100], float32[100])"),
    ]
    assert result.reference == "aten::add.Tensor" and result.passed
    with pytest.raises(CompareError, match="sizes go with an inputs builder"):
        compare(ops.exact_add, torch.add, cases, sizes=[4])


def test_gradients_are_compared_and_timed_with_backward() -> None:
    def wrong_backward_exp(x: torch.Tensor) -> torch.Tensor:
        return _WrongExp.apply(x)

    def one_input(size, dtype, device):
        return torch.randn(size, dtype=dtype, device=device)

    good = run(
        torch.sigmoid,
        lambda x: 1 / (1 + torch.exp(-x)),
        inputs=one_input,
        sizes=[32],
        backward=True,
    )
    assert good.passed
    assert isinstance(good.rows[0].backward_timing, benchmark.Measurement)
    bad = run(wrong_backward_exp, torch.exp, inputs=one_input, sizes=[32], backward=True)
    (mismatch,) = bad.rows[0].mismatches
    assert (mismatch.kind, mismatch.where) == ("values", "grad of argument 0")
    no_grad = run(
        lambda x: torch.exp(x.detach()), torch.exp, inputs=one_input, sizes=[32], backward=True
    )
    assert no_grad.rows[0].verdict == "error: backward of the candidate"
    assert no_grad.rows[0].timing is not None  # the forward is still timed


class _WrongExp(torch.autograd.Function):
    """exp whose backward forgets the chain rule's grad_output."""

    @staticmethod
    def forward(ctx, x):
        result = x.exp()
        ctx.save_for_backward(result)
        return result

    @staticmethod
    def backward(ctx, grad):
        (result,) = ctx.saved_tensors
        return result


def test_timings_are_measurements_of_the_benchmark_timer(ops, monkeypatch) -> None:
    measured: list[benchmark.Measurement] = []
    original = benchmark.Timer.blocked_autorange

    def spy(timer, *args, **kwargs):
        measurement = original(timer, *args, **kwargs)
        measured.append(measurement)
        return measurement

    monkeypatch.setattr(benchmark.Timer, "blocked_autorange", spy)
    result = run(ops.exact_add, torch.add, sizes=[64, 128])
    timings = [t for row in result.rows for t in (row.timing, row.reference_timing)]
    assert len(measured) == 4 and all(any(t is m for m in measured) for t in timings)
    row = result.rows[0]
    assert row.time == row.timing.median and row.reference_time == row.reference_timing.median
    assert row.speedup == row.reference_time / row.time
    assert row.nbytes == 3 * 64 * 4  # two float32 inputs and the output
    assert row.bandwidth == row.nbytes / row.time / 1e9


def test_the_clock_synchronises_cuda_before_every_reading(monkeypatch) -> None:
    # no GPU here: torch.cuda.synchronize is replaced by a recorder (the one mock of this file)
    synchronised: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "synchronize", synchronised.append)
    clock = timing.clock(torch.device("cuda", 1))
    first, second = clock(), clock()
    assert second >= first and synchronised == [torch.device("cuda", 1)] * 2
    assert timing.clock(torch.device("cpu")) is timeit.default_timer


def test_an_interrupted_sweep_keeps_the_rows_measured_so_far(ops) -> None:
    events: list[SweepProgress] = []
    built = []

    def interrupted_at_the_third(size, dtype, device):
        built.append(size)
        if len(built) == 3:
            raise KeyboardInterrupt
        return pairs(size, dtype, device)

    result = compare(
        ops.exact_add,
        torch.add,
        interrupted_at_the_third,
        sizes=[8, 16, 32, 64],
        min_run_time=QUICK,
        progress=events.append,
    )
    assert result.interrupted and not result.passed
    assert [r.size for r in result.rows] == [8, 16]
    assert result.summary == "interrupted after 2 of 4 cases; all pass"
    assert [(e.done, e.finished) for e in events] == [(0, False), (1, False), (2, False), (2, True)]
    assert events[-1].stopped and events[1].case == "float32 cpu, size 16"


@pytest.mark.slow
def test_ctrl_c_in_a_child_process_keeps_the_rows_measured_so_far() -> None:
    script = textwrap.dedent(
        """
        import sys, torch, opmagic

        def started(event):
            print("case", event.done, flush=True)

        result = opmagic.compare(torch.sin, torch.sin, lambda n, d, dev: torch.randn(n),
                                 sizes=[2**10] * 50, min_run_time=0.2, progress=started)
        print("rows", len(result.rows), "interrupted", result.interrupted, flush=True)
        print(result.summary, flush=True)
        """
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env
    )
    assert child.stdout is not None
    for line in child.stdout:
        if line.startswith("case 2"):  # two cases measured
            child.send_signal(signal.SIGINT)
            break
    output, _ = child.communicate(timeout=120)
    assert child.returncode == 0, output
    rows = int(output.split("rows ")[1].split()[0])
    assert 2 <= rows < 50 and "interrupted True" in output
    assert f"interrupted after {rows} of 50 cases" in output


def test_progress_is_reported_per_case_and_shown_only_for_long_sweeps(
    ops, monkeypatch, capsys
) -> None:
    events: list[SweepProgress] = []
    run(ops.exact_add, torch.add, progress=events.append)
    assert [(e.done, e.total, e.finished, e.stopped) for e in events] == [
        (0, 2, False, False),
        (1, 2, False, False),
        (2, 2, True, False),
    ]
    run(ops.exact_add, torch.add, progress=True)  # far below PROGRESS_DELAY_S: no bar
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(progress, "PROGRESS_DELAY_S", 0.0)
    run(ops.exact_add, torch.add, progress=True)
    assert capsys.readouterr().err.startswith("compare: 2 cases in ")  # stderr is no tty


def test_builder_errors_and_bad_arguments_are_one_clear_message(ops) -> None:
    def broken(size, dtype, device):
        return torch.randn(size, dtype=dtype, device=device).view(size + 1)

    with pytest.raises(
        CompareError,
        match=r"inputs\(64, torch.float32, 'cpu'\) raised "
        r"RuntimeError: .*must make the arguments",
    ):
        run(ops.exact_add, torch.add, inputs=broken)
    with pytest.raises(CompareError, match="'fp8' is not a torch dtype"):
        run(ops.exact_add, torch.add, dtypes=["fp8"])
    with pytest.raises(CompareError, match="sizes must be non-negative integers"):
        run(ops.exact_add, torch.add, sizes=[1.5])
    with pytest.raises(CompareError, match="inputs must build one case's arguments"):
        run(ops.exact_add, torch.add, inputs=42)
    with pytest.raises(CompareError, match="The reference 'nope::op' is not an operator"):
        run(ops.exact_add, "nope::op")
    with pytest.raises(CompareError, match="must be a callable or an operator"):
        run(3, torch.add)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
def test_cuda_without_a_gpu_says_why() -> None:
    with pytest.raises(CompareError, match=r"Cannot compare on 'cuda'\. No GPU can run kernels"):
        run(torch.add, torch.add, devices=["cuda"])


def test_names_say_what_was_compared(ops) -> None:
    assert callable_name(ops.exact_add) == "t_compare::exact_add"
    assert callable_name(ops.exact_add.default) == "t_compare::exact_add"
    assert callable_name(torch.ops.aten.add.Tensor) == "aten::add.Tensor"
    assert callable_name(torch.add) == "torch.add"
    assert callable_name(F.relu) == "torch.nn.functional.relu"
    assert callable_name(reference) == "reference"
    assert opmagic.compare is compare


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"names": "ab"}, "names must be two labels"),
        ({"rtol": "1e-3", "atol": 1e-3}, "rtol must be a finite number >= 0 or None"),
        ({"min_run_time": "0.1"}, "min_run_time is seconds to measure"),
        ({"min_run_time": float("inf")}, "above 0 and at most 60; got inf"),
        ({"min_run_time": 10**18}, "above 0 and at most 60; got 1000000000000000000"),
        ({"min_run_time": True}, "min_run_time is seconds to measure"),
        ({"rtol": float("nan"), "atol": 0.0}, "rtol must be a finite number >= 0"),
        ({"rtol": 0.0, "atol": -1.0}, "atol must be a finite number >= 0"),
        ({"sizes": 5}, "sizes must be a list"),
        ({"dtypes": "float32"}, "dtypes must be a list"),
    ],
)
def test_arguments_of_the_wrong_type_are_named(kwargs, expected) -> None:
    with pytest.raises(CompareError, match=expected):
        compare(torch.add, torch.add, lambda n: (torch.ones(n), torch.ones(n)), **kwargs)
