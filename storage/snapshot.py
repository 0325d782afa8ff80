"""Snapshots and log compaction behind them (the Recovery Floor).

Theory of operation: a snapshot is every table row plus the `ShardMeta` at one applied
position, read in one LMDB snapshot and written to a file atomically (temp file, fsync,
rename). The log below a floor may then be deleted, but only if (a) a snapshot at or above
`floor - 1` exists and matches this store, and (b) no open obligation was admitted below the
floor: the Admission entry is the evidence an auditor needs for an attempt that may be at the
destination. Replay of snapshot + remaining log must equal replay of the whole log.

File format: a sequence of frames, each `u32 length (big-endian) + crc32 + msgpack`; the
first frame is a `SnapshotHeader`, then one `(table, key, value msgpack)` triple per row.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

import msgspec

from nereus.kernel.config import KernelConfig
from nereus.kernel.digest import state_digest
from nereus.kernel.model import TABLES, VALUE_TYPES, Obligation, ShardMeta, Table, Value
from nereus.storage import files
from nereus.storage.codec import frame, position_key, unframe
from nereus.storage.errors import StoreError
from nereus.storage.memory import MemoryStore
from nereus.storage.schema import LogInfo
from nereus.storage.store import ShardStore

SNAPSHOT_FORMAT = "nereus-snapshot"
# 2: the usage table (store schema 2); 3: the dead-letter table (3); 4: attempts carry their
# fence id (4); 5: evidence may carry the destination's own message id (Pulsar). Versions 3
# and 4 still load: their attempts were admitted unfenced (3), and no evidence of theirs has
# such an id.
SNAPSHOT_VERSION = 5
READABLE_SNAPSHOT_VERSIONS = frozenset({3, 4, 5})


class SnapshotHeader(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    format: str
    version: int
    store_id: str
    shard_id: str
    config_fingerprint: str
    position: int
    digest: str
    meta: ShardMeta


def snapshot_path(store: ShardStore, position: int) -> str:
    return os.path.join(store.path, "snapshots", f"snapshot-{position:016d}.bin")


def write_snapshot(store: ShardStore) -> tuple[str, SnapshotHeader]:
    with store.state_view() as state:
        header = SnapshotHeader(
            format=SNAPSHOT_FORMAT,
            version=SNAPSHOT_VERSION,
            store_id=store.header.store_id,
            shard_id=store.header.shard_id,
            config_fingerprint=store.header.config_fingerprint,
            position=state.meta.position,
            digest=state_digest(state),
            meta=state.meta,
        )
        path = snapshot_path(store, header.position)
        files.make_dirs(os.path.dirname(path))
        tmp = path + ".tmp"
        # A crash's leftover would keep its own mode through the rewrite: start afresh.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        with open(tmp, "wb", opener=files.opener) as f:
            _write_frame(f, msgspec.msgpack.encode(header))
            for table in TABLES:
                for key, value in state.items(table):
                    _write_frame(f, msgspec.msgpack.encode((table.value, key, value)))
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path))
    return path, header


def read_snapshot_header(path: str) -> SnapshotHeader:
    with open(path, "rb") as f:
        first = next(_read_frames(f, path), None)
    if first is None:
        raise StoreError(path, "empty snapshot file")
    try:
        return msgspec.msgpack.decode(first, type=SnapshotHeader)
    except msgspec.MsgspecError as exc:
        raise StoreError(path, f"not a Nereus snapshot: {exc}") from exc


@contextmanager
def snapshot_rows(
    path: str, config: KernelConfig
) -> Iterator[tuple[SnapshotHeader, Iterator[tuple[Table, bytes, Value]]]]:
    """A snapshot's header and its rows, read one frame at a time (every frame checked as it
    is read), so a state larger than memory can be restored. The digest is the caller's to
    check, over what it built from the rows."""
    row_decoder = msgspec.msgpack.Decoder(tuple[str, bytes, msgspec.Raw])
    decoders = {t: msgspec.msgpack.Decoder(VALUE_TYPES[t]) for t in TABLES}
    with open(path, "rb") as f:
        frames = _read_frames(f, path)
        first = next(frames, None)
        if first is None:
            raise StoreError(path, "empty snapshot file")
        try:
            header = msgspec.msgpack.decode(first, type=SnapshotHeader)
        except msgspec.MsgspecError as exc:
            raise StoreError(path, f"not a Nereus snapshot: {exc}") from exc
        if header.format != SNAPSHOT_FORMAT or header.version not in READABLE_SNAPSHOT_VERSIONS:
            raise StoreError(path, f"unsupported snapshot {header.format} v{header.version}")
        if header.config_fingerprint != config.fingerprint():
            raise StoreError(path, "snapshot was taken under another kernel configuration")

        def rows() -> Iterator[tuple[Table, bytes, Value]]:
            for index, body in enumerate(frames, start=1):
                try:
                    table_name, key, raw = row_decoder.decode(body)
                    table = Table(table_name)
                    yield table, key, decoders[table].decode(raw)
                except (ValueError, msgspec.MsgspecError) as exc:
                    raise StoreError(path, f"bad row: {exc}", f"frame {index}") from exc

        yield header, rows()


def read_snapshot(path: str, config: KernelConfig) -> tuple[SnapshotHeader, MemoryStore]:
    """Load a snapshot into memory, verifying every frame and the state digest."""
    tables: dict[Table, dict[bytes, Value]] = {t: {} for t in TABLES}
    with snapshot_rows(path, config) as (header, rows):
        for table, key, value in rows:
            tables[table][key] = value
    store = MemoryStore(config, meta=header.meta, tables=tables)
    if state_digest(store.state) != header.digest:
        raise StoreError(path, "snapshot content does not match its recorded digest")
    return header, store


def load_snapshot(path: str, store: ShardStore) -> SnapshotHeader:
    """Restore a snapshot into an empty LMDB store in bounded memory (`ShardStore.load_rows`)
    and check the result against the snapshot's recorded digest."""
    with snapshot_rows(path, store.config) as (header, rows):
        store.load_rows(header.meta, rows)
    with store.state_view() as state:
        if state_digest(state) != header.digest:
            raise StoreError(path, "snapshot content does not match its recorded digest")
    return header


