"""The fold: log entries through `kernel.reduce` into the materialized tables.

Theory of operation: `fold_in` runs inside ONE write transaction that the caller
(`storage.store.ShardStore`) opened; that transaction's snapshot is also the reducer's base
(`LmdbBase`), so the kernel reads exactly what the fold will write over. Per entry it
mirrors the entry into the local log when it extends it densely (a Kafka-sourced shard's
entries arrive from the topic, not from `append`), then reduces it and files its marks in the
story index (`storage.story`) from its effects, whichever path folded it (the reducer or a
compiled fold). Once every entry is reduced it writes the overlay's rows with the derived
indexes beside them (`storage.indexes`), drops the payload bytes nobody can need any more,
and puts the new `ShardMeta` (which carries the applied position). Nothing is returned to
act on before the caller commits: if the reducer raises (a broken invariant), the caller's
transaction aborts and nothing of the batch is written.

This is the hot path of the store: per entry one `reduce` call, per changed row one cursor
put and, for timeline and message rows, one index update, per command one story mark.
Keep it that way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from nereus.kernel.config import KernelConfig
from nereus.kernel.effects import Effect
from nereus.kernel.model import ShardMeta, Table, Value
from nereus.kernel.records import CommandBatch, LogEntry, Payload, Schedule
from nereus.kernel.reducer import reduce
from nereus.kernel.state import State
from nereus.storage import admitted, published, scheduled
from nereus.storage.base import LmdbBase
from nereus.storage.codec import decode_struct, encode_entry, encode_row, encode_value, position_key
from nereus.storage.env import Env
from nereus.storage.indexes import index_lane, index_timer
from nereus.storage.log_table import check_matches_log, store_payloads
from nereus.storage.schema import SHARD_META_KEY, PayloadBlob
from nereus.storage.story import mark_entry

Applied = tuple[LogEntry, tuple[Effect, ...]]

# Tables the write path compares against on every row, as module globals: an Enum class
# attribute goes through EnumType.__getattr__ on Python 3.11 (see kernel/step.py).
_TIMELINE: Final = Table.TIMELINE
_MESSAGES: Final = Table.MESSAGES
_PAYLOADS: Final = Table.PAYLOADS


def fold_in(
    env: Env,
    txn: Any,
    config: KernelConfig,
    meta: ShardMeta,
    entries: Sequence[LogEntry],
    *,
    log_end: int,
    at: Callable[[str], None],
    mirror: bool = False,
    payloads: Mapping[int, Payload] | None = None,
    checked: bool = False,
) -> tuple[list[Applied], ShardMeta, list[LogEntry]]:
    """Fold entries into the transaction, from `meta` with the log ending at `log_end`;
    returns each entry with its effects, the new meta and the entries written to the log.
    With `mirror`, entries that extend the local log densely are written to it (with the
    payload bytes of their schedules, if given; `checked`: already matched to their
    digests), and an entry that would fold something other than what the log holds at a
    not-yet-applied position is refused. Misplaced entries (duplicates of applied
    positions, gaps) are not logged: the reducer rejects them without consuming a
    position, and so must the log. `at` is the store's crash-window hook."""
    results: list[Applied] = []
    logged: list[LogEntry] = []
    released: set[bytes] = set()
    state = State(config, meta, LmdbBase(txn, env.tables, env.data_file))
    story = txn.cursor(env.story)
    for entry in entries:
        if mirror:
            if entry.position == log_end + 1:
                txn.put(position_key(entry.position), encode_entry(entry), db=env.log)
                if payloads is not None:
                    position = entry.position
                    payload = payloads.get(position)
                    store_payloads(env, txn, entry.record, payload, position, checked=checked)
                logged.append(entry)
                log_end += 1
            elif state.meta.position < entry.position <= log_end:
                check_matches_log(env, txn, entry)
        path = _compiled_path(state.meta, entry)
        if path is not None:
            # The compiled fold reads the transaction: what the overlay holds goes there
            # first, and the State after it starts again over the transaction.
            if len(state.overlay):
                released |= _write_changes(env, txn, state)
                state = state.rebase(state.base)
            done = _fold_compiled(env, txn, state.meta, entry, path, config=config)
            if done is not None:
                meta, effects, freed = done
                released |= freed
                state = State(config, meta, state.base)
                results.append((entry, effects))
                mark_entry(story, entry, effects)
                continue
        state, effects = reduce(state, entry)
        results.append((entry, effects))
        mark_entry(story, entry, effects)
    released |= _write_changes(env, txn, state)
    _collect_payloads(env, txn, released, entries, state.meta.position)
    at("fold")
    txn.put(SHARD_META_KEY, encode_value(state.meta), db=env.meta)
    at("meta")
    return results, state.meta, logged


