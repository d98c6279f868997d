"""Where each call came from: the frame of the user's code that made it and the ``nn.Module``
path running it, against the code that ran (line numbers read from this file)."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import torch

from opmagic import trace
from opmagic.dispatch.trace.origins import Origins, is_user_file

HERE = str(Path(__file__).resolve())


def _line_of(function, text: str) -> int:
    """The line of ``function`` whose source holds ``text``."""
    lines, start = inspect.getsourcelines(function)
    return start + next(i for i, line in enumerate(lines) if text in line)


def helper(x: torch.Tensor) -> torch.Tensor:
    y = x.sin()
    return torch.nn.functional.linear(y, torch.ones(2, 3))


def test_each_call_names_the_users_frame_that_made_it() -> None:
    traced = trace(helper, torch.randn(4, 3))
    sin, ones, linear = traced.calls
    assert ones.called_from == linear.called_from  # torch.ones(2, 3) on the same line
    assert sin.called_from.file == HERE and sin.called_from.function == "helper"
    assert sin.called_from.line == _line_of(helper, "x.sin()")
    assert linear.called_from.line == _line_of(helper, "linear(")
    # a kernel's calls come from where the kernel was called: torch's frames are skipped
    assert all(c.called_from == linear.called_from for c in linear.walk())
    assert str(sin.called_from).endswith(f":{sin.called_from.line} in helper")


def test_a_call_from_torch_code_names_the_users_line_that_called_torch() -> None:
    layer = torch.nn.Linear(3, 2)
    x = torch.randn(4, 3)

    def step() -> torch.Tensor:
        return layer(x)  # nn.Linear.forward is torch's: the call comes from this line

    (linear,) = trace(step).calls
    assert linear.called_from.function.endswith("step")
    assert linear.called_from.line == _line_of(step, "return layer(x)")


def test_a_python_kernels_calls_come_from_its_body() -> None:
    def body(x: torch.Tensor) -> torch.Tensor:
        return x.clamp(-1, 1)

    clipped = torch.library.custom_op("opmagic_origins::clipped", body, mutates_args=())
    (call,) = trace(clipped, torch.randn(3)).calls
    (clamp,) = call.children
    assert clamp.called_from.function.endswith("body")
    assert clamp.called_from.line == _line_of(body, "x.clamp")
    assert call.called_from.function == "test_a_python_kernels_calls_come_from_its_body"


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
        self.out = torch.nn.Linear(3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.inner(x) + x)


def test_calls_carry_the_module_path_that_ran_them() -> None:
    model = torch.nn.ModuleDict({"encoder": Block()})
    x = torch.randn(2, 3)
    traced = trace(lambda: model["encoder"](x))
    modules = [(c.op, c.module, c.module_type) for c in traced.calls]
    assert modules == [
        ("aten::linear", "inner.0", "Linear"),
        ("aten::relu", "inner.1", "ReLU"),
        ("aten::add.Tensor", "", "Block"),  # the outermost module's own code
        ("aten::linear", "out", "Linear"),
    ]
    assert all(c.module == "inner.0" for c in traced.calls[0].walk())


def test_modules_are_named_from_the_traced_module_down() -> None:
    model = torch.nn.Sequential(Block())
    traced = trace(model, torch.randn(2, 3))
    assert [c.module for c in traced.calls] == ["0.inner.0", "0.inner.1", "0", "0.out"]
    assert traced.calls[2].module_type == "Block"


def test_modules_running_around_the_trace_are_not_the_callss() -> None:
    """A trace started inside a module's forward names modules from inside the trace."""
    found = {}

    class Outer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(3, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            with trace() as traced:
                y = self.layer(x)
                z = y.cos()
            found["trace"] = traced
            return z

    Outer()(torch.randn(2, 3))
    linear, cos = found["trace"].calls
    assert (linear.module, linear.module_type) == ("", "Linear")
    assert cos.module is None and cos.called_from.function.endswith("forward")


def test_calls_outside_any_module_have_none() -> None:
    (call,) = trace(torch.sin, torch.randn(2)).calls
    assert call.module is None and call.module_type is None
    assert call.called_from.function == "test_calls_outside_any_module_have_none"


def test_user_files_are_not_torchs_opmagics_nor_installed_packages() -> None:
    assert is_user_file(HERE)
    assert is_user_file("/tmp/ipykernel_1234/567.py")  # a notebook cell
    assert is_user_file("<ipython-input-3-abc>")
    assert not is_user_file(torch.nn.functional.__file__)
    assert not is_user_file(inspect.__file__)  # Python's library
    assert not is_user_file(sys.modules["pytest"].__file__)  # an installed package
    assert not is_user_file("<eval_with_key>.3")  # torch.fx's generated code
    assert not is_user_file("/tmp/torchinductor_me/ab/cab12.py")  # Inductor's
    import opmagic

    assert not is_user_file(opmagic.__file__)


def test_origins_name_each_code_line_once() -> None:
    origins = Origins()
    code = helper.__code__
    first = origins.location(code, 3)
    assert origins.location(code, 3) is first
    assert origins.definition(code).line == code.co_firstlineno
    assert origins.module(()) == (None, None)
