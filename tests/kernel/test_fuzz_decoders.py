"""Fuzzing the decoders: random and mutated bytes never escape as anything but the refusal.

Every byte sequence Nereus reads from outside its own process goes through one of these
decoders: the log record codec (msgpack, used in LMDB and in Kafka envelopes), the framed
LMDB values, the Kafka command envelope and reply, and the JSONL export. For each, hypothesis
feeds (a) arbitrary bytes and (b) a valid encoding with bytes flipped, inserted, deleted or
truncated — the damage that happens in practice — and the test asserts the decoder either
returns a well-typed value or raises its documented refusal (`msgspec.DecodeError` for the
wire codecs, `CorruptRecord`/`StoreError` naming the file for storage). Any other exception
is a bug: it would surface as a traceback instead of a refusal that says what is wrong.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nereus import kernel as k
from nereus.adapters.kafka.wire import (
    Envelope,
    Reply,
    decode_envelope,
    decode_reply,
    encode_envelope,
)
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.model import VALUE_TYPES, Table
from nereus.kernel.records import LogEntry, decode_entry, decode_record, encode_entry, encode_record
from nereus.storage import codec
from nereus.storage.errors import StoreError
from nereus.storage.jsonl import JsonlLog, export_log
from nereus.storage.store import ShardStore
from tests.support.builders import QUEUE, T0_MS, TENANT, schedule

EXAMPLES = int(os.environ.get("NEREUS_FUZZ_EXAMPLES", "300"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SAMPLE_RECORDS: list[k.Record] = [
    schedule("k1"),
    k.Cancel(TENANT, QUEUE, "k1", txn="t"),
    k.LaneGate(TENANT, QUEUE, "CLOSED", reason="fuzz"),
    k.ShardState("PAUSED", "fuzz"),
]
SAMPLE_ENTRIES = [LogEntry(i + 1, T0_MS + i, r) for i, r in enumerate(SAMPLE_RECORDS)]


@st.composite
def mutated(draw: st.DrawFn, valid: list[bytes]) -> bytes:
    """A valid encoding damaged by up to 8 edits: bit flips, byte inserts/deletes, a cut."""
    data = bytearray(draw(st.sampled_from(valid)))
    for _ in range(draw(st.integers(1, 8))):
        kind = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        if not data:
            break
        at = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "insert":
            data.insert(at, draw(st.integers(0, 255)))
        elif kind == "delete":
            del data[at]
        else:
            del data[at:]
    return bytes(data)


def any_bytes(valid: list[bytes]) -> st.SearchStrategy[bytes]:
    return st.one_of(st.binary(max_size=512), mutated(valid))


ENTRY_BYTES = [encode_entry(e) for e in SAMPLE_ENTRIES]
RECORD_BYTES = [encode_record(r) for r in SAMPLE_RECORDS]


@FUZZ
@given(any_bytes(ENTRY_BYTES))
def test_log_entry_decoder_refuses_cleanly(data: bytes) -> None:
    try:
        entry = decode_entry(data)
    except msgspec.DecodeError:
        return
    assert isinstance(entry, LogEntry) and isinstance(entry.record, k.Record)


@FUZZ
@given(any_bytes(RECORD_BYTES))
def test_record_decoder_refuses_cleanly(data: bytes) -> None:
    try:
        record = decode_record(data)
    except msgspec.DecodeError:
        return
    assert isinstance(record, k.Record)


FRAMED_ENTRIES = [codec.encode_entry(e) for e in SAMPLE_ENTRIES]


@FUZZ
@given(any_bytes(FRAMED_ENTRIES), st.integers(1, len(SAMPLE_ENTRIES)))
def test_framed_log_entry_refuses_with_the_file_and_position(data: bytes, position: int) -> None:
    try:
        entry = codec.decode_entry(data, "/data/shard/data.mdb", position)
    except StoreError as exc:
        assert "/data/shard/data.mdb" in str(exc) and f"position {position}" in str(exc)
        return
    # Only an undamaged frame decodes, and only at the position it was written for.
    assert entry.position == position and codec.encode_entry(entry) == data


@FUZZ
@given(st.sampled_from(sorted(VALUE_TYPES, key=str)), st.binary(max_size=256))
def test_framed_table_values_refuse_with_the_table_and_key(table: Table, body: bytes) -> None:
    for data in (body, codec.frame(body)):  # a bad checksum, and a good one over junk
        try:
            value = codec.decode_value(table, data, "/d/data.mdb", b"\x01key")
        except StoreError as exc:
            assert f"table {table.value}" in str(exc) and "016b6579" in str(exc)
            continue
        assert isinstance(value, VALUE_TYPES[table])


ENVELOPES = [
    encode_envelope(Envelope("req-1", "proc-1", r, b"payload" if i == 0 else None))
    for i, r in enumerate(SAMPLE_RECORDS)
]


@FUZZ
@given(any_bytes(ENVELOPES))
def test_kafka_envelope_decoder_refuses_cleanly(data: bytes) -> None:
    try:
        envelope = decode_envelope(data)
    except msgspec.DecodeError:
        return
    assert isinstance(envelope, Envelope) and isinstance(envelope.record, k.Record)


REPLIES = [
    msgspec.msgpack.encode(
        Reply(
            "req-1",
            EntryOutcome(position=1, record_type="CANCEL_V1", applied=True, code=k.Code.ABSENT),
        )
    )
]


@FUZZ
@given(any_bytes(REPLIES))
def test_kafka_reply_decoder_refuses_cleanly(data: bytes) -> None:
    try:
        reply = decode_reply(data)
    except msgspec.DecodeError:
        return
    assert isinstance(reply, Reply)


def _export(tmp: Path) -> bytes:
    with ShardStore.open(str(tmp / "src")) as store:
        store.append([(schedule(f"k{i}"), b"payload") for i in range(5)], T0_MS)
        store.append([(k.Cancel(TENANT, QUEUE, "k1"), None)], T0_MS + 1)
        out = tmp / "log.jsonl"
        with open(out, "w", encoding="utf-8") as f:
            export_log(store, f)
    return out.read_bytes()


@settings(
    max_examples=max(EXAMPLES // 3, 20),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_a_damaged_log_export_is_refused_naming_the_file(
    tmp_path: Path, data: st.DataObject
) -> None:
    base = tmp_path / "base"
    if not base.exists():
        base.mkdir()
        (tmp_path / "valid.jsonl").write_bytes(_export(base))
    valid = (tmp_path / "valid.jsonl").read_bytes()
    damaged = data.draw(mutated([valid]))
    path = tmp_path / "damaged.jsonl"
    path.write_bytes(damaged)
    try:
        entries = list(JsonlLog(str(path)).entries())
    except StoreError as exc:
        assert str(path) in str(exc)
        return
    assert all(isinstance(e, LogEntry) for e in entries)
