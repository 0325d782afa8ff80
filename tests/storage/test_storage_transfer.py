"""A shard's state exported as chunks and imported into an empty store
(`storage/transfer.py`): the copy is the state, byte for byte, and goes on folding the same
log the same way; a transfer that lost, repeated, reordered or damaged anything is refused,
never loaded as another state.

The state is a golden set's store (every record type, payloads, dead letters, open
obligations), so the transfer is shown on what the product really writes.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nereus.kernel.digest import state_digest
from nereus.storage.errors import StoreError
from nereus.storage.schema import StoreOptions
from nereus.storage.store import ShardStore
from nereus.storage.transfer import StateImport, TransferManifest, export_state
from tests.support.builders import T0_MS, schedule
from tests.support.strategies import props

GOLDEN = (
    Path(__file__).resolve().parents[1]
    / "support"
    / "golden"
    / "2026-12-commands-v1-export-v3-schema-6"
)
NO_WALK = StoreOptions(check_structure_on_open=False)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardStore]:
    path = tmp_path_factory.mktemp("source") / "store"
    shutil.copytree(GOLDEN / "store", path)
    with ShardStore.open(str(path), create=False) as store:
        yield store


def _export(store: ShardStore, max_chunk_bytes: int) -> tuple[list[bytes], TransferManifest]:
    with export_state(store, max_chunk_bytes) as export:
        chunks = list(export.chunks())
        return chunks, export.manifest()


def _target(root: Path, source: ShardStore) -> ShardStore:
    return ShardStore.open(
        str(root / "target"), shard_id=source.header.shard_id, config=source.config, options=NO_WALK
    )


def _dump(store: ShardStore) -> dict[str, list[tuple[bytes, bytes]]]:
    env = store.env
    dbs = {t.value: db for t, db in env.tables.items()}
    dbs.update(
        payload_bytes=env.payload_bytes,
        lane_timeline=env.lane_timeline,
        timer_index=env.timer_index,
    )
    with env.env.begin() as txn:
        return {name: list(txn.cursor(db=db)) for name, db in dbs.items()}


def _digest(store: ShardStore) -> str:
    with store.state_view() as state:
        return state_digest(state)


def _import(target: ShardStore, chunks: list[bytes], manifest: TransferManifest) -> None:
    into = StateImport(target)
    for chunk in chunks:
        into.add(chunk)
    into.finish(manifest)


def test_the_imported_store_is_the_exported_one_and_folds_on_alike(
    source: ShardStore, tmp_path: Path
) -> None:
    chunks, manifest = _export(source, 8 * 1024)
    assert len(chunks) == manifest.chunks > 1
    assert manifest.position == source.meta.position > 0
    with _target(tmp_path, source) as target:
        _import(target, chunks, manifest)
        assert _dump(target) == _dump(source)
        assert target.meta == source.meta
        assert (target.log_info.floor, target.log_info.snapshot_position) == (
            manifest.position + 1,
            manifest.position,
        )
        digest = _digest(source)
        assert _digest(target) == digest
    # Reopened as any store is, with the invariant and index checks of an open.
    with ShardStore.open(str(tmp_path / "target"), create=False) as reopened:
        assert _digest(reopened) == digest
        assert reopened.meta.position == manifest.position


def test_chunks_stay_within_the_bound_unless_one_row_is_larger(source: ShardStore) -> None:
    bound = 2 * 1024
    chunks, manifest = _export(source, bound)
    assert sum(len(c) for c in chunks) == manifest.bytes
    for chunk in chunks:
        _, rows = msgspec.msgpack.decode(chunk)
        assert len(chunk) <= bound + 64 or len(rows) == 1


def test_an_empty_state_is_one_chunk(tmp_path: Path) -> None:
    with ShardStore.open(str(tmp_path / "empty"), options=NO_WALK) as empty:
        chunks, manifest = _export(empty, 4096)
        assert (len(chunks), manifest.rows, manifest.position) == (1, 0, 0)


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        ("drop", "chunk 2 arrived where chunk 1 was due"),
        ("repeat", "chunk 0 arrived where chunk 1 was due"),
        ("swap", "chunk 2 arrived where chunk 1 was due"),
        ("truncate", "the manifest's chunk count is"),
        ("garbage", "chunk 1 is not a state chunk"),
    ],
)
def test_a_transfer_missing_or_out_of_order_is_refused(
    source: ShardStore, tmp_path: Path, damage: str, problem: str
) -> None:
    chunks, manifest = _export(source, 8 * 1024)
    if damage == "drop":
        del chunks[1]
    elif damage == "repeat":
        chunks.insert(1, chunks[0])
    elif damage == "swap":
        chunks[1], chunks[2] = chunks[2], chunks[1]
    elif damage == "truncate":
        del chunks[-1]
    else:
        chunks[1] = b"\x00not a chunk"
    with _target(tmp_path, source) as target:
        into = StateImport(target)
        with pytest.raises(StoreError, match=problem):
            for chunk in chunks:
                into.add(chunk)
            into.finish(manifest)
        # Refused: the store still says it is empty, and once abandoned it takes the
        # transfer whole.
        assert target.meta.position == 0 and target.source is None
        into.abandon()
        good, manifest = _export(source, 8 * 1024)
        _import(target, good, manifest)
        assert _dump(target) == _dump(source)


def test_a_changed_value_is_caught_by_the_digest(source: ShardStore, tmp_path: Path) -> None:
    chunks, manifest = _export(source, 8 * 1024)
    index, rows = msgspec.msgpack.decode(chunks[1])
    db_index, key, value = rows[0]
    rows[0] = (db_index, key, value[:-1] + bytes([value[-1] ^ 1]))
    chunks[1] = msgspec.msgpack.encode((index, rows))
    with (
        _target(tmp_path, source) as target,
        pytest.raises(StoreError, match=r"the imported state's digest \w+ differs"),
    ):
        _import(target, chunks, manifest)


def test_a_manifest_of_another_shard_or_configuration_is_refused(
    source: ShardStore, tmp_path: Path
) -> None:
    chunks, manifest = _export(source, 64 * 1024)
    other = msgspec.structs.replace(manifest, shard_id="kafka:other:0")
    with _target(tmp_path, source) as target, pytest.raises(StoreError, match="shard is"):
        _import(target, chunks, other)


def test_only_an_empty_store_takes_an_import(source: ShardStore) -> None:
    with pytest.raises(StoreError, match="only be imported into an empty store"):
        StateImport(source)


@props(40)
@given(bound=st.integers(1024, 64 * 1024), at=st.integers(0, 10**9), flip=st.integers(1, 255))
def test_a_damaged_transfer_is_refused_or_is_the_exported_state(
    source: ShardStore, tmp_path_factory: pytest.TempPathFactory, bound: int, at: int, flip: int
) -> None:
    """Never another state: one byte changed anywhere in the chunks either refuses the
    import, or (where the change decodes to the same content) yields the exported state."""
    chunks, manifest = _export(source, bound)
    which = at % len(chunks)
    damaged = bytearray(chunks[which])
    damaged[(at // len(chunks)) % len(damaged)] ^= flip
    chunks[which] = bytes(damaged)
    with _target(tmp_path_factory.mktemp("t"), source) as target:
        try:
            _import(target, chunks, manifest)
        except StoreError:
            return
        assert _dump(target) == _dump(source)


def test_the_export_is_of_its_read_snapshot_while_the_store_commits(tmp_path: Path) -> None:
    """Chunks taken while the store goes on committing are the state as it was when the
    export began, and so are the manifest's position, meta and digest."""
    path = tmp_path / "store"
    shutil.copytree(GOLDEN / "store", path)
    with ShardStore.open(str(path), create=False) as store:
        before = _dump(store)
        digest = _digest(store)
        with export_state(store, 4096) as export:
            chunks = export.chunks()
            first = next(chunks)
            store.commit([(schedule("late", delay_ms=60_000), None)], T0_MS + 10**9)
            rest = list(chunks)
            manifest = export.manifest()
        assert store.meta.position == manifest.position + 1
        with _target(tmp_path, store) as target:
            _import(target, [first, *rest], manifest)
            assert _dump(target) == before
            assert _digest(target) == digest
