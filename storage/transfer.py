"""A shard's state as a stream of chunks, to ship it to another machine and load it there
into an empty store (Kafka mode's snapshots, `specs/kafka.md`).

Theory of operation: the export walks one LMDB read snapshot and copies, as stored, every
row of every table, the payload bytes and the two derived indexes. The import appends them
to the same sub-databases of an empty store, so the receiving store holds byte-identical
rows: nothing is decoded or encoded again on either side, and a restore costs a cursor walk
and an append per row. Every value keeps its own checksum (`storage/codec.py`), checked
when the row is first read.

The whole transfer has a digest: SHA-256 over every (sub-database, key, value) in order,
each length-prefixed, then the shard meta. The export computes it as it writes the chunks;
the import computes it again by reading back what it wrote, so a chunk lost, repeated,
reordered or damaged on the way, or a write that did not land, refuses the restore before
the store is used. Chunks are numbered and must arrive in order.

The restored store's log starts after the covered position (`LogInfo.floor`): the entries
before it are in the log the state was exported from, not here. So does its story index
(the story floor): the story is the log's history, not state, and is not transferred.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

import msgspec

from nereus.kernel.config import KernelConfig
from nereus.kernel.model import ShardMeta
from nereus.storage.codec import decode_struct, encode_value
from nereus.storage.errors import StoreError
from nereus.storage.schema import (
    LOG_SOURCE_KEY,
    SCHEMA_VERSION,
    SHARD_META_KEY,
    LogInfo,
    LogSource,
    put_story_floor,
)
from nereus.storage.store import ShardStore

TRANSFER_FORMAT: Final = "nereus-state-transfer"
TRANSFER_VERSION: Final = 1
# Under Kafka's default 1 MiB record limit with room for the record's own framing.
DEFAULT_CHUNK_BYTES: Final = 900 * 1024
# What a row costs in a chunk beyond its key and value (msgpack array and length headers).
_ROW_OVERHEAD_BYTES: Final = 16


class TransferManifest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What the importer checks the chunks against. `position` is the applied shard log
    position the state is at, `source` the log it was folded from (in Kafka mode, the last
    offset folded)."""

    format: str
    version: int
    schema_version: int
    shard_id: str
    config_fingerprint: str
    # The kernel configuration itself, so an auditor can fold on from the state unaided.
    config: KernelConfig
    position: int
    meta: ShardMeta
    source: LogSource | None
    chunks: int
    rows: int
    bytes: int
    digest: str


_Chunk = tuple[int, list[tuple[int, bytes, bytes]]]
_chunk_decoder = msgspec.msgpack.Decoder(tuple[int, list[tuple[int, bytes, bytes]]])


def _dbs(store: ShardStore) -> list[Any]:
    """The sub-databases a transfer copies, in the order it copies them."""
    return list(store.env.state_dbs().values())


def _feed(h: Any, data: bytes) -> None:
    h.update(len(data).to_bytes(8, "big"))
    h.update(data)


def _feed_row(h: Any, db_index: int, key: bytes, value: bytes) -> None:
    h.update(db_index.to_bytes(2, "big"))
    _feed(h, key)
    _feed(h, value)


def _finish_digest(h: Any, meta: ShardMeta) -> str:
    _feed(h, encode_value(meta))
    digest: str = h.hexdigest()
    return digest


class StateExport:
    """The chunks of one read snapshot; `manifest()` once they have all been taken."""

    def __init__(self, store: ShardStore, txn: Any, max_chunk_bytes: int) -> None:
        if max_chunk_bytes < 1024:
            raise ValueError(f"max_chunk_bytes must be at least 1024, not {max_chunk_bytes}")
        self._store = store
        self._txn = txn
        self._max = max_chunk_bytes
        # From the read snapshot itself: the store may commit while the chunks are taken.
        env = store.env
        raw_meta = txn.get(SHARD_META_KEY, db=env.meta)
        raw_source = txn.get(LOG_SOURCE_KEY, db=env.meta)
        if raw_meta is None:
            raise StoreError(env.data_file, "store header present but meta is missing")
        self._meta = decode_struct(ShardMeta, raw_meta, env.data_file, "shard meta")
        self._source = (
            None
            if raw_source is None
            else decode_struct(LogSource, raw_source, env.data_file, "log source")
        )
        self._hash = hashlib.sha256()
        self._chunks = self._rows = self._bytes = 0
        self._done = False

    @property
    def source(self) -> LogSource | None:
        """The log the exported state was folded from, as of the read snapshot."""
        return self._source

    def chunks(self) -> Iterator[bytes]:
        pending: list[tuple[int, bytes, bytes]] = []
        size = 0
        for db_index, db in enumerate(_dbs(self._store)):
            with self._txn.cursor(db=db) as cursor:
                for key, value in cursor:
                    row = len(key) + len(value) + _ROW_OVERHEAD_BYTES
                    if pending and size + row > self._max:
                        yield self._chunk(pending)
                        pending, size = [], 0
                    pending.append((db_index, key, value))
                    size += row
                    _feed_row(self._hash, db_index, key, value)
        if pending or self._chunks == 0:
            yield self._chunk(pending)
        self._done = True

    def _chunk(self, rows: list[tuple[int, bytes, bytes]]) -> bytes:
        data = msgspec.msgpack.encode((self._chunks, rows))
        self._chunks += 1
        self._rows += len(rows)
        self._bytes += len(data)
        return data

    def manifest(self) -> TransferManifest:
        if not self._done:
            raise RuntimeError("the manifest is known once every chunk has been taken")
        header = self._store.header
        return TransferManifest(
            format=TRANSFER_FORMAT,
            version=TRANSFER_VERSION,
            schema_version=header.schema_version,
            shard_id=header.shard_id,
            config_fingerprint=header.config_fingerprint,
            config=self._store.config,
            position=self._meta.position,
            meta=self._meta,
            source=self._source,
            chunks=self._chunks,
            rows=self._rows,
            bytes=self._bytes,
            digest=_finish_digest(self._hash.copy(), self._meta),
        )