# Which compiled fold may take an entry, and the items it would fold.
_OUTCOMES: Final = 0
_ADMISSIONS: Final = 1
_SCHEDULES: Final = 2


def _compiled_path(meta: ShardMeta, entry: LogEntry) -> tuple[int, list[Any]] | None:
    """The compiled fold that may try the entry (`storage.published`, `storage.admitted`,
    `storage.scheduled`) and its items, or None: the reducer folds it."""
    outcomes = published.candidate(meta, entry)
    if outcomes is not None:
        return _OUTCOMES, list(outcomes)
    admissions = admitted.candidate(meta, entry)
    if admissions is not None:
        return _ADMISSIONS, list(admissions)
    schedules = scheduled.candidate(meta, entry)
    if schedules is not None:
        return _SCHEDULES, list(schedules)
    return None


def _fold_compiled(
    env: Env,
    txn: Any,
    meta: ShardMeta,
    entry: LogEntry,
    path: tuple[int, list[Any]],
    *,
    config: KernelConfig,
) -> tuple[ShardMeta, tuple[Effect, ...], set[bytes]] | None:
    """The compiled fold's answer, or None when it did not take the entry (nothing written)."""
    kind, items = path
    if kind == _OUTCOMES:
        return published.fold(env, txn, meta, entry, items)
    if kind == _ADMISSIONS:
        return admitted.fold(env, txn, meta, entry, items)
    return scheduled.fold(env, txn, meta, entry, items, config=config)


def _write_changes(env: Env, txn: Any, state: State) -> set[bytes]:
    """Writes the overlay; returns the payload digests whose reference row was deleted."""
    released: set[bytes] = set()
    tables = env.tables
    # A cursor's put takes no keyword arguments: half the cost of `txn.put(..., db=)`.
    cursors: dict[Table, Any] = {}
    for table, key, value in state.changes():
        if table is _TIMELINE:
            index_lane(env, txn, key, value)
        elif table is _MESSAGES:
            index_timer(env, txn, key, value)
        if value is None:
            txn.delete(key, db=tables[table])
            if table is _PAYLOADS:
                released.add(key)
        else:
            cursor = cursors.get(table)
            if cursor is None:
                cursor = cursors[table] = txn.cursor(tables[table])
            cursor.put(key, encode_row(table, value))
    return released


def _collect_payloads(
    env: Env, txn: Any, released: set[bytes], entries: Sequence[LogEntry], applied: int
) -> None:
    """Drop payload bytes nobody can need: no message references them and no log entry
    above the applied position (a schedule not yet folded) names them."""
    candidates = set(released)
    for e in entries:
        record = e.record
        if isinstance(record, Schedule):
            candidates.add(record.payload_digest.encode())
        elif isinstance(record, CommandBatch):
            candidates.update(
                r.payload_digest.encode() for r in record.items if isinstance(r, Schedule)
            )
    for key in candidates:
        if txn.get(key, None, env.tables[_PAYLOADS]) is not None:
            continue
        raw = txn.get(key, None, env.payload_bytes)
        if raw is None:
            continue
        blob = decode_struct(PayloadBlob, raw, env.data_file, f"payload {key.decode()}")
        if blob.last_ref_position <= applied:
            txn.delete(key, db=env.payload_bytes)


def put_rows(env: Env, txn: Any, rows: Sequence[tuple[Table, bytes, Value]]) -> None:
    """Put a state's rows as they are, with the derived indexes beside them (a snapshot
    being restored: no reducer runs, the rows are the state)."""
    for table, key, value in rows:
        if table is _TIMELINE:
            index_lane(env, txn, key, value)
        elif table is _MESSAGES:
            index_timer(env, txn, key, value)
        txn.put(key, encode_row(table, value), db=env.tables[table])
