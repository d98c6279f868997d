"""The handler registry of resolve: every registration names a key this torch has."""

from __future__ import annotations

from opmagic.dispatch.keys import CATEGORIES, catalogue
from opmagic.dispatch.resolve.handlers import HANDLERS_BY_CATEGORY, HANDLERS_BY_FUNCTIONALITY


def test_every_handler_is_registered_for_a_real_functionality_or_category():
    """A misspelt ``@handles("...")`` would silently leave its keys to the default handler."""
    functionalities = {info.functionality for info in catalogue().runtime}
    assert set(HANDLERS_BY_FUNCTIONALITY) <= functionalities, (
        set(HANDLERS_BY_FUNCTIONALITY) - functionalities
    )
    assert set(HANDLERS_BY_CATEGORY) <= set(CATEGORIES), set(HANDLERS_BY_CATEGORY) - set(
        CATEGORIES
    )
