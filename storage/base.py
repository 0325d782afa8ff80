"""`StateBase` over an LMDB transaction.

Theory of operation: the reducer reads rows through the kernel's `StateBase` protocol. Here a
row is one LMDB get in the table's sub-database, decoded with its checksum verified. The
transaction is an MVCC snapshot, so the base cannot change under a fold; storage writes a
batch's changes into the same write transaction only after the fold of that batch is done.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from nereus.kernel.keys import MESSAGE_ID_BYTES, usage_key
from nereus.kernel.model import LIVE_STATUSES, Message, Table, TenantUsage, Value
from nereus.storage.codec import decode_struct, decode_value, lane_prefix, timer_index_key
from nereus.storage.errors import CorruptRecord
from nereus.storage.schema import (
    STORY_FLOOR_KEY,
    PayloadBlob,
    StoryFloor,
    StoryMark,
    StoryMarkRow,
)

_HEX_DIGITS = frozenset("0123456789abcdef")
_MID_CHARS = 2 * MESSAGE_ID_BYTES
# A story key: the message id, then the position (8 bytes) and the batch item (2 bytes).
_STORY_KEY_BYTES = _MID_CHARS + 10

NO_USAGE = TenantUsage(live=0, bytes=0)


class LmdbBase:
    __slots__ = ("_dbs", "_path", "_txn")

    def __init__(self, txn: Any, dbs: Mapping[Table, Any], path: str) -> None:
        self._txn = txn
        self._dbs = dbs
        self._path = path

    def get(self, table: Table, key: bytes) -> Value | None:
        # `db` positionally, here and on the other hot paths: python-lmdb parses keyword
        # arguments through a dict, which is half the cost of a get.
        data = self._txn.get(key, None, self._dbs[table])
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


class StoreView(LmdbBase):
    """A read snapshot of the whole shard store: tables, payload bytes, the lane index, the
    timer index, tenant usage and the story index."""

    __slots__ = ("_env",)

    def __init__(self, txn: Any, env: Any) -> None:
        super().__init__(txn, env.tables, env.data_file)
        self._env = env

    def payload(self, digest: str) -> bytes | None:
        raw = self._txn.get(digest.encode(), None, self._env.payload_bytes)
        if raw is None:
            return None
        return decode_struct(PayloadBlob, raw, self._path, f"payload {digest}").data

    def lanes(self) -> Iterator[tuple[str, str, bytes]]:
        """(tenant, queue, first timeline key) of every lane with timeline work."""
        with self._txn.cursor(db=self._env.lane_timeline) as cursor:
            found = cursor.first()
            while found:
                key = cursor.key()
                tenant, queue, rest = key.split(b"\x00", 2)
                yield tenant.decode(), queue.decode(), rest
                found = cursor.set_range(tenant + b"\x00" + queue + b"\x00" + b"\xff" * 33)

    def lane_keys(self, tenant: str, queue: str, after: bytes | None = None) -> Iterator[bytes]:
        """The lane's timeline keys in due order (strictly after `after`, if given)."""
        prefix = lane_prefix(tenant, queue)
        start = prefix if after is None else prefix + after + b"\x00"
        with self._txn.cursor(db=self._env.lane_timeline) as cursor:
            if not cursor.set_range(start):
                return
            for key in cursor.iternext(values=False):
                if not key.startswith(prefix):
                    return
                yield key[len(prefix) :]

    def count_timeline_before(self, stop: bytes, limit: int) -> int:
        """How many timeline rows sort before `stop`, counting at most `limit`."""
        count = 0
        with self._txn.cursor(db=self._env.tables[Table.TIMELINE]) as cursor:
            for key in cursor.iternext(values=False):
                if key >= stop or count >= limit:
                    break
                count += 1
        return count

    def first_timeline_key(self) -> bytes | None:
        with self._txn.cursor(db=self._env.tables[Table.TIMELINE]) as cursor:
            return cursor.key() if cursor.first() else None

    def tenant_usage(self, tenant: str) -> TenantUsage:
        """The tenant's live messages (SCHEDULED, PUBLISHING, UNCERTAIN) and their payload
        bytes in this shard, as of this snapshot."""
        value = self.get(Table.USAGE, usage_key(tenant))
        if value is None:
            return NO_USAGE
        assert isinstance(value, TenantUsage)
        return value

    def list_timers(
        self, tenant: str, queue: str, after: str | None, limit: int
    ) -> tuple[list[Message], bool]:
        """Up to `limit` live messages of the queue whose timer keys sort strictly after
        `after` (UTF-8 byte order; None: from the first), in that order, and whether at least
        one more follows. A key cursor, not an offset: keys scheduled or cancelled between
        two pages never make a later page skip or repeat a key that stayed live."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        prefix = lane_prefix(tenant, queue)
        # The least key strictly greater than prefix + after is prefix + after + NUL.
        start = prefix if after is None else timer_index_key(tenant, queue, after) + b"\x00"
        rows: list[Message] = []
        messages = self._dbs[Table.MESSAGES]
        with self._txn.cursor(db=self._env.timer_index) as cursor:
            if not cursor.set_range(start):
                return rows, False
            for key, mid in cursor:
                if not key.startswith(prefix):
                    return rows, False
                if len(rows) == limit:
                    return rows, True
                rows.append(self._indexed_message(key, mid, messages, tenant, queue))
        return rows, False

    def _indexed_message(
        self, key: bytes, mid: bytes, messages: Any, tenant: str, queue: str
    ) -> Message:
        where = f"timer index, key {key.hex()}"
        raw = self._txn.get(mid, None, messages)
        if raw is None:
            raise CorruptRecord(self._path, f"the timer index names absent message {mid!r}", where)
        message = decode_value(Table.MESSAGES, raw, self._path, mid)
        if (
            not isinstance(message, Message)
            or message.status not in LIVE_STATUSES
            or key != timer_index_key(tenant, queue, message.timer_key)
            or message.tenant != tenant
            or message.queue != queue
        ):
            raise CorruptRecord(
                self._path, f"the timer index disagrees with message {mid.decode()}", where
            )
        return message

    def story_floor(self) -> int:
        """The first log position the story index covers (`storage.story`): every command
        folded at or after it has its marks; one before it may have none."""
        raw = self._txn.get(STORY_FLOOR_KEY, None, self._env.meta)
        if raw is None:
            raise CorruptRecord(self._path, "the story floor is missing", "meta, story floor")
        return decode_struct(StoryFloor, raw, self._path, "meta, story floor").position

    def story_marks(self, message_id: str, limit: int) -> tuple[list[StoryMarkRow], bool]:
        """The newest `limit` marks of the message (`kernel.keys.message_id`), in log order
        (position, then batch item), and whether older ones were left out."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        if len(message_id) != _MID_CHARS or not _HEX_DIGITS.issuperset(message_id):
            raise ValueError(f"not a message id: {message_id!r}")
        prefix = message_id.encode()
        # The least key past every key of this message: its last hex digit, one up.
        beyond = prefix[:-1] + bytes([prefix[-1] + 1])
        rows: list[StoryMarkRow] = []
        with self._txn.cursor(db=self._env.story) as cursor:
            found = cursor.prev() if cursor.set_range(beyond) else cursor.last()
            while found:
                key = cursor.key()
                if not key.startswith(prefix):
                    break
                if len(rows) == limit:
                    rows.reverse()
                    return rows, True
                rows.append(self._story_row(key, cursor.value()))
                found = cursor.prev()
        rows.reverse()
        return rows, False

    def _story_row(self, key: bytes, raw: bytes) -> StoryMarkRow:
        where = f"story, key {key.hex()}"
        if len(key) != _STORY_KEY_BYTES:
            raise CorruptRecord(self._path, f"a story key of {len(key)} bytes", where)
        mark = decode_struct(StoryMark, raw, self._path, where)
        position = int.from_bytes(key[_MID_CHARS:-2], "big")
        return StoryMarkRow(position, int.from_bytes(key[-2:], "big"), mark)
