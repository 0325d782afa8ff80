"""The store's maintenance: opening (with migration and refusals), emptying, and loading rows.

Theory of operation: a store is trusted only after `open_env` (the file is LMDB, ours, not
truncated; a writer holds the directory's lock), `restore_header` (the header is there and
of a known schema, migrated by a writer; the store belongs to this shard and was folded
under this kernel configuration; the configuration's keys fit LMDB) and, when the options
ask, `check_state` (the stored state keeps the kernel's invariants and the derived indexes
match the tables). Each refusal names the file and the reason (`StoreError`); nothing is
guessed past. The in-memory positions are then read by `storage.log_table.read_positions`.

`discard_state` empties a store that can no longer follow its log (Kafka mode, a store
behind the partition's start) before a snapshot replaces it; `load_rows` fills an empty
store from a snapshot's rows in bounded write transactions. The log's own compaction behind
a snapshot is `storage.snapshot`'s; payload garbage collection runs with every fold
(`storage.fold`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from nereus.kernel.config import KernelConfig
from nereus.kernel.invariants import InvariantViolation, assert_invariants
from nereus.kernel.model import ShardMeta, Table, Value
from nereus.storage.codec import encode_value
from nereus.storage.env import Env, open_env
from nereus.storage.errors import StoreError, lmdb_refusal
from nereus.storage.fold import put_rows
from nereus.storage.indexes import check_indexes
from nereus.storage.reads import state_view
from nereus.storage.schema import (
    HEADER_KEY,
    LOG_INFO_KEY,
    LOG_SOURCE_KEY,
    SCHEMA_VERSION,
    SHARD_META_KEY,
    LogInfo,
    StoreHeader,
    StoreOptions,
    check_schema,
    migrate,
    put_story_floor,
)

MAX_KEY_BYTES = 511  # LMDB's default compile-time key size limit


def open_store_env(path: str, options: StoreOptions, *, create: bool, read_only: bool) -> Env:
    """The store's LMDB environment, opened as `options` say (a writer takes the lock)."""
    return open_env(
        path,
        map_size_bytes=options.map_size_bytes,
        sync=options.sync,
        create=create,
        check_structure=options.check_structure_on_open,
        read_only=read_only,
    )


def restore_header(
    env: Env,
    *,
    shard_id: str | None,
    config: KernelConfig | None,
    create: bool,
    created_at_ms: int,
) -> tuple[StoreHeader, KernelConfig]:
    """The store's header (written for a new store) and the kernel configuration to fold
    with. `config` None means: the one recorded in the store (or the default for a new one);
    `shard_id` None accepts whichever shard the store belongs to."""
    data_file = env.data_file
    with env.env.begin(write=not env.read_only) as txn:
        raw = txn.get(HEADER_KEY, db=env.meta)
        if raw is None:
            if _holds_data(txn, env):
                raise StoreError(data_file, "holds data but no Nereus store header")
            if not create:
                raise StoreError(data_file, "no Nereus store here")
            config = config or KernelConfig()
            header = _new_header(txn, env, shard_id or "0", config, created_at_ms)
        else:
            header = _current_header(txn, env, raw)
            config = config or header.config
    if 3 * config.max_identity_bytes + 2 + 32 > MAX_KEY_BYTES:
        raise StoreError(
            data_file,
            f"max_identity_bytes={config.max_identity_bytes} would build table keys longer "
            f"than LMDB's {MAX_KEY_BYTES}-byte limit",
        )
    if shard_id is not None and header.shard_id != shard_id:
        raise StoreError(
            data_file,
            f"foreign store: it belongs to shard {header.shard_id!r}, not {shard_id!r}",
        )
    if header.config_fingerprint != config.fingerprint():
        raise StoreError(
            data_file,
            f"kernel configuration differs from the one this store was folded with "
            f"(store {header.config_fingerprint}, this process {config.fingerprint()}); "
            "replaying under another configuration would change past decisions",
        )
    return header, config


