"""What the compiled folds of the hot records share (`storage.published`, `storage.admitted`).

Theory of operation: each compiled fold is handed a way to read a stored row (`reader`:
the framed bytes in the fold's own write transaction) and answers with rows to put or
delete, which `put_rows` writes into the same transaction. `SWITCH` turns every compiled
fold off at once: the tests fold one log with and without them and compare the stores.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import msgspec

from nereus.kernel import native
from nereus.kernel.codes import Code
from nereus.kernel.model import (
    Attempt,
    Counters,
    Message,
    ShardMeta,
    Status,
    Table,
    TimelineWork,
)
from nereus.kernel.records import LogEntry
from nereus.kernel.rules import rule
from nereus.kernel.timing import MAX_INSTANT_MS
from nereus.storage.env import Env

_TABLES: Final[dict[str, Table]] = {table.value: table for table in Table}


class _Switch:
    """Whether the compiled folds may run; each also needs its own `usable()`."""

    __slots__ = ("on",)

    def __init__(self) -> None:
        self.on = True


SWITCH: Final = _Switch()


def set_enabled(on: bool) -> bool:
    """Let the compiled folds run (or not); returns the previous setting."""
    before = SWITCH.on
    SWITCH.on = on
    return before


def layout_matches() -> bool:
    """Whether the crate reads and writes message, attempt and timeline rows in the
    model's field order."""
    return (
        Message.__struct_fields__ == native.MESSAGE_FIELDS
        and Attempt.__struct_fields__ == native.ATTEMPT_FIELDS
        and TimelineWork.__struct_fields__ == native.TIMELINE_FIELDS
    )


def rule_is(
    op: str,
    from_status: str,
    condition: str,
    *,
    code: Code,
    to_status: Status,
    new_generation: bool,
) -> bool:
    """Whether the rows are laid out as the crate reads them and the lifecycle table still
    gives (op, status, condition) the verdict a compiled fold was written for: a change to
    either turns the fold off rather than letting it disagree with the reference."""
    verdict = rule(op, from_status, condition)
    return (
        layout_matches()
        and verdict.code is code
        and verdict.to_status == to_status
        and verdict.new_generation == new_generation
    )


def may_fold(usable: bool, meta: ShardMeta, entry: LogEntry) -> bool:
    """Whether a compiled fold that is `usable` may try `entry`: the folds are on, and the
    entry is next in the log with a persistence time the reducer accepts (the reducer's
    own checks before any record is looked at)."""
    return (
        SWITCH.on
        and usable
        and entry.position == meta.position + 1
        and meta.last_persisted_at_ms <= entry.persisted_at_ms < MAX_INSTANT_MS
    )


def reader(env: Env, txn: Any) -> Callable[[str, bytes], bytes | None]:
    """`get(table name, key)`: a row's stored (framed) bytes in `txn`, or None."""
    dbs = {name: env.tables[table] for name, table in _TABLES.items()}

    def get(table: str, key: bytes) -> bytes | None:
        found: bytes | None = txn.get(key, None, dbs[table])
        return found

    return get


def put_rows(env: Env, txn: Any, writes: list[tuple[str, bytes, bytes | None]]) -> set[bytes]:
    """Write a compiled fold's answer; returns the payload digests whose reference row was
    deleted (for the payload collection that follows every fold)."""
    released: set[bytes] = set()
    tables = env.tables
    # Positional arguments: python-lmdb parses keywords through a dict (storage.base).
    for name, key, value in writes:
        db = tables[_TABLES[name]]
        if value is None:
            txn.delete(key, b"", db)
            if name == "payloads":
                released.add(key)
        else:
            txn.put(key, value, True, True, False, db)
    return released


def put_by_table(env: Env, txn: Any, grouped: list[tuple[str, list[tuple[bytes, bytes]]]]) -> None:
    """Write a compiled fold's puts grouped by table (the tables' names, or a derived
    index's database name): one cursor call per table."""
    for name, pairs in grouped:
        if name == "lane_timeline":
            db = env.lane_timeline
        elif name == "timer_index":
            db = env.timer_index
        else:
            db = env.tables[_TABLES[name]]
        txn.cursor(db).putmulti(pairs)


def next_meta(meta: ShardMeta, entry: LogEntry, deltas: dict[str, int]) -> ShardMeta:
    """The meta after `entry`, its counters moved by `deltas`: what `kernel.step.Step.finish`
    makes of an applied entry."""
    counters = meta.counters
    if deltas:
        values = msgspec.structs.asdict(counters)
        for name, delta in deltas.items():
            values[name] += delta
        counters = Counters(**values)
    return ShardMeta(
        entry.position,
        max(entry.persisted_at_ms, meta.last_persisted_at_ms),
        meta.shard_status,
        counters,
    )
