"""Bounded reads of a store snapshot for the operator console (`service.inspect_store`).

Theory of operation: each read here walks an LMDB cursor for at most a number of keys its
caller gives, so a page over a store of millions of timers costs what the page shows, not
what the store holds. The queue listing skips from one queue to the next in the timer index
(one seek per queue), the way `StoreView.lanes` walks lanes; a count stops at its cap.
"""

from __future__ import annotations

from collections.abc import Iterator

from nereus.kernel.records import (
    CommandBatch,
    LogEntry,
    PublishAdmissions,
    PublishOutcomes,
    Record,
)
from nereus.storage.base import StoreView
from nereus.storage.codec import decode_entry, key_position, lane_prefix, position_key


def log_entry(view: StoreView, position: int) -> LogEntry | None:
    """The log entry at `position`, or None below the log's floor (or past its end)."""
    env = view._env
    raw = view._txn.get(position_key(position), None, env.log)
    if raw is None:
        return None
    return decode_entry(raw, env.data_file, position)


def newest_entries(view: StoreView, limit: int, records: int | None = None) -> Iterator[LogEntry]:
    """The newest `limit` log entries, newest first, stopping after the entry that brings the
    records read to `records` (an entry is a batch of up to hundreds of records, so a window
    counted in entries alone costs what the busiest moment wrote)."""
    env = view._env
    seen = 0
    with view._txn.cursor(db=env.log) as cursor:
        if not cursor.last():
            return
        for _ in range(limit):
            key, raw = cursor.item()
            entry = decode_entry(raw, env.data_file, key_position(key))
            yield entry
            seen += width(entry.record)
            if (records is not None and seen >= records) or not cursor.prev():
                return


def width(record: Record) -> int:
    """How many records `record` stands for (`kernel.records.members`), without building them."""
    if isinstance(record, PublishAdmissions | PublishOutcomes | CommandBatch):
        return len(record.items)
    return 1


def tenant_queues(view: StoreView, tenant: str, limit: int) -> tuple[list[str], bool]:
    """The tenant's queues with live timers, in byte order: at most `limit`, and whether
    more follow. One seek per queue."""
    prefix = tenant.encode() + b"\x00"
    queues: list[str] = []
    with view._txn.cursor(db=view._env.timer_index) as cursor:
        found = cursor.set_range(prefix)
        while found:
            key = cursor.key()
            if not key.startswith(prefix):
                break
            if len(queues) == limit:
                return queues, True
            queue = key[len(prefix) :].split(b"\x00", 1)[0]
            queues.append(queue.decode())
            # Past every key of this queue ("q\0..."), before the next ("q\x01", "qa").
            found = cursor.set_range(prefix + queue + b"\x01")
    return queues, False


def count_live(view: StoreView, tenant: str, queue: str, cap: int) -> int:
    """The queue's live timers, counted up to `cap`."""
    prefix = lane_prefix(tenant, queue)
    count = 0
    with view._txn.cursor(db=view._env.timer_index) as cursor:
        if not cursor.set_range(prefix):
            return 0
        for key in cursor.iternext(values=False):
            if not key.startswith(prefix) or count >= cap:
                break
            count += 1
    return count


def first_lane_key(view: StoreView, tenant: str, queue: str) -> bytes | None:
    """The queue's earliest timeline key (its next due work), or None."""
    return next(view.lane_keys(tenant, queue), None)