def check_state(env: Env, config: KernelConfig) -> None:
    """Refuse a stored state that breaks the kernel's invariants or whose derived indexes
    disagree with its tables."""
    data_file = env.data_file
    with state_view(env, config) as state:
        try:
            assert_invariants(state)
        except InvariantViolation as exc:
            # Keys carry no checksum: a damaged key shows up here, as broken
            # structure, and is a refusal like any other damage.
            raise StoreError(
                data_file, f"the stored state breaks the kernel's invariants: {exc}"
            ) from exc
        except (ValueError, TypeError, KeyError) as exc:
            # A key so damaged that the check cannot even read it (not UTF-8, say):
            # no kernel wrote that, so it is refused the same way.
            raise StoreError(
                data_file,
                f"the stored state cannot be checked, a key is damaged: "
                f"{type(exc).__name__}: {exc}",
            ) from exc
    check_indexes(env)


def discard_state(env: Env) -> None:
    """Empty the store but for its header and its claim rows (whose sequence must never
    repeat), in one write transaction. Everything removed is derived from the log; the story
    index goes with it (its floor back to a new store's), for whatever replaces the state
    sets its own floor."""
    with lmdb_refusal(env.data_file), env.env.begin(write=True) as txn:
        for db in (*env.state_dbs().values(), env.log, env.story):
            txn.drop(db, delete=False)
        txn.put(SHARD_META_KEY, encode_value(ShardMeta()), db=env.meta)
        txn.put(LOG_INFO_KEY, encode_value(LogInfo()), db=env.meta)
        txn.delete(LOG_SOURCE_KEY, db=env.meta)
        put_story_floor(txn, env.meta, 1)


def load_rows(
    env: Env, meta: ShardMeta, rows: Iterable[tuple[Table, bytes, Value]], batch_rows: int
) -> int:
    """Put a state's rows into an empty store in write transactions of `batch_rows` (memory
    stays bounded by a batch whatever the state's size), then its meta; returns how many.
    No log was folded here to reach that state: the story index begins after it."""
    count = 0
    batch: list[tuple[Table, bytes, Value]] = []
    for row in rows:
        batch.append(row)
        if len(batch) >= batch_rows:
            count += _load_batch(env, batch)
            batch = []
    count += _load_batch(env, batch)
    with env.env.begin(write=True) as txn:
        txn.put(SHARD_META_KEY, encode_value(meta), db=env.meta)
        put_story_floor(txn, env.meta, meta.position + 1)
    return count


def _load_batch(env: Env, batch: list[tuple[Table, bytes, Value]]) -> int:
    with env.env.begin(write=True) as txn:
        put_rows(env, txn, batch)
    return len(batch)


def _new_header(
    txn: Any, env: Env, shard_id: str, config: KernelConfig, created_at_ms: int
) -> StoreHeader:
    """Write the header, meta, log info and story floor of a new store in `txn`; returns
    the header."""
    header = StoreHeader(
        schema_version=SCHEMA_VERSION,
        store_id=uuid.uuid4().hex,
        shard_id=shard_id,
        config_fingerprint=config.fingerprint(),
        created_at_ms=created_at_ms,
        config=config,
    )
    txn.put(HEADER_KEY, encode_value(header), db=env.meta)
    txn.put(SHARD_META_KEY, encode_value(ShardMeta()), db=env.meta)
    txn.put(LOG_INFO_KEY, encode_value(LogInfo()), db=env.meta)
    put_story_floor(txn, env.meta, 1)
    return header


def _current_header(txn: Any, env: Env, raw: bytes) -> StoreHeader:
    """The stored header, checked and (by a writer, in `txn`) migrated to this version."""
    header = check_schema(raw, env.data_file)
    if env.read_only and header.schema_version != SCHEMA_VERSION:
        raise StoreError(
            env.data_file,
            f"store schema version {header.schema_version} must be migrated to "
            f"{SCHEMA_VERSION} first, by opening it for writing (a service start)",
        )
    return migrate(txn, env, header)


def _holds_data(txn: Any, env: Env) -> bool:
    for db in (env.log, env.meta, *env.tables.values()):
        with txn.cursor(db=db) as cursor:
            if cursor.first():
                return True
    return False
