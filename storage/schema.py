"""The store's own header values and the schema version rule.

Theory of operation: the header is written once when a store is created and checked on every
open. `SCHEMA_VERSION` names the on-disk layout (sub-database names, key encodings, value
framing and the kernel value types). A store of an older version is migrated forward by the
steps in `MIGRATIONS`, a newer one is refused, and so is an older one with
no migration path: guessing would corrupt it. `REBUILD_HINTS` says, for such a version, how
to get a current store instead.

Versions: 1 the first; 2 adds the `usage` table (per-tenant live messages and bytes) and the
`timer_index` sub-database (a queue's live timers by timer key); 3 adds the `dead_letters`
table (dead-letter copies owed, which hold their payload in place of the DEAD_LETTERED
message) and the message's dead-letter evidence; 4 adds the attempt's fence id (the fencing
identity of the producer that sends it). Version 3 migrates to 4 by rewriting the header
only: the new field is optional, and an attempt of a version-3 store was admitted unfenced.
5: evidence may carry the destination's own message id (`Evidence.broker_message_id`, Pulsar);
version 4 migrates to 5 by rewriting the header only (no row of it has one). The bump keeps
an older build from misreading a store that holds such evidence: it refuses the newer version
by name instead of failing on an unknown field.
6: table rows are positional (msgpack arrays of the fields in declaration order, see
`storage/codec.py`) instead of maps; version 5 migrates to 6 by rewriting every table row in
the migration's one write transaction (a crash before its commit leaves the version-5 store
as it was), logging its progress.
7: the `story` sub-database, a per-message index of the commands that named each message
and the verdicts they got (`storage/story.py`), and the meta key `story_floor`, the first log
position the index covers. Version 6 migrates to 7 by creating the empty sub-database in the
migration's write transaction and putting the floor past the applied position: the entries
folded before were never indexed, and the log may no longer hold them to index now.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Literal

import msgspec

from nereus.kernel.codes import Code
from nereus.kernel.config import KernelConfig
from nereus.kernel.model import ShardMeta, Table
from nereus.storage.codec import decode_map_row, decode_struct, encode_row, encode_value
from nereus.storage.errors import StoreError

SCHEMA_VERSION = 7
HEADER_KEY = b"store_header"
SHARD_META_KEY = b"shard_meta"
LOG_INFO_KEY = b"log_info"
LOG_SOURCE_KEY = b"log_source"
STORY_FLOOR_KEY = b"story_floor"


_log = logging.getLogger("nereus.storage")
# Rows between two progress records of a long migration.
MIGRATION_PROGRESS_ROWS = 1_000_000


def _rows_unchanged(_txn: Any, _env: Any) -> None:
    """A step whose new fields are optional: old rows decode with their defaults."""


def _positional_rows(txn: Any, env: Any) -> None:
    """Rewrite every table row from its map form to its positional form (schema 6)."""
    done = 0
    for table, db in env.tables.items():
        with txn.cursor(db=db) as cursor:
            found = cursor.first()
            while found:
                key = cursor.key()
                value = decode_map_row(table, cursor.value(), env.data_file, key)
                cursor.put(key, encode_row(table, value))
                done += 1
                if done % MIGRATION_PROGRESS_ROWS == 0:
                    _progress(env.data_file, done, table)
                found = cursor.next()
    _progress(env.data_file, done, None)


def _progress(data_file: str, rows: int, table: Table | None) -> None:
    event = "store_migration_progress" if table is not None else "store_migration_rows_done"
    fields = {"store": data_file, "to_version": 6, "rows": rows}
    if table is not None:
        fields["table"] = table.value
    _log.info(event, extra={"event": event, "fields": fields})


def _story_index(txn: Any, env: Any) -> None:
    """Create the story sub-database (schema 7) and start its coverage after the applied
    position. Created here, in the migration's transaction, never at open: a store left at
    version 6 by a failed migration must not hold a sub-database version 6 calls foreign."""
    env.create_story(txn)
    raw = txn.get(SHARD_META_KEY, db=env.meta)
    applied = (
        0 if raw is None else decode_struct(ShardMeta, raw, env.data_file, "shard meta").position
    )
    put_story_floor(txn, env.meta, applied + 1)


# from-version -> function migrating an open write transaction (and the store's `Env`) to
# from-version + 1 (the caller rewrites the header's version in the same transaction)
MIGRATIONS: dict[int, Callable[[Any, Any], None]] = {
    3: _rows_unchanged,
    4: _rows_unchanged,
    5: _positional_rows,
    6: _story_index,
}

# from-version -> what the refusal of such a store tells the operator to do instead
REBUILD_HINTS: dict[int, str] = {
    1: "it lacks the tenant usage table and the timer index, which only a fold of its log "
    "builds: export the log with the Nereus build that wrote the store (`nereus export`) "
    "and import the file into a new directory with this one (`nereus import`)",
    2: "it lacks the dead-letter table (the dead-letter copies its dead-lettered timers owe, "
    "which only a fold of its log builds): export the log with the Nereus build that wrote "
    "the store (`nereus export`) and import the file into a new directory with this one "
    "(`nereus import`); every dead-lettered generation's copy is then owed and is written "
    "again unless the destination already holds it under its attempt id",
}


class StoreHeader(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`config` is the kernel configuration the store is folded with, kept whole so an
    auditor can replay without being told it."""

    schema_version: int
    store_id: str
    shard_id: str
    config_fingerprint: str
    created_at_ms: int
    config: KernelConfig


