"""The shard store: an embedded shard log plus the materialized state, in one LMDB env.

Theory of operation: `ShardStore` is the one owner of the store's environment and of its
in-memory positions (the applied `meta`, the log's end, its info and source); the work is
done by one module per job, each over the environment and a transaction this class opens:

* **the log** (`storage.log_table`): `append` puts records at the next dense positions,
  stamps `persisted_at_ms` from the caller's clock clamped so it never decreases, stores any
  payload bytes by digest, and commits with sync. A command is durable once its append
  returns.
* **the fold** (`storage.fold`): `apply` folds log entries through `kernel.reduce` inside
  ONE write transaction whose snapshot is also the reducer's base, then writes the overlay's
  rows, the derived indexes (`storage.indexes`), the story index's marks of the commands
  (`storage.story`), payload garbage collection and the new `ShardMeta` (which carries
  `appliedShardLogPosition`) into that same transaction and commits it with sync. Only
  then are the batch's effects returned, so the runtime can never act on state that a crash
  could take back. If the reducer raises (a broken invariant), the transaction is aborted
  and nothing of the batch is written. What a caller wants written
  beside the fold travels as one `storage.request.FoldRequest`. `commit` is the embedded
  group commit: append and fold in one transaction.
* **reads** (`storage.reads`): views over read snapshots; the runtime's claim rows go
  through their own port (`storage.claims`).
* **maintenance** (`storage.maintenance`): `open` refuses, with the file and the reason,
  anything it cannot trust: a truncated or non-LMDB file, a store of another shard, an
  unknown schema, another kernel configuration, an applied position outside the log, a
  damaged header. A writer owns the store's directory from open to close (`storage.lock`);
  a `read_only` open takes no lock and never writes (an older schema it would have to
  migrate is refused instead).

`fault_hook`, when a test sets it, is called by name between the steps of every durable
write: `append` (log entries put), `fold` (the folded rows put), `meta` (the new ShardMeta
put), all inside the write transaction, and `sync` (the transaction committed and synced,
before anything in memory moves on). A hook that kills the process there is a crash in
exactly that window (`tests/storage/test_storage_steps.py`); unset, each costs one attribute test.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

from nereus.kernel.config import KernelConfig
from nereus.kernel.model import ShardMeta, Table, Value
from nereus.kernel.records import Appendable, LogEntry
from nereus.kernel.state import State
from nereus.storage import maintenance, reads
from nereus.storage.base import StoreView
from nereus.storage.claims import ClaimRows, ClaimWriter, read_claims
from nereus.storage.codec import encode_value
from nereus.storage.env import Env
from nereus.storage.errors import lmdb_refusal
from nereus.storage.fold import Applied, fold_in
from nereus.storage.indexes import check_indexes
from nereus.storage.log_table import append_in, iter_log_in, read_positions
from nereus.storage.request import PLAIN, FoldRequest
from nereus.storage.schema import (
    LOG_INFO_KEY,
    LOG_SOURCE_KEY,
    LogInfo,
    LogSource,
    StoreHeader,
    StoreOptions,
)

__all__ = ["Applied", "FoldRequest", "ShardStore"]


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

    # Opening and maintenance (storage.maintenance) ----------------------------------------

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
        env = maintenance.open_store_env(path, options, create=create, read_only=read_only)
        try:
            with lmdb_refusal(env.data_file, "open"):
                header, config = maintenance.restore_header(
                    env,
                    shard_id=shard_id,
                    config=config,
                    create=create,
                    created_at_ms=created_at_ms,
                )
                store = cls(env, header, config, options)
                store.reload_positions()
                if options.check_invariants_on_open:
                    maintenance.check_state(env, config)
        except BaseException:
            env.close()
            raise
        return store

    def check_indexes(self) -> None:
        """Raise StoreError unless the derived indexes hold exactly what the tables imply."""
        check_indexes(self._env)

    def discard_state(self) -> None:
        """Empty the store but for its header and its claim rows, in one write transaction:
        for a store that can no longer follow its log (Kafka mode, a store behind the
        partition's start), about to be replaced by a snapshot."""
        maintenance.discard_state(self._env)
        self.source = None
        self.log_last_persisted_at_ms = 0
        self.reload_positions()

    def reload_positions(self) -> None:
        """Read the shard meta, the log info, the log source and the log's end (again,
        after something other than a commit wrote them: a state import)."""
        positions = read_positions(self._env, self.log_last_persisted_at_ms)
        self.meta = positions.meta
        self.log_info = positions.info
        if positions.source is not None:
            self.source = positions.source
        self.log_last_position = positions.last_position
        self.log_last_persisted_at_ms = positions.last_persisted_at_ms

    def load_rows(
        self, meta: ShardMeta, rows: Iterable[tuple[Table, bytes, Value]], batch_rows: int = 10_000
    ) -> int:
        """Fill an empty store with a state's rows (a snapshot being restored) and then its
        meta, in write transactions of `batch_rows`, so memory stays bounded by a batch
        whatever the state's size; the derived indexes are written beside the rows. Returns
        how many rows. The caller checks the result (its digest) before trusting it."""
        if self.meta.position != 0 or self.log_last_position != 0:
            raise ValueError("load_rows needs an empty store")
        count = maintenance.load_rows(self._env, meta, rows, batch_rows)
        self.meta = meta
        return count

    def set_log_info(self, txn: Any, info: LogInfo) -> None:
        txn.put(LOG_INFO_KEY, encode_value(info), db=self._env.meta)
        self.log_info = info

    def close(self) -> None:
        self._env.close()

    def __enter__(self) -> ShardStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # The embedded shard log (storage.log_table) -------------------------------------------

    def append(self, items: Sequence[Appendable], now_ms: int) -> list[LogEntry]:
        """Durably append records; payload bytes (for schedules) are stored by digest."""
        env = self._env
        persisted_at_ms = max(now_ms, self.log_last_persisted_at_ms)
        with env.env.begin(write=True) as txn:
            entries = append_in(
                env,
                txn,
                items,
                last_position=self.log_last_position,
                persisted_at_ms=persisted_at_ms,
            )
            self._at("append")
        self._at("sync")
        self._appended(entries)
        return entries

    def commit(
        self,
        items: Sequence[Appendable],
        now_ms: int,
        also: ClaimWriter | None = None,
        *,
        guarded: bool = False,
    ) -> tuple[list[LogEntry], list[Applied]]:
        """The embedded group commit: append `items` and fold everything not yet applied
        (them included) in ONE write transaction and one sync. `also` writes the runtime's
        claim rows into the same transaction. Effects are returned only after the commit.
        `guarded`: every item with payload bytes or a client command came through the
        runtime's guard (`runtime.guard.guarded`), which matched each payload to its
        schedule's digest (so it is not hashed again; its size still is) and replaced each
        record by the one its encoding decodes to (so a command is folded as it is, not
        decoded again; the runtime's own records still are)."""
        while self.log_last_position - self.meta.position > self.options.max_batch_entries:
            self.apply_pending()  # an old unapplied tail: fold it in bounded batches first
        env = self._env
        stamp_ms = max(now_ms, self.log_last_persisted_at_ms)
        with env.env.begin(write=True) as txn:
            # An unapplied older tail (usually none) is read back; the entries appended now
            # are folded as `append_in` decoded them from their bytes, as a replay will.
            tail = list(iter_log_in(env, txn, self.meta.position + 1, None))
            last = self.log_last_position
            entries = append_in(
                env, txn, items, last_position=last, persisted_at_ms=stamp_ms, checked=guarded
            )
            self._at("append")
            results, meta, _ = fold_in(
                env, txn, self.config, self.meta, tail + entries, log_end=last, at=self._at
            )
            if also is not None:
                also(ClaimRows(txn, env))
        self._at("sync")
        self._appended(entries)
        self.meta = meta
        return entries, results

    def _appended(self, entries: Sequence[LogEntry]) -> None:
        """Advance the in-memory log end once the transaction holding `entries` committed."""
        if entries and entries[-1].position > self.log_last_position:
            self.log_last_position = entries[-1].position
            self.log_last_persisted_at_ms = max(
                self.log_last_persisted_at_ms, entries[-1].persisted_at_ms
            )

    def iter_log(
        self, from_position: int = 1, to_position: int | None = None
    ) -> Iterator[LogEntry]:
        """Entries in order from `from_position`, read in one snapshot."""
        env = self._env
        with lmdb_refusal(env.data_file, "the shard log"), env.env.begin() as txn:
            yield from iter_log_in(env, txn, from_position, to_position)

    # Applying (storage.fold) --------------------------------------------------------------

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

    def apply(self, entries: Sequence[LogEntry], request: FoldRequest = PLAIN) -> list[Applied]:
        """Fold `entries` in one durable write transaction, with whatever `request` asks
        written beside them (`storage.request`). Entries not yet in the local log (a
        Kafka-sourced shard) are written to it in the same transaction, unless the request
        says otherwise, so the local log always covers the applied position."""
        env = self._env
        source = request.source
        with env.env.begin(write=True) as txn:
            results, meta, logged = fold_in(
                env,
                txn,
                self.config,
                self.meta,
                entries,
                log_end=self.log_last_position,
                at=self._at,
                mirror=request.mirror,
                payloads=request.payloads,
                checked=request.payloads_checked,
            )
            if source is not None:
                txn.put(LOG_SOURCE_KEY, encode_value(source), db=env.meta)
            if request.claims is not None:
                request.claims(ClaimRows(txn, env))
            if request.before_commit is not None:
                request.before_commit(results)
        self._at("sync")
        self._appended(logged)
        self.meta = meta
        if source is not None:
            self.source = source
        return results

    def _at(self, step: str) -> None:
        """The crash window after `step` (see the module docstring)."""
        if self.fault_hook is not None:
            self.fault_hook(step)

    # Reading (storage.reads, storage.claims) ----------------------------------------------

    def read(self) -> AbstractContextManager[StoreView]:
        """A consistent read view of the materialized tables (peek, scans, audits)."""
        return reads.read_view(self._env)

    def state_view(self) -> AbstractContextManager[State]:
        """The applied state as a kernel State over a read snapshot."""
        return reads.state_view(self._env, self.config)

    def folded_state(self) -> AbstractContextManager[State | None]:
        """The applied state over a read snapshot, or None while the log holds an entry it
        has not folded (`storage.reads.folded_state`)."""
        return reads.folded_state(self._env, self.config)

    def payload(self, digest: str) -> bytes | None:
        return reads.payload(self._env, digest)

    def read_claims(self) -> tuple[int, int]:
        """The runtime's claim sequence and how many claim rows are stored
        (`storage.claims`): read once at start, to drop a gone process's claims."""
        return read_claims(self._env)

    @property
    def env(self) -> Env:
        return self._env

    def file_size_bytes(self) -> int:
        return reads.file_size_bytes(self._env)

    def map_usage(self) -> float:
        """The fraction of the LMDB map in use: the "storage full" signal
        (`storage.reads.map_usage`)."""
        return reads.map_usage(self._env)
