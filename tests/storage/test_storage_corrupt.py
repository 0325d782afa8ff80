"""A store that cannot be trusted is refused, never silently repaired or rewritten.

Each case damages a real store on disk the way it happens in practice (a half-copied file,
a flipped byte, a header from another version, a log that lost its tail, a foreign LMDB
environment) and asserts a `StoreError` whose message names the file and the problem.
`nereus replay` on such a directory exits 2 with one line on stderr and no traceback.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import lmdb
import msgspec
import pytest

from nereus import kernel as k
from nereus.kernel.model import Table
from nereus.storage.codec import encode_value, position_key
from nereus.storage.errors import CorruptRecord, StoreError
from nereus.storage.schema import HEADER_KEY, StoreOptions
from nereus.storage.store import ShardStore
from tests.support.builders import QUEUE, T0_MS, TENANT, mid, schedule
from tests.support.lmdb_files import ask_in_child, lmdb_verdict, newest_meta, pages_past_eof

PAYLOAD = b"payload"
MIDDLE_MARKER = "middle-marker-5f1c2a"
LAST_MARKER = "last-marker-9d8e7b"
NEREUS = Path(sys.executable).parent / "nereus"


@dataclass(frozen=True)
class Built:
    path: Path
    data_file: Path
    message_row: bytes  # the framed messages row of k1
    middle_position: int
    middle_entry: bytes  # the framed log entry carrying MIDDLE_MARKER
    last_position: int
    last_entry: bytes
    header: bytes


def build(path: Path) -> Built:
    """A small real store: 40 schedules, a gate change in the middle, some cancels, and a
    final gate change as the last log entry."""
    with ShardStore.open(str(path)) as store:
        store.append([(schedule(f"k{i}"), PAYLOAD) for i in range(40)], T0_MS)
        [middle] = store.append(
            [(k.LaneGate(TENANT, QUEUE, "CLOSED", reason=MIDDLE_MARKER), None)], T0_MS + 1
        )
        store.append([(k.Cancel(TENANT, QUEUE, f"k{i}"), None) for i in range(0, 40, 3)], T0_MS + 2)
        [last] = store.append(
            [(k.LaneGate(TENANT, QUEUE, "OPEN", reason=LAST_MARKER), None)], T0_MS + 3
        )
        while store.apply_pending():
            pass
        env = store.env
        with env.env.begin() as txn:
            message_row = txn.get(mid("k1").encode(), db=env.tables[Table.MESSAGES])
            middle_entry = txn.get(position_key(middle.position), db=env.log)
            last_entry = txn.get(position_key(last.position), db=env.log)
            header = txn.get(HEADER_KEY, db=env.meta)
        assert store.meta.position == last.position
    return Built(
        path,
        path / "data.mdb",
        message_row,
        middle.position,
        middle_entry,
        last.position,
        last_entry,
        header,
    )


@pytest.fixture
def built(tmp_path: Path) -> Built:
    return build(tmp_path / "shard")


def refused(path: Path, **kwargs: object) -> StoreError:
    with pytest.raises(StoreError) as caught:
        ShardStore.open(str(path), **kwargs)  # type: ignore[arg-type]
    return caught.value


def assert_names(error: StoreError, data_file: Path, *problem: str) -> None:
    text = str(error)
    assert error.path == str(data_file)
    assert text.startswith(f"{data_file}: "), text
    for words in problem:
        assert words in text, text


def flip_value(data_file: Path, value: bytes) -> int:
    """Flip one bit in the middle of every copy of `value` in the file (LMDB may also keep
    stale copies in free pages); returns how many copies were damaged."""
    blob = bytearray(data_file.read_bytes())
    count = 0
    start = blob.find(value)
    while start >= 0:
        blob[start + len(value) // 2] ^= 0x20
        count += 1
        start = blob.find(value, start + 1)
    data_file.write_bytes(bytes(blob))
    return count


# Files that are not (complete) LMDB data files ---------------------------------------------


def test_a_truncated_data_file_is_refused(built: Built) -> None:
    size = built.data_file.stat().st_size
    with built.data_file.open("r+b") as f:
        f.truncate(size // 2)
    error = refused(built.path)
    assert_names(error, built.data_file, "truncated", f"{size // 2} bytes")


def open_and_write(path: Path) -> str:
    """What opening the store and committing one write do, asked in a forked child (a
    SIGBUS there is an answer, not the end of the test run): "refused: <message>",
    "wrote", or the name of the signal that killed it."""

    def question() -> str:
        try:
            with ShardStore.open(str(path), create=False) as store:
                store.commit([(schedule("after-the-cut"), PAYLOAD)], T0_MS + 10)
        except StoreError as exc:
            return f"refused: {exc}"
        return "wrote"

    answer = ask_in_child(question)
    return answer.signal or answer.said


@pytest.mark.parametrize("pages_cut", [1, 2])
def test_a_data_file_cut_by_its_last_pages_is_refused_before_a_write_dies(
    built: Built, pages_cut: int
) -> None:
    """The file of a store written the ordinary way holds every page its newest meta counts,
    and its last commit wrote the last ones (LMDB puts the free list's new root at the end):
    a copy that lost exactly those is one LMDB can still read but whose first write dies of
    SIGBUS, because a writer reads the free list. The open must refuse it, naming the file,
    before anything is written."""
    psize = newest_meta(built.data_file).psize
    assert pages_past_eof(built.data_file) == 0
    size = built.data_file.stat().st_size - pages_cut * psize
    with built.data_file.open("r+b") as f:
        f.truncate(size)
    assert lmdb_verdict(built.path, write=True).signal == "SIGBUS", "the cut pages are needed"
    answer = open_and_write(built.path)
    refusal = f"refused: {built.data_file}: truncated: the file is {size} bytes"
    assert answer.startswith(refusal), answer


@pytest.mark.parametrize(
    "content",
    [
        random.Random(7).randbytes(16_384),
        b"this is a text file, not a database\n" * 200,
        b"",
    ],
    ids=["random_bytes", "text", "empty"],
)
def test_a_file_that_is_not_lmdb_is_refused(tmp_path: Path, content: bytes) -> None:
    data_file = tmp_path / "data.mdb"
    data_file.write_bytes(content)
    error = refused(tmp_path)
    assert_names(error, data_file, "not an LMDB data file")
    assert data_file.read_bytes() == content, "a refused file is never rewritten"


def test_a_missing_store_is_refused_when_not_creating(tmp_path: Path) -> None:
    error = refused(tmp_path / "nowhere", create=False)
    assert "no store here" in str(error)
    assert not (tmp_path / "nowhere").exists()


# Flipped bytes inside stored values ------------------------------------------------------


def test_a_flipped_byte_in_a_table_row_is_caught_at_open(built: Built) -> None:
    assert flip_value(built.data_file, built.message_row) >= 1
    error = refused(built.path)
    assert isinstance(error, CorruptRecord)
    key = mid("k1").encode().hex()
    assert_names(error, built.data_file, "checksum", f"table messages, key {key}")


def test_a_flipped_byte_in_a_table_row_is_caught_when_read(built: Built) -> None:
    flip_value(built.data_file, built.message_row)
    options = StoreOptions(check_invariants_on_open=False)
    with ShardStore.open(str(built.path), options=options) as store:
        with store.read() as base:
            assert base.get(Table.MESSAGES, mid("k2").encode()) is not None
            with pytest.raises(CorruptRecord) as caught:
                base.get(Table.MESSAGES, mid("k1").encode())
        assert_names(caught.value, built.data_file, "checksum", "table messages")
        with store.state_view() as state, pytest.raises(CorruptRecord):
            k.state_digest(state)


def test_a_flipped_byte_in_a_log_entry_is_caught_when_the_log_is_read(built: Built) -> None:
    assert flip_value(built.data_file, built.middle_entry) >= 1
    with ShardStore.open(str(built.path)) as store:
        before = list(store.iter_log(1, built.middle_position - 1))
        assert len(before) == built.middle_position - 1
        with pytest.raises(CorruptRecord) as caught:
            list(store.iter_log())
    assert_names(
        caught.value, built.data_file, "checksum", f"shard log position {built.middle_position}"
    )


def test_a_flipped_byte_in_the_last_log_entry_is_caught_at_open(built: Built) -> None:
    assert flip_value(built.data_file, built.last_entry) >= 1
    error = refused(built.path)
    assert isinstance(error, CorruptRecord)
    assert_names(error, built.data_file, f"shard log position {built.last_position}")


def test_a_flipped_byte_in_the_header_is_caught_at_open(built: Built) -> None:
    assert flip_value(built.data_file, built.header) >= 1
    error = refused(built.path)
    assert isinstance(error, CorruptRecord)
    assert_names(error, built.data_file, "store header")


def test_a_key_damaged_beyond_reading_is_refused_at_open(built: Built) -> None:
    """Keys carry no checksum: one that is not even text (found by tests/storage/test_fuzz_store.py)
    must be refused naming the file, not raise from inside the invariant check."""
    env = lmdb.open(str(built.path), max_dbs=16)
    db = env.open_db(Table.MESSAGES.value.encode(), create=False)
    with env.begin(write=True) as txn:
        key = mid("k1").encode()
        value = txn.get(key, db=db)
        assert value is not None
        txn.delete(key, db=db)
        txn.put(b"\xe6" + key[1:], value, db=db)
    env.close()
    error = refused(built.path)
    assert_names(error, built.data_file, "a key is damaged", "UnicodeDecodeError")


# Headers that do not match ---------------------------------------------------------------


def rewrite_header(path: Path, **changes: object) -> None:
    with ShardStore.open(str(path)) as store:
        header = msgspec.structs.replace(store.header, **changes)
        with store.env.env.begin(write=True) as txn:
            txn.put(HEADER_KEY, encode_value(header), db=store.env.meta)


@pytest.mark.parametrize(
    ("version", "problem"),
    [(99, "schema version 99 was written by a newer Nereus"), (0, "no migration path")],
)
def test_an_unknown_schema_version_is_refused(built: Built, version: int, problem: str) -> None:
    rewrite_header(built.path, schema_version=version)
    assert_names(refused(built.path), built.data_file, problem)


def test_a_store_of_another_shard_is_refused(built: Built) -> None:
    assert_names(refused(built.path, shard_id="9"), built.data_file, "foreign store", "'0'")


def test_a_store_folded_under_another_kernel_configuration_is_refused(built: Built) -> None:
    other = k.KernelConfig(max_attempts=4)
    error = refused(built.path, config=other)
    assert_names(error, built.data_file, "kernel configuration differs", other.fingerprint())


def test_an_applied_position_beyond_the_log_is_refused(built: Built) -> None:
    env = lmdb.open(str(built.path), max_dbs=32)
    try:
        log = env.open_db(b"log", create=False)
        with env.begin(write=True) as txn:
            for position in (built.last_position, built.last_position - 1):
                assert txn.delete(position_key(position), db=log)
    finally:
        env.close()
    error = refused(built.path)
    assert_names(
        error,
        built.data_file,
        f"applied position {built.last_position} is beyond the end of the shard log "
        f"({built.last_position - 2})",
    )


# Foreign LMDB environments ---------------------------------------------------------------


def foreign_env(path: Path, db_name: bytes | None) -> dict[bytes, bytes]:
    """An LMDB environment some other program wrote; returns its main-database content."""
    env = lmdb.open(str(path), max_dbs=4)
    try:
        db = env.open_db(db_name) if db_name is not None else None
        with env.begin(write=True, db=db) as txn:
            txn.put(b"hello", b"world")
        with env.begin() as txn:
            return dict(txn.cursor())
    finally:
        env.close()


def main_db(path: Path) -> dict[bytes, bytes]:
    env = lmdb.open(str(path), max_dbs=4, readonly=True)
    try:
        with env.begin() as txn:
            return dict(txn.cursor())
    finally:
        env.close()


@pytest.mark.parametrize("create", [True, False])
def test_an_env_with_data_in_a_nereus_table_but_no_header_is_refused(
    tmp_path: Path, create: bool
) -> None:
    foreign_env(tmp_path, b"log")
    error = refused(tmp_path, create=create)
    assert_names(error, tmp_path / "data.mdb", "no Nereus store")


@pytest.mark.parametrize("db_name", [None, b"other"], ids=["main_db", "other_db"])
def test_a_foreign_env_with_data_elsewhere_is_refused_and_left_untouched(
    tmp_path: Path, db_name: bytes | None
) -> None:
    before = foreign_env(tmp_path, db_name)
    error = refused(tmp_path)
    assert_names(error, tmp_path / "data.mdb", "another program's LMDB environment")
    assert main_db(tmp_path) == before


def test_a_refused_open_leaves_a_foreign_env_untouched(tmp_path: Path) -> None:
    before = foreign_env(tmp_path, None)
    error = refused(tmp_path, create=False)
    assert_names(error, tmp_path / "data.mdb", "another program's LMDB environment")
    assert main_db(tmp_path) == before


# The CLI ---------------------------------------------------------------------------------


def _truncate(b: Built) -> None:
    with b.data_file.open("r+b") as f:
        f.truncate(b.data_file.stat().st_size // 2)


def _garbage(b: Built) -> None:
    b.data_file.write_bytes(random.Random(3).randbytes(8_192))


def _schema_99(b: Built) -> None:
    rewrite_header(b.path, schema_version=99)


def _flip_middle_entry(b: Built) -> None:
    flip_value(b.data_file, b.middle_entry)


def _flip_message_row(b: Built) -> None:
    flip_value(b.data_file, b.message_row)


@pytest.mark.parametrize(
    ("damage", "extra", "problem"),
    [
        (_truncate, [], "truncated"),
        (_garbage, [], "not an LMDB data file"),
        (_schema_99, [], "schema version 99"),
        (_flip_middle_entry, [], "shard log position"),
        (_flip_message_row, ["--verify"], "table messages"),
    ],
    ids=["truncated", "garbage", "schema_99", "flipped_log_entry", "flipped_row_verify"],
)
def test_nereus_replay_refuses_a_damaged_store_in_one_line(
    built: Built, damage: Callable[[Built], None], extra: list[str], problem: str
) -> None:
    assert NEREUS.exists(), f"the console script {NEREUS} is not installed"
    damage(built)
    done = subprocess.run(
        [str(NEREUS), "replay", "--data", str(built.path), *extra],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONFAULTHANDLER": ""},
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"nereus replay: refused: {built.data_file}: "), lines[0]
    assert problem in lines[0]
    assert "Traceback" not in done.stderr