def compact_log(store: ShardStore, floor: int) -> int:
    """Delete log entries below `floor`; returns how many. Refuses unless a matching
    snapshot covers `floor - 1` and no open obligation was admitted below `floor`."""
    data_file = store.env.data_file
    if floor <= store.log_info.floor:
        return 0
    if floor - 1 > store.meta.position:
        raise StoreError(data_file, f"floor {floor} is above the applied position + 1")
    snap = _covering_snapshot(store, floor - 1)
    if snap is None:
        raise StoreError(data_file, f"no snapshot at or above position {floor - 1}")
    with store.read() as base:
        for _key, value in base.items(Table.OBLIGATIONS):
            assert isinstance(value, Obligation)
            if value.admitted_position < floor:
                raise StoreError(
                    data_file,
                    f"open obligation admitted at position {value.admitted_position} "
                    f"needs the log from there; floor {floor} refused",
                )
    env = store.env
    stop = position_key(floor)
    with env.env.begin(write=True) as txn:
        with txn.cursor(db=env.log) as cursor:
            doomed = [key for key in cursor.iternext(values=False) if key < stop]
        for key in doomed:
            txn.delete(key, db=env.log)
        store.set_log_info(txn, LogInfo(floor=floor, snapshot_position=snap))
    return len(doomed)


def _covering_snapshot(store: ShardStore, position: int) -> int | None:
    folder = os.path.join(store.path, "snapshots")
    if not os.path.isdir(folder):
        return None
    best: int | None = None
    for name in os.listdir(folder):
        if not (name.startswith("snapshot-") and name.endswith(".bin")):
            continue
        pos = int(name[len("snapshot-") : -len(".bin")])
        if pos >= position and (best is None or pos < best):
            header = read_snapshot_header(os.path.join(folder, name))
            if header.store_id == store.header.store_id:
                best = pos
    return best


def latest_snapshot(store: ShardStore) -> str | None:
    if store.log_info.snapshot_position == 0:
        return None
    return snapshot_path(store, store.log_info.snapshot_position)


def _write_frame(f: BinaryIO, body: bytes) -> None:
    framed = frame(body)
    f.write(len(framed).to_bytes(4, "big"))
    f.write(framed)


def _read_frames(f: BinaryIO, path: str) -> Iterator[bytes]:
    index = 0
    while True:
        head = f.read(4)
        if not head:
            return
        if len(head) < 4:
            raise StoreError(path, "truncated frame header", f"frame {index}")
        length = int.from_bytes(head, "big")
        data = f.read(length)
        if len(data) < length:
            raise StoreError(path, "truncated frame", f"frame {index}")
        yield unframe(data, path, f"frame {index}")
        index += 1


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