@contextmanager
def export_state(
    store: ShardStore, max_chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Iterator[StateExport]:
    """An export of the store's applied state as it is now. The read snapshot is held until
    the block ends, so the store may go on committing meanwhile."""
    with store.env.env.begin() as txn:
        yield StateExport(store, txn, max_chunk_bytes)


class StateImport:
    """Loads chunks, in order, into an empty store; `finish` checks them and only then
    writes the meta that makes the store the exported one. Until then the store's meta still
    says it is empty; `abandon` removes what a refused import wrote."""

    def __init__(self, store: ShardStore) -> None:
        if store.meta.position != 0 or store.log_last_position != 0:
            raise StoreError(
                store.env.data_file, "a state can only be imported into an empty store"
            )
        self._store = store
        self._dbs = _dbs(store)
        self._next = 0
        self._rows = 0

    def _refuse(self, problem: str) -> StoreError:
        return StoreError(self._store.env.data_file, f"state import refused: {problem}")

    def add(self, chunk: bytes) -> None:
        try:
            index, rows = _chunk_decoder.decode(chunk)
        except msgspec.MsgspecError as exc:
            raise self._refuse(f"chunk {self._next} is not a state chunk: {exc}") from exc
        if index != self._next:
            raise self._refuse(f"chunk {index} arrived where chunk {self._next} was due")
        with self._store.env.env.begin(write=True) as txn:
            for db_index, key, value in rows:
                if not 0 <= db_index < len(self._dbs):
                    raise self._refuse(f"chunk {index} names sub-database {db_index}")
                # Appended: the export walks each sub-database in key order, so a key that
                # does not sort after the last one came out of order or twice.
                if not txn.put(key, value, db=self._dbs[db_index], append=True):
                    name = list(self._store.env.state_dbs())[db_index]
                    raise self._refuse(
                        f"chunk {index} holds a key of {name} out of order or twice ({key.hex()})"
                    )
        self._next += 1
        self._rows += len(rows)

    def finish(self, manifest: TransferManifest) -> None:
        """Check the chunks against `manifest` (counts, identity, and the digest of what was
        written, read back), then write the meta that makes the store the exported one."""
        store = self._store
        header = store.header
        for what, theirs, ours in (
            ("format", manifest.format, TRANSFER_FORMAT),
            ("version", manifest.version, TRANSFER_VERSION),
            ("store schema", manifest.schema_version, SCHEMA_VERSION),
            ("shard", manifest.shard_id, header.shard_id),
            ("kernel configuration", manifest.config_fingerprint, header.config_fingerprint),
            ("chunk count", manifest.chunks, self._next),
            ("row count", manifest.rows, self._rows),
            ("position", manifest.position, manifest.meta.position),
            (
                "configuration's fingerprint",
                manifest.config.fingerprint(),
                header.config_fingerprint,
            ),
        ):
            if theirs != ours:
                raise self._refuse(f"the manifest's {what} is {theirs!r}, here {ours!r}")
        env = store.env
        with env.env.begin() as txn:
            h = hashlib.sha256()
            for db_index, db in enumerate(self._dbs):
                with txn.cursor(db=db) as cursor:
                    for key, value in cursor:
                        _feed_row(h, db_index, key, value)
            digest = _finish_digest(h, manifest.meta)
        if digest != manifest.digest:
            raise self._refuse(
                f"the imported state's digest {digest} differs from the manifest's "
                f"{manifest.digest}"
            )
        with env.env.begin(write=True) as txn:
            txn.put(SHARD_META_KEY, encode_value(manifest.meta), db=env.meta)
            if manifest.source is not None:
                txn.put(LOG_SOURCE_KEY, encode_value(manifest.source), db=env.meta)
            store.set_log_info(
                txn, LogInfo(floor=manifest.position + 1, snapshot_position=manifest.position)
            )
            put_story_floor(txn, env.meta, manifest.position + 1)
        store.reload_positions()

    def abandon(self) -> None:
        """Empty what the chunks wrote, leaving the store as empty as it was: an import that
        was refused can then be tried again, from this or another snapshot."""
        with self._store.env.env.begin(write=True) as txn:
            for db in self._dbs:
                txn.drop(db, delete=False)
        self._next = self._rows = 0
