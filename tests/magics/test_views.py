"""``%dispatch`` and ``%kernels`` in a real IPython shell."""

from __future__ import annotations

from html import escape

import pytest
import torch
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from opmagic import Resolution
from opmagic.magics.views import split_options
from opmagic.view.diagram import Diagram
from opmagic.view.frames import KernelsView


@torch.library.custom_op("opmagic_magics::scale", mutates_args=())
def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    """A custom op without a fake impl (so --missing Meta lists it)."""
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
    ("line", "message"),
    [
        ("torch.ops.aten.mul", "needs a call expression"),
        ("x + y", "needs a call expression"),
        ("", "needs a call, e.g."),
        ("torch.ops.aten.mul(x,", "could not parse"),
        ("torch.ops.aten.mul(x, nothing_here)", "could not evaluate 'nothing_here': NameError"),
        ("torch.add(x, y)", "torch.ops.aten.add"),
        ("torch.ops.aten.mul(y, 'a')", "No overload of aten::mul accepts"),
        ("--autocast nope torch.ops.aten.mul(x, y)", "autocast cannot be turned on"),
        ("--frobnicate torch.ops.aten.mul(x, y)", "unrecognized arguments: --frobnicate"),
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
def test_dispatch_bad_input_is_one_clear_usage_error(shell, line: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        shell.run_line_magic("dispatch", line)


def test_split_options_keeps_the_call_verbatim() -> None:
    assert split_options("--autocast cpu --all f(x, 'a  b')", {"--autocast"}) == (
        "--autocast cpu --all",
        "f(x, 'a  b')",
    )
    assert split_options("  f(-x)", {"--autocast"}) == ("", "f(-x)")
    assert split_options("--autocast=cpu f(x)", {"--autocast"}) == ("--autocast=cpu", "f(x)")


def test_kernels_wide_by_default(shell) -> None:
    view = shell.run_line_magic("kernels", "opmagic_magics --key CPU --key Meta")
    assert isinstance(view, KernelsView)
    assert list(view.frame.columns) == ["CPU", "Meta"]
    assert view.frame.loc[("opmagic_magics::scale", "default"), "CPU"].startswith("alias")
    assert "background-color" in view._repr_html_()
    assert "opmagic_magics::scale" in str(view)
    every_key = shell.run_line_magic("kernels", "opmagic_magics")
    plain = shell.display_formatter.format(every_key)[0]["text/plain"]  # terminal IPython
    assert all(key in plain for key in every_key.frame.columns)  # all 17, not pandas' 2 of 17
    assert "NaN" not in plain and "..." not in plain


def test_kernels_long_and_missing(shell) -> None:
    long = shell.run_line_magic("kernels", "opmagic_magics --long -k all")
    assert list(long.frame.columns) == ["op", "overload", "key", "kind", "alias", "source"]
    assert "AutogradCPU" in set(long.frame["key"])
    missing = shell.run_line_magic("kernels", "aten --missing Meta")
    assert "Meta" in missing.frame.columns
    assert set(missing.frame["Meta"]) <= {"missing", "fallback", "fallthrough"}
    ours = shell.run_line_magic("kernels", "opmagic_magics --missing Meta")
    assert list(ours.frame.index.get_level_values("op")) == ["opmagic_magics::scale"]


def test_kernels_folds_long_listings_and_names_the_call_for_all_rows(shell) -> None:
    """20 rows shown, up to 200 folded under them, the count and the call that has them all."""
    view = shell.run_line_magic("kernels", "aten --key CPU --missing Meta")
    assert len(view.frame) > 200
    html = view._repr_html_()
    shown, folded = html.split("<details>")
    assert shown.count("<tr>") == 2 + 20  # two header rows (keys, index names), the first rows
    assert f"<summary>rows 21–200 of {len(view.frame):,}</summary>" in folded
    assert folded.count("<tr>") == 2 + 180
    call = "opmagic.kernels('aten', ['CPU'], wide=True, missing='Meta')"
    assert f"{len(view.frame):,} rows in all; every one: <code>{escape(call)}</code>" in html
    text = str(view).splitlines()
    assert text[0].split() == ["op", "CPU", "Meta"]
    assert " ".join(" ".join(text[-2:]).split()).endswith(f"all of them: {call}")
    assert shell.run_line_magic("kernels", "opmagic_magics")._repr_html_().count("<details>") == 0


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("no_such_namespace", "No operators in namespace 'no_such_namespace'"),
        ("aten --key Autograd", "'Autograd' is an alias key"),
        ("aten --missing Nope", "Unknown dispatch key 'Nope'"),
    ],
)
def test_kernels_bad_input_is_one_clear_usage_error(shell, line: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        shell.run_line_magic("kernels", line)