class LogInfo(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`floor`: the first position still in the log. `snapshot_position`: the position of
    the snapshot the log was compacted behind (0: never compacted)."""

    floor: int = 1
    snapshot_position: int = 0


class LogSource(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where the shard log comes from when it is not this store's own embedded log: a Kafka
    topic partition, and the offset of the last record folded (written in the same
    transaction as the fold, so a restarted owner resumes at `last_offset + 1`). Absent in an
    embedded store. `last_offset` -1: nothing folded yet."""

    kind: Literal["kafka"]
    topic: str
    partition: int
    last_offset: int = -1


class PayloadBlob(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Payload bytes with the last log position that referenced them, so bytes are kept
    until every schedule naming them has been folded."""

    last_ref_position: int
    data: bytes


class StoryFloor(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The first log position the story index covers: marks exist for every position from
    here on. 1 in a store that folded its whole log; past the applied position wherever a
    state arrived without its log being folded here (a migration, a snapshot, an import)."""

    position: int


class StoryMark(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """One command's verdict as the fold gave it (`kernel.effects.EntryOutcome`), stored
    under (message id, log position, batch item). An array, in this field order: storage
    encodes it from a tuple on the fold's hot path (`storage.story`). `record_type` is the
    outcome's (COMMANDS_V1 for a batch refused as a whole); `persisted_at_ms` the entry's."""

    persisted_at_ms: int
    record_type: str
    code: Code
    applied: bool
    generation: int | None
    version: int | None
    deliver_at_ms: int | None
    txn: str | None
    attempt_id: str | None


class StoryMarkRow(msgspec.Struct, frozen=True):
    """A mark with where it sits in the log: `index` is its item in a batch record (0 for
    a single record)."""

    position: int
    index: int
    mark: StoryMark


class StoreOptions(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    # Address space, not disk: LMDB grows the file as pages are used.
    map_size_bytes: int = 64 * 1024**3
    max_batch_entries: int = 1000
    # fsync on every commit. Only benchmarks of the non-durable baseline turn this off.
    sync: bool = True
    # Walk the whole state and check the kernel invariants and the storage indexes at open.
    # O(state): on very large stores an operator may turn it off and run `nereus replay
    # --verify` instead.
    check_invariants_on_open: bool = True
    # Walk every page of the file in a child process before opening it here: LMDB aborts
    # the process on a damaged page instead of raising (storage/preflight.py). O(pages).
    check_structure_on_open: bool = True


def check_schema(raw: bytes, path: str) -> StoreHeader:
    """Decode the header and enforce the version rule."""
    version = _peek_version(raw, path)
    if version > SCHEMA_VERSION:
        raise StoreError(
            path,
            f"store schema version {version} was written by a newer Nereus; "
            f"this build reads up to version {SCHEMA_VERSION}",
        )
    if version < SCHEMA_VERSION and version not in MIGRATIONS:
        hint = REBUILD_HINTS.get(version)
        raise StoreError(
            path,
            f"store schema version {version} has no migration path to {SCHEMA_VERSION}"
            + (f": {hint}" if hint else ""),
        )
    return decode_struct(StoreHeader, raw, path, "store header")


def migrate(txn: Any, env: Any, header: StoreHeader) -> StoreHeader:
    """Bring a checked header's store (`env`, a storage `Env`) to `SCHEMA_VERSION` inside the
    open write transaction `txn` (every step, then the header's new version), or return it
    as it is."""
    if header.schema_version == SCHEMA_VERSION:
        return header
    for version in range(header.schema_version, SCHEMA_VERSION):
        MIGRATIONS[version](txn, env)
    header = msgspec.structs.replace(header, schema_version=SCHEMA_VERSION)
    txn.put(HEADER_KEY, encode_value(header), db=env.meta)
    return header


def put_story_floor(txn: Any, meta_db: Any, position: int) -> None:
    """Record where the story index begins (`StoryFloor`), in the caller's transaction."""
    txn.put(STORY_FLOOR_KEY, encode_value(StoryFloor(position)), db=meta_db)


def _peek_version(raw: bytes, path: str) -> int:
    class _Version(msgspec.Struct):
        schema_version: int

    return decode_struct(_Version, raw, path, "store header").schema_version
