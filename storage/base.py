"""`StateBase` over an LMDB transaction.

Theory of operation: the reducer reads rows through the kernel's `StateBase` protocol. Here a
row is one LMDB get in the table's sub-database, decoded with its checksum verified. The
transaction is an MVCC snapshot, so the base cannot change under a fold; storage writes a
batch's changes into the same write transaction only after the fold of that batch is done.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from kernel.model import Table, Value
from storage.codec import decode_value


class LmdbBase:
    __slots__ = ("_dbs", "_path", "_txn")

    def __init__(self, txn: Any, dbs: Mapping[Table, Any], path: str) -> None:
        self._txn = txn
        self._dbs = dbs
        self._path = path

    def get(self, table: Table, key: bytes) -> Value | None:
        data = self._txn.get(key, db=self._dbs[table])
        if data is None:
            return None
        return decode_value(table, data, self._path, key)

    def items(self, table: Table) -> Iterator[tuple[bytes, Value]]:
        with self._txn.cursor(db=self._dbs[table]) as cursor:
            for key, data in cursor:
                yield key, decode_value(table, data, self._path, key)

    def range(
        self, table: Table, start: bytes, stop: bytes | None = None
    ) -> Iterator[tuple[bytes, Value]]:
        """Rows with start <= key < stop, in key order: the timeline scan."""
        with self._txn.cursor(db=self._dbs[table]) as cursor:
            if not cursor.set_range(start):
                return
            for key, data in cursor:
                if stop is not None and key >= stop:
                    return
                yield key, decode_value(table, data, self._path, key)
