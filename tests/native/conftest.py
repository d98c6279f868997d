"""Fixtures of the build tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from opmagic.native import LoadedLibrary, precompile_headers

from .sources import op_source


@pytest.fixture
def loaded(build_cache) -> Iterator[list[LoadedLibrary]]:
    """Libraries a test appends here are unregistered when it ends (builds use the run's cache)."""
    libraries: list[LoadedLibrary] = []
    yield libraries
    for library in reversed(libraries):
        library.close()


@pytest.fixture
def core_precompiled(build_cache) -> None:
    """The core header set is precompiled in the run's cache (for tests that check that a
    build uses it: a build never waits for it)."""
    precompile_headers([op_source("fixture_core")])
