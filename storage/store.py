"""The shard store: an embedded shard log plus the materialized state, in one LMDB env.

Theory of operation:

* **Append** puts records at the next dense positions, stamps `persisted_at_ms` from the
  caller's clock clamped so it never decreases, stores any payload bytes by digest, and
  commits with sync. A command is durable once its append returns.
* **Apply** folds log entries through `kernel.reduce` inside ONE write transaction whose
  snapshot is also the reducer's base; then writes the overlay's rows, the new `ShardMeta`
  (which carries `appliedShardLogPosition`) and payload garbage collection into that same
  transaction and commits it with sync. Only then are the batch's effects returned, so the
  runtime can never act on state that a crash could take back. If the reducer raises (a
  broken invariant), the transaction is aborted and nothing of the batch is written.
* **Open** refuses, with the file and the reason, anything it cannot trust: a truncated or
  non-LMDB file, a store of another shard, an unknown schema, another kernel configuration,
  an applied position outside the log, a damaged header. A writer owns the store's
  directory from open to close (`storage.lock`); a `read_only` open takes no lock and never
  writes (an older schema it would have to migrate is refused instead).

`fault_hook`, when a test sets it, is called by name between the steps of every durable
write: `append` (log entries put), `fold` (the folded rows put), `meta` (the new ShardMeta
put), all inside the write transaction, and `sync` (the transaction committed and synced,
before anything in memory moves on). A hook that kills the process there is a crash in
exactly that window (`tests/test_storage_steps.py`); unset, each costs one attribute test.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Final

from nereus.kernel.config import KernelConfig
from nereus.kernel.effects import Effect
from nereus.kernel.invariants import InvariantViolation, assert_invariants
from nereus.kernel.model import LIVE_STATUSES, Message, ShardMeta, Table, TimelineWork, Value
from nereus.kernel.records import (
    COMMAND_TYPES,
    Appendable,
    CommandBatch,
    LogEntry,
    Payload,
    Record,
    Schedule,
)
from nereus.kernel.reducer import reduce
from nereus.kernel.state import State
from nereus.storage.base import LmdbBase, StoreView
from nereus.storage.codec import (
    decode_entry,
    decode_struct,
    decode_value,
    encode_entry,
    encode_row,
    encode_value,
    key_position,
    lane_index_key,
    position_key,
    timer_index_key,
)
from nereus.storage.env import Env, open_env
from nereus.storage.errors import StoreError, lmdb_refusal
from nereus.storage.schema import (
    HEADER_KEY,
    LOG_INFO_KEY,
    LOG_SOURCE_KEY,
    SCHEMA_VERSION,
    SHARD_META_KEY,
    LogInfo,
    LogSource,
    PayloadBlob,
    StoreHeader,
    StoreOptions,
    check_schema,
    migrate,
)

Applied = tuple[LogEntry, tuple[Effect, ...]]
MAX_KEY_BYTES = 511  # LMDB's default compile-time key size limit
# The records a guarded commit folds as they are (`commit(guarded=True)`).
_GUARDED_TYPES = (*COMMAND_TYPES, CommandBatch)


# Tables the write path compares against on every row, as module globals: an Enum class
# attribute goes through EnumType.__getattr__ on Python 3.11 (see kernel/step.py).
_TIMELINE: Final = Table.TIMELINE
_MESSAGES: Final = Table.MESSAGES
_PAYLOADS: Final = Table.PAYLOADS


class ShardStore:
    def __init__(
        self, env: Env, header: StoreHeader, config: KernelConfig, options: StoreOptions
    ) -> None:
        self._env = env
        self.header = header
        self.config = config
        self.options = options
        self.path = env.path
        self.meta = ShardMeta()
        self.log_info = LogInfo()
        self.source: LogSource | None = None
        self.log_last_position = 0
        self.log_last_persisted_at_ms = 0
        self.fault_hook: Callable[[str], None] | None = None

    # Opening ------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str,
        *,
        shard_id: str | None = None,
        config: KernelConfig | None = None,
        options: StoreOptions | None = None,
        create: bool = True,
        created_at_ms: int = 0,
        read_only: bool = False,
    ) -> ShardStore:
        """`shard_id` None accepts whichever shard the store belongs to (audit tools); a
        new store without one is shard "0". A writer owns the store's directory until
        `close` (a second writer, here or in another process, is refused with
        `storage.lock.StoreLocked`); `read_only` (with create=False) takes no lock, reads
        beside a running writer and refuses every write."""
        options = options or StoreOptions()
        env = open_env(
            path,
            map_size_bytes=options.map_size_bytes,
            sync=options.sync,
            create=create,
            check_structure=options.check_structure_on_open,
            read_only=read_only,
        )
        try:
            with lmdb_refusal(env.data_file, "open"):
                store = cls._restore(
                    env,
                    shard_id=shard_id,
                    config=config,
                    options=options,
                    create=create,
                    created_at_ms=created_at_ms,
                )
        except BaseException:
            env.close()
            raise
        return store

    @classmethod
    def _restore(
        cls,
        env: Env,
        *,
        shard_id: str | None,
        config: KernelConfig | None,
        options: StoreOptions,
        create: bool,
        created_at_ms: int,
    ) -> ShardStore:
        """`config` None means: use the configuration recorded in the store (or the
        default for a new one)."""
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
        store = cls(env, header, config, options)
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
        store._load_positions()
        if options.check_invariants_on_open:
            with store.state_view() as state:
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
            store.check_indexes()
        return store

    def check_indexes(self) -> None:
        """Raise StoreError unless the derived indexes (lane timeline, timer index) hold
        exactly what the tables imply. O(timeline + messages): an audit, run at open."""
        env = self._env
        with env.env.begin() as txn:
            base = LmdbBase(txn, env.tables, env.data_file)
            lanes = {
                lane_index_key(work.tenant, work.queue, key): b""
                for key, work in base.items(Table.TIMELINE)
                if isinstance(work, TimelineWork)
            }
            timers = {
                timer_index_key(m.tenant, m.queue, m.timer_key): m.message_id.encode()
                for _key, m in base.items(Table.MESSAGES)
                if isinstance(m, Message) and m.status in LIVE_STATUSES
            }
            indexed: list[dict[bytes, bytes]] = []
            for db in (env.lane_timeline, env.timer_index):
                with txn.cursor(db=db) as cursor:
                    indexed.append(dict(cursor.iternext()))
        for name, expected, found in (
            ("lane timeline index", lanes, indexed[0]),
            ("timer index", timers, indexed[1]),
        ):
            if expected == found:
                continue
            key, problem = min(
                (key, "a stray row" if key not in expected else
                 "a missing row" if key not in found else "a row naming another message")
                for key in expected.keys() | found.keys()
                if expected.get(key) != found.get(key)
            )  # fmt: skip
            raise StoreError(
                env.data_file,
                f"the {name} disagrees with the tables ({problem}): it is derived data every "
                "fold writes in the same transaction, so something else changed the store",
                f"{name}, key {key.hex()}",
            )

    def discard_state(self) -> None:
        """Empty the store but for its header and its claim rows (whose sequence must never
        repeat), in one write transaction: for a store that can no longer follow its log
        (Kafka mode, a store behind the partition's start), about to be replaced by a
        snapshot. Everything removed is derived from the log."""
        env = self._env
        with lmdb_refusal(env.data_file), env.env.begin(write=True) as txn:
            for db in (*env.state_dbs().values(), env.log):
                txn.drop(db, delete=False)
            txn.put(SHARD_META_KEY, encode_value(ShardMeta()), db=env.meta)
            txn.put(LOG_INFO_KEY, encode_value(LogInfo()), db=env.meta)
            txn.delete(LOG_SOURCE_KEY, db=env.meta)
        self.source = None
        self.log_last_persisted_at_ms = 0
        self._load_positions()

    def reload_positions(self) -> None:
        """Read the shard meta, the log info and the log source again, after something other
        than a commit wrote them (a state import)."""
        self._load_positions()

    def _load_positions(self) -> None:
        data_file = self._env.data_file
        with self._env.env.begin() as txn:
            self.meta = decode_struct(
                ShardMeta,
                _must(txn.get(SHARD_META_KEY, db=self._env.meta), data_file, "meta"),
                data_file,
                "shard meta",
            )
            self.log_info = decode_struct(
                LogInfo,
                _must(txn.get(LOG_INFO_KEY, db=self._env.meta), data_file, "log info"),
                data_file,
                "log info",
            )
            raw_source = txn.get(LOG_SOURCE_KEY, db=self._env.meta)
            if raw_source is not None:
                self.source = decode_struct(LogSource, raw_source, data_file, "log source")
            with txn.cursor(db=self._env.log) as cursor:
                if cursor.last():
                    position = key_position(cursor.key())
                    entry = decode_entry(cursor.value(), data_file, position)
                    self.log_last_position = position
                    self.log_last_persisted_at_ms = entry.persisted_at_ms
                else:
                    self.log_last_position = self.log_info.floor - 1
        # The clamp must survive a log compacted down to nothing.
        self.log_last_persisted_at_ms = max(
            self.log_last_persisted_at_ms, self.meta.last_persisted_at_ms
        )
        applied = self.meta.position
        if applied > self.log_last_position:
            raise StoreError(
                data_file,
                f"applied position {applied} is beyond the end of the shard log "
                f"({self.log_last_position}): the log was truncated or replaced",
            )
        if applied < self.log_info.snapshot_position:
            raise StoreError(
                data_file,
                f"applied position {applied} is below the snapshot the log was compacted "
                f"behind ({self.log_info.snapshot_position})",
            )

    def close(self) -> None:
        self._env.close()

    def __enter__(self) -> ShardStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # The embedded shard log ---------------------------------------------------------------

    def append(self, items: Sequence[Appendable], now_ms: int) -> list[LogEntry]:
        """Durably append records; payload bytes (for schedules) are stored by digest."""
        with self._env.env.begin(write=True) as txn:
            entries = self._append_in(txn, items, now_ms)
            self._at("append")
        self._at("sync")
        self._appended(entries)
        return entries

    def commit(
        self,
        items: Sequence[Appendable],
        now_ms: int,
        also: Callable[[Any], None] | None = None,
        *,
        guarded: bool = False,
    ) -> tuple[list[LogEntry], list[Applied]]:
        """The embedded group commit: append `items` and fold everything not yet applied
        (them included) in ONE write transaction and one sync. `also` may write runtime rows
        (claims) into the same transaction. Effects are returned only after the commit.
        `guarded`: every item with payload bytes or a client command came through the
        runtime's guard (`runtime.guard.guarded`), which matched each payload to its
        schedule's digest (so it is not hashed again; its size still is) and replaced each
        record by the one its encoding decodes to (so a command is folded as it is, not
        decoded again; the runtime's own records still are)."""
        while self.log_last_position - self.meta.position > self.options.max_batch_entries:
            self.apply_pending()  # an old unapplied tail: fold it in bounded batches first
        env = self._env
        with env.env.begin(write=True) as txn:
            # An unapplied older tail (usually none) is read back; the entries appended now
            # are folded as `_append_in` decoded them from their bytes, as a replay will.
            tail = list(self._iter_log_in(txn, self.meta.position + 1, None))
            entries = self._append_in(txn, items, now_ms, guarded)
            self._at("append")
            results, meta, _ = self._apply_in(txn, tail + entries)
            if also is not None:
                also(txn)
        self._at("sync")
        self._appended(entries)
        self.meta = meta
        return entries, results

    def _append_in(
        self, txn: Any, items: Sequence[Appendable], now_ms: int, checked: bool = False
    ) -> list[LogEntry]:
        entries: list[LogEntry] = []
        persisted_at_ms = max(now_ms, self.log_last_persisted_at_ms)
        position = self.log_last_position
        for record, payload in items:
            position += 1
            entry = LogEntry(position, persisted_at_ms, record)
            self._store_payloads(txn, record, payload, position, checked)
            blob = encode_entry(entry)
            txn.put(position_key(position), blob, db=self._env.log)
            if checked and isinstance(record, _GUARDED_TYPES):
                entries.append(entry)
            else:
                entries.append(decode_entry(blob, self._env.data_file, position))
        return entries

    def _appended(self, entries: Sequence[LogEntry]) -> None:
        """Advance the in-memory log end once the transaction holding `entries` committed."""
        if entries and entries[-1].position > self.log_last_position:
            self.log_last_position = entries[-1].position
            self.log_last_persisted_at_ms = max(
                self.log_last_persisted_at_ms, entries[-1].persisted_at_ms
            )

    def _store_payloads(
        self, txn: Any, record: Record, payload: Payload, position: int, checked: bool
    ) -> None:
        """Store the bytes of each schedule `record` holds (itself, or a batch's items)."""
        if isinstance(record, CommandBatch):
            if payload is None:
                payload = (None,) * len(record.items)
            if not isinstance(payload, tuple) or len(payload) != len(record.items):
                raise ValueError("a batch of commands carries one payload (or None) per item")
            for item, item_payload in zip(record.items, payload, strict=True):
                self._store_payloads(txn, item, item_payload, position, checked)
        elif isinstance(payload, tuple):
            raise ValueError(f"{type(record).__name__} is not a batch: one payload or None")
        elif isinstance(record, Schedule):
            self._store_payload(txn, record, payload, position, checked)
        elif payload is not None:
            raise ValueError(f"{type(record).__name__} carries no payload")

    def _store_payload(
        self, txn: Any, record: Schedule, payload: bytes | None, position: int, checked: bool
    ) -> None:
        key = record.payload_digest.encode()
        if payload is not None:
            # A SHA-256 is ~9k instructions even for a small payload (OpenSSL 3's EVP path).
            if not checked and hashlib.sha256(payload).hexdigest() != record.payload_digest:
                raise ValueError("payload bytes do not match the schedule's payload_digest")
            if len(payload) != record.payload_size:
                raise ValueError("payload size does not match the schedule's payload_size")
        existing = txn.get(key, None, self._env.payload_bytes)
        if existing is not None:
            blob = decode_struct(
                PayloadBlob, existing, self._env.data_file, f"payload {record.payload_digest}"
            )
            data = blob.data
        elif payload is not None:
            data = payload
        else:
            # A schedule whose bytes are not here still gets logged: the kernel validates
            # the reference, and a claim proves the bytes missing (CLAIM_RESULT_V1).
            return
        txn.put(key, encode_value(PayloadBlob(position, data)), db=self._env.payload_bytes)

    def iter_log(
        self, from_position: int = 1, to_position: int | None = None
    ) -> Iterator[LogEntry]:
        """Entries in order from `from_position`, read in one snapshot."""
        with lmdb_refusal(self._env.data_file, "the shard log"), self._env.env.begin() as txn:
            yield from self._iter_log_in(txn, from_position, to_position)

    def _iter_log_in(
        self, txn: Any, from_position: int, to_position: int | None
    ) -> Iterator[LogEntry]:
        data_file = self._env.data_file
        with txn.cursor(db=self._env.log) as cursor:
            if not cursor.set_range(position_key(max(from_position, 1))):
                return
            for key, value in cursor:
                position = key_position(key)
                if to_position is not None and position > to_position:
                    return
                yield decode_entry(value, data_file, position)

    # Applying -----------------------------------------------------------------------------

    def apply_pending(self, max_entries: int | None = None) -> list[Applied]:
        """Fold the next unapplied log entries (at most the batch bound) in one durable
        write transaction; returns each entry with its effects once committed."""
        limit = self.options.max_batch_entries
        if max_entries is not None:
            limit = min(limit, max_entries)
        start = self.meta.position + 1
        entries = list(self.iter_log(start, start + limit - 1))
        if not entries:
            return []
        return self.apply(entries)

    def apply(
        self,
        entries: Sequence[LogEntry],
        *,
        also: Callable[[Any], None] | None = None,
        source: LogSource | None = None,
        payloads: Mapping[int, Payload] | None = None,
        before_commit: Callable[[list[Applied]], None] | None = None,
        mirror: bool = True,
        payloads_checked: bool = False,
    ) -> list[Applied]:
        """Fold `entries` in one durable write transaction. Entries not yet in the local log
        (a Kafka-sourced shard) are written to it in the same transaction, so the local log
        always covers the applied position. A Kafka-sourced shard also passes `source` (the
        offset of the last record folded, written in the same transaction) and the payload
        bytes its schedules carried, by position (checked by the caller against the
        schedule's digest and size); `also` writes runtime rows (claims) in the same
        transaction, as in `commit`. `before_commit` sees the fold's results while the
        transaction is still open (if it raises, nothing of the batch is written). A scratch
        store that only materializes state (a disk-backed replay) passes `mirror=False`: its
        log stays empty."""
        env = self._env
        with env.env.begin(write=True) as txn:
            results, meta, logged = self._apply_in(
                txn, entries, mirror=mirror, payloads=payloads, checked=payloads_checked
            )
            if source is not None:
                txn.put(LOG_SOURCE_KEY, encode_value(source), db=env.meta)
            if also is not None:
                also(txn)
            if before_commit is not None:
                before_commit(results)
        self._at("sync")
        self._appended(logged)
        self.meta = meta
        if source is not None:
            self.source = source
        return results

    def _apply_in(
        self,
        txn: Any,
        entries: Sequence[LogEntry],
        *,
        mirror: bool = False,
        payloads: Mapping[int, Payload] | None = None,
        checked: bool = False,
    ) -> tuple[list[Applied], ShardMeta, list[LogEntry]]:
        """Fold entries into the transaction. With `mirror`, entries that extend the local
        log densely are written to it (with the payload bytes of their schedules, if given),
        and an entry that would fold something other than what the log holds at a
        not-yet-applied position is refused. Misplaced entries (duplicates of applied
        positions, gaps) are not logged: the reducer rejects them without consuming a
        position, and so must the log."""
        env = self._env
        results: list[Applied] = []
        logged: list[LogEntry] = []
        log_end = self.log_last_position
        state = State(self.config, self.meta, LmdbBase(txn, env.tables, env.data_file))
        for entry in entries:
            if mirror:
                if entry.position == log_end + 1:
                    txn.put(position_key(entry.position), encode_entry(entry), db=env.log)
                    if payloads is not None:
                        self._store_payloads(
                            txn, entry.record, payloads.get(entry.position), entry.position, checked
                        )
                    logged.append(entry)
                    log_end += 1
                elif state.meta.position < entry.position <= log_end:
                    self._check_matches_log(txn, entry)
            state, effects = reduce(state, entry)
            results.append((entry, effects))
        released = self._write_changes(txn, state)
        self._collect_payloads(txn, released, entries, state.meta.position)
        self._at("fold")
        txn.put(SHARD_META_KEY, encode_value(state.meta), db=env.meta)
        self._at("meta")
        return results, state.meta, logged

    def load_rows(
        self, meta: ShardMeta, rows: Iterable[tuple[Table, bytes, Value]], batch_rows: int = 10_000
    ) -> int:
        """Fill an empty store with a state's rows (a snapshot being restored) and then its
        meta, in write transactions of `batch_rows`, so memory stays bounded by a batch
        whatever the state's size; the derived indexes are written beside the rows. Returns
        how many rows. The caller checks the result (its digest) before trusting it."""
        if self.meta.position != 0 or self.log_last_position != 0:
            raise ValueError("load_rows needs an empty store")
        env = self._env
        count = 0
        batch: list[tuple[Table, bytes, Value]] = []
        for row in rows:
            batch.append(row)
            if len(batch) >= batch_rows:
                count += self._load_batch(batch)
                batch = []
        count += self._load_batch(batch)
        with env.env.begin(write=True) as txn:
            txn.put(SHARD_META_KEY, encode_value(meta), db=env.meta)
        self.meta = meta
        return count

    def _load_batch(self, batch: Sequence[tuple[Table, bytes, Value]]) -> int:
        env = self._env
        with env.env.begin(write=True) as txn:
            for table, key, value in batch:
                if table is Table.TIMELINE:
                    self._index_lane(txn, key, value)
                elif table is Table.MESSAGES:
                    self._index_timer(txn, key, value)
                txn.put(key, encode_row(table, value), db=env.tables[table])
        return len(batch)

    def _at(self, step: str) -> None:
        """The crash window after `step` (see the module docstring)."""
        if self.fault_hook is not None:
            self.fault_hook(step)

    def _check_matches_log(self, txn: Any, entry: LogEntry) -> None:
        stored = txn.get(position_key(entry.position), db=self._env.log)
        if stored is not None and stored != encode_entry(entry):
            raise StoreError(
                self._env.data_file,
                "an entry differs from the one the shard log holds at its position",
                f"shard log position {entry.position}",
            )

    def _write_changes(self, txn: Any, state: State) -> set[bytes]:
        """Writes the overlay; returns the payload digests whose reference row was deleted."""
        released: set[bytes] = set()
        tables = self._env.tables
        # A cursor's put takes no keyword arguments: half the cost of `txn.put(..., db=)`.
        cursors: dict[Table, Any] = {}
        for table, key, value in state.changes():
            if table is _TIMELINE:
                self._index_lane(txn, key, value)
            elif table is _MESSAGES:
                self._index_timer(txn, key, value)
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

    def _index_lane(self, txn: Any, key: bytes, value: Value | None) -> None:
        """Keep the per-lane timeline index in step with the timeline (derived data, so a
        scheduler can find each lane's head without walking other lanes' work)."""
        env = self._env
        if value is None:
            raw = txn.get(key, None, env.tables[_TIMELINE])
            if raw is None:
                return
            old = decode_value(_TIMELINE, raw, env.data_file, key)
            assert isinstance(old, TimelineWork)
            txn.delete(lane_index_key(old.tenant, old.queue, key), db=env.lane_timeline)
        else:
            assert isinstance(value, TimelineWork)
            txn.put(lane_index_key(value.tenant, value.queue, key), b"", db=env.lane_timeline)

    def _index_timer(self, txn: Any, key: bytes, value: Value | None) -> None:
        """Keep the timer index in step with the messages table (derived data: a queue's
        live timers in timer-key order, for listing without walking other queues)."""
        env = self._env
        if value is None:
            raw = txn.get(key, None, env.tables[_MESSAGES])
            if raw is None:
                return
            value = decode_value(_MESSAGES, raw, env.data_file, key)
            assert isinstance(value, Message)
            txn.delete(
                timer_index_key(value.tenant, value.queue, value.timer_key), db=env.timer_index
            )
            return
        assert isinstance(value, Message)
        index_key = timer_index_key(value.tenant, value.queue, value.timer_key)
        if value.status in LIVE_STATUSES:
            # A live timer changing state keeps its entry: rewriting it would still copy
            # and sync its page.
            if txn.get(index_key, None, env.timer_index) != key:
                txn.put(index_key, key, db=env.timer_index)
        else:
            txn.delete(index_key, db=env.timer_index)

    def _collect_payloads(
        self, txn: Any, released: set[bytes], entries: Sequence[LogEntry], applied: int
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
        env = self._env
        for key in candidates:
            if txn.get(key, None, env.tables[_PAYLOADS]) is not None:
                continue
            raw = txn.get(key, None, env.payload_bytes)
            if raw is None:
                continue
            blob = decode_struct(PayloadBlob, raw, env.data_file, f"payload {key.decode()}")
            if blob.last_ref_position <= applied:
                txn.delete(key, db=env.payload_bytes)

    # Reading ------------------------------------------------------------------------------

    @contextmanager
    def read(self) -> Iterator[StoreView]:
        """A consistent read view of the materialized tables (peek, scans, audits)."""
        with lmdb_refusal(self._env.data_file), self._env.env.begin() as txn:
            yield StoreView(txn, self._env)

    @contextmanager
    def state_view(self) -> Iterator[State]:
        """The applied state as a kernel State over a read snapshot."""
        with lmdb_refusal(self._env.data_file), self._env.env.begin() as txn:
            meta = decode_struct(
                ShardMeta,
                txn.get(SHARD_META_KEY, db=self._env.meta),
                self._env.data_file,
                "shard meta",
            )
            yield State(self.config, meta, LmdbBase(txn, self._env.tables, self._env.data_file))

    def payload(self, digest: str) -> bytes | None:
        with self._env.env.begin() as txn:
            raw = txn.get(digest.encode(), db=self._env.payload_bytes)
        if raw is None:
            return None
        return decode_struct(PayloadBlob, raw, self._env.data_file, f"payload {digest}").data

    @property
    def env(self) -> Env:
        return self._env

    def file_size_bytes(self) -> int:
        return os.path.getsize(self._env.data_file)

    def map_usage(self) -> float:
        """The fraction of the LMDB map in use (highest page in use times the page size,
        over the map size): the "storage full" signal. Pages freed inside the file are
        reused before the map grows, so this is a high-water mark, not live data."""
        env = self._env.env
        info = env.info()
        used = (int(info["last_pgno"]) + 1) * int(env.stat()["psize"])
        return used / int(info["map_size"])

    def set_log_info(self, txn: Any, info: LogInfo) -> None:
        txn.put(LOG_INFO_KEY, encode_value(info), db=self._env.meta)
        self.log_info = info


def _new_header(
    txn: Any, env: Env, shard_id: str, config: KernelConfig, created_at_ms: int
) -> StoreHeader:
    """Write the header, meta and log info of a new store in `txn`; returns the header."""
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


def _must(raw: bytes | None, path: str, what: str) -> bytes:
    if raw is None:
        raise StoreError(path, f"store header present but {what} is missing")
    return raw


def _holds_data(txn: Any, env: Env) -> bool:
    for db in (env.log, env.meta, *env.tables.values()):
        with txn.cursor(db=db) as cursor:
            if cursor.first():
                return True
    return False
