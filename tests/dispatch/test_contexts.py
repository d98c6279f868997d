"""``CallContext``: resolving inside a context equals resolving under that state by hand."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from opmagic import CallContext, OpmagicError, kernels, resolve
from opmagic.dispatch.ops import op_parameters, op_ref

MUL = torch.ops.aten.mul.Tensor


def _pair(requires_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(2, 2, requires_grad=requires_grad), torch.randn(2, 2)


@pytest.mark.parametrize(
    ("context", "manager"),
    [
        (CallContext(no_grad=True), torch.no_grad),
        (CallContext(inference_mode=True), torch.inference_mode),
        (CallContext(autocast="cpu"), lambda: torch.autocast("cpu")),
    ],
    ids=["no_grad", "inference_mode", "autocast"],
)
def test_context_matches_the_same_state_set_by_hand(context: CallContext, manager) -> None:
    x, y = _pair(requires_grad=True)
    with manager():
        expected = resolve(torch.ops.aten.mm, x, y)
    got = context.resolve(torch.ops.aten.mm, x, y)
    assert got.path == expected.path
    assert got.context == expected.context


def test_inference_mode_drops_autograd() -> None:
    assert CallContext(inference_mode=True).resolve(MUL, *_pair(True)).path == ("CPU",)


def test_vmap_resolves_inside_the_transform_with_batched_inputs() -> None:
    resolution = CallContext(vmap=True).resolve(MUL, *_pair())
    assert resolution.path[:2] == ("FuncTorchDynamicLayerFrontMode", "FuncTorchBatched")
    assert resolution.path[-1] == "CPU"
    assert any("vmap" in words for words in resolution.context)


def test_fake_mode_converts_the_inputs_and_reaches_python() -> None:
    x, y = _pair()
    with FakeTensorMode() as mode:
        expected = resolve(MUL, mode.from_tensor(x), mode.from_tensor(y))
    got = CallContext(fake=True).resolve(MUL, x, y)
    assert got.path == expected.path
    assert "Python" in got.path
    assert "TorchDispatchMode FakeTensorMode active" in got.context


def test_an_error_under_fake_is_raised_once_not_also_logged_with_torchs_frames(
    fake_tensor_log,
) -> None:
    """FakeTensorMode logs a failing meta kernel's traceback before re-raising it: the user
    sees the raised error, so the log stays out of the cell's output."""
    with pytest.raises(RuntimeError, match="broadcast"), CallContext(fake=True).applied():
        torch.ones(2) + torch.ones(3)
    assert fake_tensor_log == []


def test_logging_mode_is_an_active_dispatch_mode() -> None:
    resolution = CallContext(logging=True).resolve(MUL, *_pair())
    assert "TorchDispatchMode LoggingMode active" in resolution.context
    assert resolution.path[0] == "PythonTLSSnapshot"
    assert resolution.steps[-1].assumed


def test_tensor_lists_are_converted_and_batched() -> None:
    tensors = [torch.randn(2, 2), torch.randn(2, 2)]
    resolution = CallContext(vmap=True, fake=True).resolve(torch.ops.aten.cat, tensors)
    assert resolution.path[0] == "FuncTorchDynamicLayerFrontMode"
    assert "Python" in resolution.path


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((torch.tensor(1.0), torch.tensor(2.0)), "0-dim tensor"),
        ((torch.randn(2, 2), torch.randn(3, 2)), "same size in dim 0"),
    ],
    ids=["0-dim", "batch-mismatch"],
)
def test_vmap_bad_inputs_say_what_to_change(args: tuple, message: str) -> None:
    with pytest.raises(OpmagicError, match=message):
        CallContext(vmap=True).resolve(MUL, *args)


def test_vmap_without_tensor_arguments_is_a_clear_error() -> None:
    with pytest.raises(OpmagicError, match="at least one tensor argument"):
        CallContext(vmap=True).resolve(torch.ops.aten.scalar_tensor, 1.0)


def test_unknown_autocast_device_is_a_clear_error() -> None:
    with pytest.raises(OpmagicError, match="autocast cannot be turned on for device 'nope'"):
        CallContext(autocast="nope").resolve(MUL, *_pair())


def test_op_parameters_follow_the_schema() -> None:
    params = op_parameters(op_ref("aten::add.Tensor"))
    assert [(p.name, p.type, p.kwarg_only, p.has_default) for p in params] == [
        ("self", "Tensor", False, False),
        ("other", "Tensor", False, False),
        ("alpha", "number", True, True),
    ]
    assert params[2].default == 1


@torch.library.custom_op("opmagic_ctx::with_fake", mutates_args=())
def with_fake(x: torch.Tensor) -> torch.Tensor:
    """A custom op with a fake impl: it has a Meta kernel of its own."""
    return x.clone()


@with_fake.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("opmagic_ctx::without_fake", mutates_args=())
def without_fake(x: torch.Tensor) -> torch.Tensor:
    """A custom op without a fake impl: its Meta kernel raises."""
    return x.clone()


def test_kernels_missing_lists_only_operators_without_their_own_kernel() -> None:
    wide = kernels("opmagic_ctx", ["CPU"], wide=True, missing="Meta")
    assert list(wide.index.get_level_values("op")) == ["opmagic_ctx::without_fake"]
    assert list(wide.columns) == ["CPU", "Meta"]
    aten = kernels("aten", ["CPU"], wide=True, missing="Meta")
    assert set(aten["Meta"]) <= {"missing", "fallback", "fallthrough"}
    assert len(aten) > 0
    long = kernels("opmagic_ctx", ["CPU"], missing="Meta")
    assert set(long["op"]) == {"opmagic_ctx::without_fake"}


def test_kernels_missing_rejects_unknown_keys() -> None:
    with pytest.raises(OpmagicError, match="Unknown dispatch key 'Metal2'"):
        kernels("aten", missing="Metal2")


def test_trace_runs_the_call_inside_the_context() -> None:
    from torch._subclasses.fake_tensor import FakeTensor

    traced = CallContext(fake=True).trace(MUL, *_pair())
    assert isinstance(traced.result, FakeTensor)  # the inputs were converted, the call ran fake
    assert [call.op for call in traced.calls] == ["aten::mul.Tensor"]
    assert "Python" in traced.calls[0].path
    inference = CallContext(inference_mode=True).trace(MUL, *_pair(requires_grad=True))
    assert inference.calls[0].path == ("CPU",)  # inference_mode skips autograd


def test_trace_under_vmap_refuses_a_call_without_tensors() -> None:
    with pytest.raises(OpmagicError, match="at least one tensor"):
        CallContext(vmap=True).trace(torch.ops.aten.scalar_tensor.default, 1.0)
