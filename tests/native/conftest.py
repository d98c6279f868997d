"""Fixtures of the build tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from opmagic.native import LoadedLibrary


@pytest.fixture
def loaded(build_cache) -> Iterator[list[LoadedLibrary]]:
    """Libraries a test appends here are unregistered when it ends (builds use the run's cache)."""
    libraries: list[LoadedLibrary] = []
    yield libraries
    for library in reversed(libraries):
        library.close()
