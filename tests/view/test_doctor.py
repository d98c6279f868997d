"""How a diagnosis looks: text that fits the terminal, HTML with the ladder and each finding's
fix highlighted, a DataFrame of the rungs; and the doctor's progress line."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from opmagic import Diagnosis, doctor
from opmagic.view.doctor import diagnosis_text
from opmagic.view.style import FAIL_FILL


@pytest.fixture(scope="module")
def broken() -> Diagnosis:
    """A custom op without a fake impl, diagnosed on the eager rungs."""

    @torch.library.custom_op("doctor_view::twice", mutates_args=())
    def twice(x: Tensor) -> Tensor:
        return x * 2

    return doctor(twice, torch.randn(3), until="make_fx", progress=False)


@pytest.mark.parametrize("width", [60, 100, 160])
def test_text_fits_the_terminal_keeping_the_fix_whole(broken: Diagnosis, width: int) -> None:
    text = diagnosis_text(broken, width=width)
    fix_lines = {f"       {line}" for line in broken.findings[0].fix.splitlines()}
    assert all(len(line) <= width or line in fix_lines for line in text.splitlines())
    assert text.startswith("doctor doctor_view::twice: 1 finding: no-fake")
    assert any(
        line.strip().startswith("✗ fake vs real") for line in text.splitlines()
    )
    assert "1. no-fake (rung fake)" in text
    for line in broken.findings[0].fix.splitlines():
        assert f"       {line}" in text


def test_text_uses_the_columns_of_the_terminal(broken: Diagnosis, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "70")
    assert max(map(len, str(broken).splitlines())) <= 70


def test_html_draws_the_ladder_and_highlights_failing_rungs_and_the_fix(broken: Diagnosis) -> None:
    html = broken._repr_html_()
    assert html.count(f"background:{FAIL_FILL}") == sum(r.status == "fail" for r in broken.rungs)
    assert "register_fake" in html and '<pre style="background:#e8f5e9' in html
    assert "evidence: <code>Meta: stub" in html
    assert "site: " in html


def test_frame_has_a_row_per_rung(broken: Diagnosis) -> None:
    frame = broken.frame()
    assert list(frame.columns) == [
        "rung",
        "title",
        "status",
        "detail",
        "seconds",
        "samples",
        "causes",
    ]
    assert len(frame) == len(broken.rungs)
    assert frame.set_index("rung").loc["fake", "causes"] == "no-fake"


def test_a_healthy_diagnosis_says_so() -> None:
    found = doctor("aten::sin", torch.randn(2), until="fake", progress=False)
    assert str(found).startswith("doctor aten::sin: healthy: 3 rungs pass")
    assert "\n1. " not in str(found)
