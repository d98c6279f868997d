"""``%kernels`` in a real IPython shell: the options of ``python -m opmagic kernels``."""

from __future__ import annotations

from html import escape

import pytest
import torch
from IPython.core.error import UsageError

from opmagic.errors import OpmagicError
from opmagic.view.frames import KernelsView


@torch.library.custom_op("opmagic_kernels::scale", mutates_args=())
def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    """A custom op without a fake impl (so --missing Meta lists it)."""
    return x * factor


@pytest.fixture(scope="module")
def shell(ipython):
    """An IPython shell with opmagic loaded."""
    ipython.run_line_magic("load_ext", "opmagic")
    yield ipython
    ipython.run_line_magic("unload_ext", "opmagic")


def test_kernels_wide_by_default(shell) -> None:
    view = shell.run_line_magic("kernels", "opmagic_kernels --key CPU --key Meta")
    assert isinstance(view, KernelsView)
    assert list(view.frame.columns) == ["CPU", "Meta"]
    assert view.frame.loc[("opmagic_kernels::scale", "default"), "CPU"].startswith("alias")
    assert "background-color" in view._repr_html_()
    assert "opmagic_kernels::scale" in str(view)
    every_key = shell.run_line_magic("kernels", "opmagic_kernels")
    plain = shell.display_formatter.format(every_key)[0]["text/plain"]  # terminal IPython
    assert all(key in plain for key in every_key.frame.columns)  # all 17, not pandas' 2 of 17
    assert "NaN" not in plain and "..." not in plain


def test_kernels_takes_the_namespace_as_the_cli_spells_it(shell) -> None:
    positional = shell.run_line_magic("kernels", "opmagic_kernels -k CPU")
    for line in ("--namespace opmagic_kernels -k CPU", "-n opmagic_kernels -k CPU --wide"):
        assert shell.run_line_magic("kernels", line).frame.equals(positional.frame)
    with pytest.raises(UsageError, match=r"^%kernels: two namespaces, 'aten' and --namespace"):
        shell.run_line_magic("kernels", "aten --namespace opmagic_kernels")


def test_kernels_long_and_missing(shell) -> None:
    long = shell.run_line_magic("kernels", "opmagic_kernels --long -k all")
    assert list(long.frame.columns) == ["op", "overload", "key", "kind", "alias", "source"]
    assert "AutogradCPU" in set(long.frame["key"])
    missing = shell.run_line_magic("kernels", "aten --missing Meta")
    assert "Meta" in missing.frame.columns
    assert set(missing.frame["Meta"]) <= {"missing", "fallback", "fallthrough"}
    ours = shell.run_line_magic("kernels", "opmagic_kernels --missing Meta")
    assert list(ours.frame.index.get_level_values("op")) == ["opmagic_kernels::scale"]


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
    assert shell.run_line_magic("kernels", "opmagic_kernels")._repr_html_().count("<details>") == 0


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("no_such_namespace", "No operators in namespace 'no_such_namespace'"),
        ("aten --key Autograd", "'Autograd' is an alias key"),
        ("aten --missing Nope", "Unknown dispatch key 'Nope'"),
    ],
)
def test_kernels_bad_input_is_one_clear_error(shell, line: str, message: str) -> None:
    with pytest.raises(OpmagicError, match=f"^%kernels: .*{message}"):
        shell.run_line_magic("kernels", line)
