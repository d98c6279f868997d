"""Every Triton shim in opmagic/_torch/triton.py, one test each (no GPU needed).

When a Triton or torch release changes what a shim relies on, the failing test names the
shim to update. Skipped where Triton is not installed (``pip install -e ".[triton]"``).
"""

from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from opmagic._torch import triton as shim  # noqa: E402


def _add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + tl.load(y_ptr + offsets, mask=mask), mask=mask)


def _twice(x):
    return x * 2


def _calls_helper(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, helper(tl.load(x_ptr + offsets)))


def _not_constexpr(x_ptr, out_ptr, BLOCK):
    offsets = tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets))


helper = None  # set per test: the helper _calls_helper calls, interpreted or compiled


def _interpreted(function):
    with shim.interpreter_selected(True):
        return triton.jit(function)


def test_interpreter_selected_decides_what_jit_makes_and_restores_the_knob():
    before = os.environ.get("TRITON_INTERPRET")
    with shim.interpreter_selected(True):
        interpreted = triton.jit(_add)
    with shim.interpreter_selected(False):
        compiled = triton.jit(_add)
    assert shim.is_interpreted(interpreted) and not shim.is_interpreted(compiled)
    assert os.environ.get("TRITON_INTERPRET") == before
    assert triton.knobs.runtime.interpret is (before == "1")


def test_active_driver_stands_in_for_triton_s_driver_and_gives_it_back():
    from triton.runtime import driver

    stand_in = object()
    found = shim.has_active_driver()
    with shim.active_driver(stand_in):
        assert driver.active is stand_in and shim.has_active_driver()
    assert shim.has_active_driver() is found  # Triton's own answer again
    assert found is torch.cuda.is_available()  # a driver for the GPU, and only for one


def test_launched_kernel_and_kernel_function_see_through_autotune():
    kernel = _interpreted(_add)
    tuned = triton.autotune([triton.Config({"BLOCK": 4})], key=[])(kernel)
    assert shim.launched_kernel(tuned) is kernel
    assert shim.kernel_function(tuned) is _add
    assert shim.autotuners(tuned) == [tuned] and shim.autotuners(kernel) == []
    assert shim.is_kernel(tuned) and shim.is_kernel(kernel) and not shim.is_kernel(_add)


def test_intercept_run_routes_launches_and_time_configs_runs_each_once():
    kernel = _interpreted(_add)
    configs = [triton.Config({"BLOCK": 4}), triton.Config({"BLOCK": 8})]
    tuned = triton.autotune(configs, key=[])(kernel)
    seen = []

    def around(run, *args, **kwargs):
        seen.append(kwargs["BLOCK"])
        return run(*args, **kwargs)

    shim.intercept_run(tuned, around)
    shim.time_configs_by_running_once(tuned)
    x, y, out = torch.randn(10), torch.randn(10), torch.empty(10)
    tuned[lambda meta: (triton.cdiv(10, meta["BLOCK"]),)](x, y, out, 10)
    torch.testing.assert_close(out, x + y)
    assert seen == [4, 8, 4]  # each config once, then the first kept


def test_forget_compiled_drops_the_interpreters_rewrite_and_a_jit_functions_binaries():
    kernel = _interpreted(_add)
    x, y, out = torch.randn(8), torch.randn(8), torch.empty(8)
    kernel[(1,)](x, y, out, 8, BLOCK=8)
    assert _add in type(kernel).rewritten_fn
    shim.forget_compiled(kernel)
    assert _add not in type(kernel).rewritten_fn
    compiled = triton.jit(_add)
    compiled.device_caches[0] = "binaries"  # what a launch on device 0 would leave
    compiled.hash = "a dependency hash"
    shim.forget_compiled(compiled)
    assert not compiled.device_caches and compiled.hash is None


def test_front_end_check_passes_a_good_kernel_and_raises_what_a_device_compile_would():
    global helper
    x, out = torch.randn(8), torch.empty(8)
    shim.front_end_check(_add, (x, x, out, 8), {"BLOCK": 8})
    helper = _interpreted(_twice)  # an interpreted helper is compiled as its JIT twin
    shim.front_end_check(_calls_helper, (x, out), {"BLOCK": 8})
    with pytest.raises(shim.compilation_error_class()) as raised:
        shim.front_end_check(_not_constexpr, (x, out), {"BLOCK": 8})
    src, line, column, message = shim.compilation_error_parts(raised.value)
    assert src.startswith("def _not_constexpr(") and (line, column) == (2, 14)
    assert "constexpr" in message


