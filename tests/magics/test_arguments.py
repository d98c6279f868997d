"""The option-value helper of the cell magics."""

import pytest

from opmagic.magics.arguments import unquote


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('"-DFOO=1 -O2"', "-DFOO=1 -O2"),
        ("'x, y'", "x, y"),
        ("plain", "plain"),
        ("\"mixed'", "\"mixed'"),
        ('"', '"'),
        ("", ""),
        (None, None),
    ],
)
def test_unquote_strips_one_matching_pair_of_quotes(raw, expected):
    assert unquote(raw) == expected
