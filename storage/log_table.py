"""The embedded shard log's table: entries at dense positions, and the payload bytes they carry.

Theory of operation: the `log` database maps an 8-byte big-endian position to one encoded
`LogEntry`; positions are dense from the log's floor (`LogInfo.floor`, above 1 once the log
was compacted behind a snapshot). A schedule's payload bytes are not in its entry: they live
in `payload_bytes` under the schedule's digest, as a `PayloadBlob` that remembers the last
position naming them, so the fold's garbage collection (`storage.fold`) can tell bytes a
not-yet-folded entry still needs from bytes nobody can need.

Everything here works inside a transaction the caller (`storage.store.ShardStore`) opened,
and never moves the store's in-memory positions: those move only once that transaction
committed. `read_positions` reads what the positions are at open (or after an import) and
refuses an applied position the log cannot account for.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from nereus.kernel.model import ShardMeta
from nereus.kernel.native import sha256_hex
from nereus.kernel.records import (
    COMMAND_TYPES,
    Appendable,
    CommandBatch,
    LogEntry,
    Payload,
    Record,
    Schedule,
)
from nereus.storage.codec import (
    decode_entry,
    decode_struct,
    encode_entry,
    encode_value,
    key_position,
    position_key,
)
from nereus.storage.env import Env
from nereus.storage.errors import StoreError
from nereus.storage.schema import (
    LOG_INFO_KEY,
    LOG_SOURCE_KEY,
    SHARD_META_KEY,
    LogInfo,
    LogSource,
    PayloadBlob,
)

# The records a guarded commit folds as they are (`ShardStore.commit(guarded=True)`).
_GUARDED_TYPES = (*COMMAND_TYPES, CommandBatch)


class LogPositions(NamedTuple):
    """Where the log and the fold stand, as stored."""

    meta: ShardMeta
    info: LogInfo
    source: LogSource | None
    last_position: int
    last_persisted_at_ms: int


def append_in(
    env: Env,
    txn: Any,
    items: Sequence[Appendable],
    *,
    last_position: int,
    persisted_at_ms: int,
    checked: bool = False,
) -> list[LogEntry]:
    """Put `items` at the positions after `last_position`, all stamped `persisted_at_ms`
    (already clamped by the caller). Returns the entries as a replay will read them: decoded
    from their bytes, except a guarded command (`checked`), which is its own decoding."""
    entries: list[LogEntry] = []
    position = last_position
    for record, payload in items:
        position += 1
        entry = LogEntry(position, persisted_at_ms, record)
        store_payloads(env, txn, record, payload, position, checked=checked)
        blob = encode_entry(entry)
        txn.put(position_key(position), blob, db=env.log)
        if checked and isinstance(record, _GUARDED_TYPES):
            entries.append(entry)
        else:
            entries.append(decode_entry(blob, env.data_file, position))
    return entries


def store_payloads(
    env: Env, txn: Any, record: Record, payload: Payload, position: int, *, checked: bool
) -> None:
    """Store the bytes of each schedule `record` holds (itself, or a batch's items)."""
    if isinstance(record, CommandBatch):
        if payload is None:
            payload = (None,) * len(record.items)
        if not isinstance(payload, tuple) or len(payload) != len(record.items):
            raise ValueError("a batch of commands carries one payload (or None) per item")
        for item, item_payload in zip(record.items, payload, strict=True):
            store_payloads(env, txn, item, item_payload, position, checked=checked)
    elif isinstance(payload, tuple):
        raise ValueError(f"{type(record).__name__} is not a batch: one payload or None")
    elif isinstance(record, Schedule):
        _store_payload(env, txn, record, payload, position, checked=checked)
    elif payload is not None:
        raise ValueError(f"{type(record).__name__} carries no payload")


def _store_payload(
    env: Env, txn: Any, record: Schedule, payload: bytes | None, position: int, *, checked: bool
) -> None:
    key = record.payload_digest.encode()
    if payload is not None:
        # A SHA-256 costs even for a small payload: `checked` says the caller did it already.
        if not checked and sha256_hex(payload) != record.payload_digest:
            raise ValueError("payload bytes do not match the schedule's payload_digest")
        if len(payload) != record.payload_size:
            raise ValueError("payload size does not match the schedule's payload_size")
    existing = txn.get(key, None, env.payload_bytes)
    if existing is not None:
        what = f"payload {record.payload_digest}"
        data = decode_struct(PayloadBlob, existing, env.data_file, what).data
    elif payload is not None:
        data = payload
    else:
        # A schedule whose bytes are not here still gets logged: the kernel validates
        # the reference, and a claim proves the bytes missing (CLAIM_RESULT_V1).
        return
    txn.put(key, encode_value(PayloadBlob(position, data)), db=env.payload_bytes)


def iter_log_in(
    env: Env, txn: Any, from_position: int, to_position: int | None
) -> Iterator[LogEntry]:
    """Entries in order from `from_position` up to `to_position` (None: the end)."""
    data_file = env.data_file
    with txn.cursor(db=env.log) as cursor:
        if not cursor.set_range(position_key(max(from_position, 1))):
            return
        for key, value in cursor:
            position = key_position(key)
            if to_position is not None and position > to_position:
                return
            yield decode_entry(value, data_file, position)


def check_matches_log(env: Env, txn: Any, entry: LogEntry) -> None:
    """Refuse an entry that would fold something other than what the log holds there."""
    stored = txn.get(position_key(entry.position), db=env.log)
    if stored is not None and stored != encode_entry(entry):
        raise StoreError(
            env.data_file,
            "an entry differs from the one the shard log holds at its position",
            f"shard log position {entry.position}",
        )


def read_positions(env: Env, persisted_floor_ms: int) -> LogPositions:
    """The stored meta, log info, log source and the log's last entry, checked against each
    other. `persisted_floor_ms`: a persistence time the clamp already reached in memory."""
    data_file = env.data_file
    with env.env.begin() as txn:
        meta = decode_struct(
            ShardMeta, _must(txn.get(SHARD_META_KEY, db=env.meta), data_file, "meta"), data_file,
            "shard meta",
        )  # fmt: skip
        info = decode_struct(
            LogInfo, _must(txn.get(LOG_INFO_KEY, db=env.meta), data_file, "log info"), data_file,
            "log info",
        )  # fmt: skip
        raw_source = txn.get(LOG_SOURCE_KEY, db=env.meta)
        source = None
        if raw_source is not None:
            source = decode_struct(LogSource, raw_source, data_file, "log source")
        last_persisted_at_ms = persisted_floor_ms
        with txn.cursor(db=env.log) as cursor:
            if cursor.last():
                last_position = key_position(cursor.key())
                entry = decode_entry(cursor.value(), data_file, last_position)
                last_persisted_at_ms = entry.persisted_at_ms
            else:
                last_position = info.floor - 1
    # The clamp must survive a log compacted down to nothing.
    last_persisted_at_ms = max(last_persisted_at_ms, meta.last_persisted_at_ms)
    applied = meta.position
    if applied > last_position:
        raise StoreError(
            data_file,
            f"applied position {applied} is beyond the end of the shard log "
            f"({last_position}): the log was truncated or replaced",
        )
    if applied < info.snapshot_position:
        raise StoreError(
            data_file,
            f"applied position {applied} is below the snapshot the log was compacted "
            f"behind ({info.snapshot_position})",
        )
    return LogPositions(meta, info, source, last_position, last_persisted_at_ms)


def _must(raw: bytes | None, path: str, what: str) -> bytes:
    if raw is None:
        raise StoreError(path, f"store header present but {what} is missing")
    return raw
