"""pandas forms of dispatch facts."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas

    from ..dispatch.table import DispatchTable

TABLE_COLUMNS = ["key", "category", "kind", "alias", "source", "site", "explanation"]


def table_frame(table: DispatchTable) -> pandas.DataFrame:
    """A row per runtime key of the table, in priority order, missing keys included."""
    import pandas as pd

    rows = [
        (e.key, e.category, e.kind, e.alias, e.source, e.site, e.explanation) for e in table.entries
    ]
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)
