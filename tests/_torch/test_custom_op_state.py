"""Every custom-op shim in opmagic/_torch/custom_op_state.py, one test each.

When a torch release changes custom_op's internals, the failing test names the shim to update.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from opmagic._torch import custom_op_state, dispatcher


def test_python_kernels_and_fake_impls_of_library_ops():
    lib = torch.library.Library("opmagic_test_shim", "FRAGMENT")
    try:
        lib.define("g(Tensor x) -> Tensor")
        op = torch.ops.opmagic_test_shim.g.default
        assert dispatcher.py_kernel_keys(op) == []
        op.py_impl(torch._C.DispatchKey.AutogradCPU)(lambda x: x)
        assert dispatcher.py_kernel_keys(op) == ["AutogradCPU"]

        def g_fake(x):
            return torch.empty_like(x)

        assert custom_op_state.registered_fake_impl("opmagic_test_shim::g") is None
        torch.library.register_fake("opmagic_test_shim::g", g_fake, lib=lib)
        assert custom_op_state.registered_fake_impl("opmagic_test_shim::g") is g_fake
    finally:
        lib._destroy()


def test_custom_op_introspection():
    @torch.library.custom_op("opmagic_test_shim::f", mutates_args=())
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @f.register_kernel("cpu")
    def f_cpu(x):
        return x.clone()

    @f.register_fake
    def f_fake(x):
        return torch.empty_like(x)

    def f_backward(ctx, grad):
        return grad

    f.register_autograd(f_backward)
    try:
        opdef = custom_op_state.custom_op_def("opmagic_test_shim::f")
        parts = custom_op_state.custom_op_parts(opdef)
        assert parts["impl"] is f._init_fn
        assert custom_op_state.unwrap_registered_function(parts["device_kernels"]["cpu"]) is f_cpu
        assert parts["fake"] is f_fake and parts["backward"] is f_backward
        name = "opmagic_test_shim::f"
        rule = custom_op_state.registered_torch_dispatch_rule(name, FakeTensorMode)
        assert rule is None
        assert not custom_op_state.custom_op_can_fake_trivially(f._opoverload)
        assert custom_op_state.custom_op_def("opmagic_test_shim::nothing") is None
    finally:
        f._lib._destroy()


def test_dispatch_shortcuts_off_until_turned_back_on():
    @torch.library.custom_op("opmagic_test_shim::shortcut", mutates_args=())
    def shortcut(x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    op = shortcut._opoverload
    had = custom_op_state.has_dispatch_shortcut(op)  # torch 2.14+: custom_op turns it on
    assert had == hasattr(op, "_enable_pyobj_dispatch")
    back_on = custom_op_state.dispatch_shortcuts_off()
    assert not custom_op_state.has_dispatch_shortcut(op)
    assert shortcut(torch.ones(1)).tolist() == [1.0]
    back_on()
    assert custom_op_state.has_dispatch_shortcut(op) == had
    assert shortcut(torch.ones(1)).tolist() == [1.0]
