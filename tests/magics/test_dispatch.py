"""``%dispatch`` in a real IPython shell."""

from __future__ import annotations

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from opmagic import Resolution
from opmagic.errors import ArgumentsMismatchError, NotAnOperatorError, OpmagicError
from opmagic.magics.dispatch import split_options
from opmagic.view.diagram import Diagram


@torch.library.custom_op("opmagic_magics::scale", mutates_args=())
def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    """A custom op of the session's process, dispatched through by the tests."""
    return x * factor


@pytest.fixture(scope="module")
def shell():
    """An IPython shell with opmagic loaded and a few names defined."""
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "opmagic")
    ip.user_ns.update(
        torch=torch,
        scale=scale,
        x=torch.randn(2, 2, requires_grad=True),
        y=torch.randn(2, 2),
        pair=(torch.randn(2, 2), torch.randn(2, 2)),
        options={"alpha": 2},
        mm_default=torch.ops.aten.mm.default,
    )
    yield ip
    ip.run_line_magic("unload_ext", "opmagic")


@pytest.mark.parametrize(
    ("call", "path"),
    [
        ("torch.ops.aten.mul(x, y)", ("AutogradCPU", "CPU")),
        ("torch.ops.aten.mul.Tensor(y, y)", ("AutogradCPU", "CPU")),
        ("mm_default(x, y)", ("AutogradCPU", "CPU")),
        ("scale(x, 2.0)", ("AutogradCPU", "CPU")),
        ("--no-grad torch.ops.aten.add(*pair, **options)", ("AutogradCPU", "CPU")),
        ("--inference-mode torch.ops.aten.add(y, other=y,  alpha=3)", ("CPU",)),
        ("--inference-mode torch.ops.aten.mul(x, y)", ("CPU",)),
        ("--autocast cpu torch.ops.aten.mm(y, y)", ("AutocastCPU", "AutogradCPU", "CPU")),
        ("--vmap --no-grad torch.ops.aten.mul(y, y)", None),
        ("torch.add(x, 1)", ("AutogradCPU", "CPU")),  # as users name operators
        ("x.mul(y)", ("AutogradCPU", "CPU")),
        (
            "--fake torch.nn.functional.silu(y)",
            ("PythonTLSSnapshot", "AutogradCPU", "Python", "Meta"),
        ),
    ],
)
def test_dispatch_resolves_calls_without_running_them(shell, call: str, path) -> None:
    result = shell.run_line_magic("dispatch", call)
    assert isinstance(result, Resolution)
    if path is None:
        assert result.path[0] == "FuncTorchDynamicLayerFrontMode"
    else:
        assert result.path == path


def test_dispatch_with_fake_and_logging_modes(shell) -> None:
    result = shell.run_line_magic("dispatch", "--fake --logging-mode torch.ops.aten.mul(y, y)")
    assert "TorchDispatchMode FakeTensorMode active" in result.context
    assert "TorchDispatchMode LoggingMode active" in result.context


def test_dispatch_all_draws_every_key(shell) -> None:
    result = shell.run_line_magic("dispatch", "--all scale(x, 2.0)")
    assert isinstance(result, Diagram)
    assert "PythonDispatcher" in result.dot and "· fallback" in result.dot
    assert "path: AutogradCPU -> CPU" in result.text


@pytest.mark.parametrize(
    ("line", "error", "message"),
    [
        ("torch.ops.aten.mul", UsageError, "needs a call expression"),
        ("x + y", UsageError, "needs a call expression"),
        ("", UsageError, "needs a call, e.g."),
        ("torch.ops.aten.mul(x,", UsageError, "could not parse"),
        (
            "torch.ops.aten.mul(x, nothing_here)",
            UsageError,
            "could not evaluate the argument 'nothing_here': NameError",
        ),
        ("torch.norm(x)", NotAnOperatorError, "calls several operators .*torch.ops.aten.norm"),
        ("torch.ops.aten.mul(y, 'a')", ArgumentsMismatchError, "No overload of aten::mul accepts"),
        ("--autocast nope torch.ops.aten.mul(x, y)", OpmagicError, "autocast cannot be turned on"),
        ("--frobnicate torch.ops.aten.mul(x, y)", UsageError, "unrecognized arguments: --frob"),
    ],
    ids=[
        "packet",
        "expression",
        "empty",
        "syntax",
        "name",
        "not-an-op",
        "wrong-type",
        "bad-device",
        "bad-option",
    ],
)
def test_dispatch_bad_input_is_one_clear_error(shell, line: str, error: type, message: str) -> None:
    """A bad line or expression is a UsageError; what resolve refuses, its own OpmagicError;
    both named after the magic."""
    with pytest.raises(error, match=f"^%dispatch: .*{message}") as raised:
        shell.run_line_magic("dispatch", line)
    assert raised.type is error


def test_split_options_keeps_the_call_verbatim() -> None:
    assert split_options("--autocast cpu --all f(x, 'a  b')", {"--autocast"}) == (
        "--autocast cpu --all",
        "f(x, 'a  b')",
    )
    assert split_options("  f(-x)", {"--autocast"}) == ("", "f(-x)")
    assert split_options("--autocast=cpu f(x)", {"--autocast"}) == ("--autocast=cpu", "f(x)")