def test_compilation_error_parts_name_the_cause_not_its_repr():
    def undefined(x_ptr, BLOCK: tl.constexpr):
        tl.store(x_ptr + tl.arange(0, BLOCK), nowhere)  # noqa: F821

    with pytest.raises(shim.compilation_error_class()) as raised:
        shim.front_end_check(undefined, (torch.empty(4),), {"BLOCK": 4})
    assert shim.compilation_error_parts(raised.value)[3] == (
        "NameError: nowhere is not defined"
    )


def test_interpreter_error_class_wraps_a_kernels_exception():
    def raises(x_ptr, BLOCK: tl.constexpr):
        raise ValueError("inside")

    with pytest.raises(shim.interpreter_error_class()) as raised:
        _interpreted(raises)[(1,)](torch.empty(4), BLOCK=4)
    assert isinstance(raised.value.__cause__, ValueError)


def test_interpreter_memory_hooks_report_arguments_and_every_access():
    kernel = _interpreted(_add)
    arguments, accesses = [], []
    x, y, out = torch.randn(6), torch.randn(6), torch.empty(6)
    with shim.interpreter_memory_hooks(
        lambda args, kwargs: arguments.append(args),
        lambda kind, addresses, lanes, size, program: accesses.append(
            (kind, len(addresses), int(lanes.sum()), size, program)
        ),
    ):
        kernel[(1,)](x, y, out, 6, BLOCK=8)
    assert [a.data_ptr() for a in arguments[0][:3]] == [x.data_ptr(), y.data_ptr(), out.data_ptr()]
    assert accesses == [("load", 8, 6, 4, (0, 0, 0))] * 2 + [("store", 8, 6, 4, (0, 0, 0))]
    kernel[(1,)](x, y, out, 6, BLOCK=8)  # restored: nothing reported after
    assert len(accesses) == 3


def test_holds_no_data():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.empty(3)
    assert shim.holds_no_data(fake) and shim.holds_no_data(torch.empty(3, device="meta"))
    assert not shim.holds_no_data(torch.empty(3))


def _define_triton_op(name: str):
    kernel = _interpreted(_add)

    def launcher(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        if not shim.holds_no_data(out):  # the fake impl allocates only (as opmagic's launches)
            torch.library.wrap_triton(kernel)[(1,)](x, y, out, x.numel(), BLOCK=8)
        return out

    return torch.library.triton_op(name, mutates_args=())(launcher), launcher, kernel


def test_triton_op_launcher_launched_kernels_and_sync_op_kernels():
    from torch._library import custom_ops
    from torch._library import triton as torch_triton

    op, launcher, kernel = _define_triton_op("opmagic_test_shim::tadd")
    try:
        assert shim.triton_op_launcher(op._init_fn) is launcher
        assert shim.triton_op_launcher(launcher) is None
        assert shim.launched_kernels(launcher) == [kernel]  # torch's scan misses interpreted
        shim.sync_op_kernels("opmagic_test_shim::tadd", None)
        assert "opmagic_test_shim::tadd" not in torch_triton.triton_ops_to_kernels
        shim.sync_op_kernels("opmagic_test_shim::tadd", launcher)
        assert torch_triton.triton_ops_to_kernels["opmagic_test_shim::tadd"] == []
    finally:
        custom_ops.OPDEF_TO_LIB["opmagic_test_shim::tadd"]._destroy()
        custom_ops.OPDEFS.pop("opmagic_test_shim::tadd")
        torch_triton.triton_ops_to_kernels.pop("opmagic_test_shim::tadd", None)


def test_opaque_under_functionalization_keeps_an_interpreted_triton_op_whole():
    from torch._library import custom_ops

    op, _, _ = _define_triton_op("opmagic_test_shim::whole")
    try:
        x, y = torch.randn(8), torch.randn(8)
        before = torch.library.opcheck(op, (x, y), raise_exception=False)
        assert before["test_aot_dispatch_dynamic"] != "SUCCESS"  # the launch is lost
        shim.opaque_under_functionalization(op)
        after = torch.library.opcheck(op, (x, y), raise_exception=False)
        assert set(after.values()) == {"SUCCESS"}
    finally:
        custom_ops.OPDEF_TO_LIB["opmagic_test_shim::whole"]._destroy()
        custom_ops.OPDEFS.pop("opmagic_test_shim::whole")
