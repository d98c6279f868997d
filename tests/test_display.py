"""The display base: renderers looked up by type along the MRO, every IPython hook written once."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

import opmagic
from opmagic.display import Displayable, NoRendererError, format_duration, renderer_for, renders


@dataclass(frozen=True)
class Fact(Displayable):
    value: int


@dataclass(frozen=True)
class SpecialFact(Fact):
    pass


@renders(Fact, "text")
def _fact_text(fact: Fact) -> str:
    return f"fact {fact.value}"


@renders(SpecialFact, "html")
def _special_html(fact: SpecialFact) -> str:
    return f"<b>{fact.value}</b>"


@renders(Fact, "double")
def _double(fact: Fact, times: int = 2) -> int:
    return fact.value * times


def test_renderers_are_found_along_the_mro() -> None:
    special = SpecialFact(3)
    assert str(special) == "fact 3"  # the base's text renderer
    assert special._repr_html_() == "<b>3</b>"
    assert Fact(3)._repr_html_() is None  # nothing registered: IPython skips the format
    assert Fact(3)._repr_mimebundle_() is None
    assert renderer_for(special, "text") is _fact_text


def test_named_views_take_options_and_unknown_ones_say_why() -> None:
    assert Fact(4).view("double") == 8
    assert Fact(4).view("double", times=3) == 12
    with pytest.raises(NoRendererError, match="No 'diagram' view is registered for Fact"):
        Fact(4).view("diagram")


def test_ipython_shows_the_text_view_of_a_dataclass_not_its_repr() -> None:
    shell = InteractiveShell.instance()
    data, _ = shell.display_formatter.format(SpecialFact(5))
    assert data["text/plain"] == "fact 5"
    assert data["text/html"] == "<b>5</b>"


def test_opmagic_results_render_through_the_registry() -> None:
    resolution = opmagic.resolve("aten::add.Tensor", torch.randn(2), torch.randn(2))
    table = opmagic.dispatch_table("aten::add.Tensor")
    assert isinstance(resolution, Displayable) and isinstance(table, Displayable)
    assert str(resolution).startswith("aten::add.Tensor(")
    assert "path: AutogradCPU -> CPU" in str(resolution)
    assert table.frame().shape[0] == len(table.entries)
    assert set(table._repr_mimebundle_(exclude=["image/svg+xml"])) == {"text/plain"}


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (8.5e-7, "850 ns"),
        (2.134e-6, "2.13 µs"),
        (1.2e-3, "1.2 ms"),
        (0.9, "900 ms"),
        (0.99996, "1 s"),
        (2.0, "2 s"),
        (12.345, "12.3 s"),
        (1234.5, "1234 s"),
    ],
)
def test_every_duration_is_written_in_the_unit_that_fits(seconds, text) -> None:
    assert format_duration(seconds) == text


def test_a_duration_to_two_digits() -> None:
    assert [format_duration(s, 2) for s in (1.25, 12.34, 0.0456)] == ["1.2 s", "12 s", "46 ms"]


def test_no_module_formats_a_duration_of_its_own() -> None:
    """Durations reach the user through format_duration only: no f-string writes seconds or
    milliseconds itself ("{elapsed:.1f} s", "{seconds * 1000:.0f} ms")."""
    import re
    from pathlib import Path

    own = re.compile(r"\{[^{}]*:\.\d[fg]\} ?(s|ms|µs|us|ns)\b")
    package = Path(opmagic.__file__).parent
    found = [
        f"{path.relative_to(package)}:{number}"
        for path in package.rglob("*.py")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if own.search(line)
    ]
    assert not found
