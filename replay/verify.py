"""Compare a materialized store with a replay and say where they first differ."""

from __future__ import annotations

from collections.abc import Iterator

from nereus.kernel.model import TABLES, Table, Value
from nereus.kernel.state import State


def first_difference(live: State, replayed: State) -> str | None:
    """None if equal; else a sentence naming the first differing item in digest order."""
    if live.meta != replayed.meta:
        return f"shard meta differs: store {live.meta!r}, replay {replayed.meta!r}"
    for table in TABLES:
        diff = _table_difference(table, live.items(table), replayed.items(table))
        if diff is not None:
            return diff
    return None


def _table_difference(
    table: Table,
    live: Iterator[tuple[bytes, Value]],
    replayed: Iterator[tuple[bytes, Value]],
) -> str | None:
    a = next(live, None)
    b = next(replayed, None)
    while a is not None or b is not None:
        if b is None or (a is not None and a[0] < b[0]):
            assert a is not None
            return f"table {table.value}, key {a[0].hex()}: only in the store ({a[1]!r})"
        if a is None or b[0] < a[0]:
            return f"table {table.value}, key {b[0].hex()}: only in the replay ({b[1]!r})"
        if a[1] != b[1]:
            return f"table {table.value}, key {a[0].hex()}: store has {a[1]!r}, replay has {b[1]!r}"
        a = next(live, None)
        b = next(replayed, None)
    return None
