"""The sample of a ground-truth matrix that the fast loop runs.

A test marked ``matrix`` (its module's ``pytestmark``) checks many combinations of a few
parameters (kernel sets x inputs x contexts). The fast loop, ``pytest -m "not slow and not
exhaustive"``, runs a stratified sample of its cases: every value of every parameter at least
once, and one case in :data:`SAMPLE_EVERY` besides; ``tests/conftest.py`` marks the other
cases ``exhaustive``. CI runs them all.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

SAMPLE_EVERY = 40


def in_sample(cases: Sequence[dict[str, Any]], every: int = SAMPLE_EVERY) -> list[bool]:
    """Whether each case (its parameters by name) is in the sample: the first case to give a
    parameter one of its values, and every ``every``-th case. Deterministic: it depends on
    the cases and their order only."""
    covered: set[tuple[str, Hashable]] = set()
    chosen = []
    for index, params in enumerate(cases):
        values = {(name, _hashable(value)) for name, value in params.items()}
        chosen.append(index % every == 0 or not values <= covered)
        covered |= values
    return chosen


def _hashable(value: Any) -> Hashable:
    """A parameter's value as a key: lists as tuples, what cannot be hashed by its repr."""
    if isinstance(value, (list, tuple)):
        return tuple(_hashable(v) for v in value)
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value
