"""The torch.compile shim: whether dynamo compiles now, its frame hook, what it recorded."""

from __future__ import annotations

import pytest
import torch

from opmagic._torch import dynamo


def test_not_compiling_outside_torch_compile() -> None:
    assert dynamo.compiling() is None


def test_resume_functions_name_the_function_they_resume() -> None:
    assert dynamo._resumed("f") == ("f", None)
    assert dynamo._resumed("torch_dynamo_resume_in_f_at_9") == ("f", 9)
    inner = "torch_dynamo_resume_in_torch_dynamo_resume_in_step_at_3_at_7"
    assert dynamo._resumed(inner) == ("step", 7)


def test_the_frame_hook_setter_switches_the_hook() -> None:
    setter = dynamo.eval_frame_setter()
    prior = setter(None)
    assert setter(prior) is None  # what was set in between comes back


@pytest.mark.slow
def test_compiled_frames_say_what_dynamo_compiled_and_while_it_compiles() -> None:
    torch._dynamo.reset()
    seen = []

    @torch.library.custom_op("opmagic_dynamo_shim::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @twice.register_fake
    def _(x: torch.Tensor) -> torch.Tensor:
        seen.append(dynamo.compiling())  # the fake impl runs while dynamo traces
        return torch.empty_like(x)

    def f(x: torch.Tensor) -> torch.Tensor:
        y = twice(x)
        if y.sum() > 0:  # a graph break
            return y + 1
        return y - 1

    torch.compile(f, backend="aot_eager")(torch.ones(2))
    frames = dynamo.compiled_frames()
    first = frames["0/0"]
    assert (first.name, first.resumes_at, first.graph_breaks) == ("f", None, 1)
    assert first.custom_ops == {"opmagic_dynamo_shim::twice"}
    assert first.line == f.__code__.co_firstlineno
    (resume,) = [frame for frame in frames.values() if frame.resumes_at is not None]
    assert resume.name == "f" and resume.resumes_at == f.__code__.co_firstlineno + 2
    assert "0/0" in seen
    torch._dynamo.reset()
