"""The record catalogue on the wire: every record type round-trips through msgpack and JSON,
and the decoder's only answers to bad input are `msgspec.DecodeError` (malformed bytes) and
its subclass `msgspec.ValidationError` (well-formed bytes that are not an entry)."""

from __future__ import annotations

import random
import re
import typing
from typing import Any

import msgspec
import pytest

from nereus import kernel as k
from nereus.kernel.records import (
    decode_record,
    encode_record,
    entry_from_json,
    entry_to_json,
    record_type,
)
from nereus.kernel.reducer import HANDLERS
from tests.support.builders import DIGEST, T0_MS, interval_at, mid, not_published, published

AID = f"{mid()}.1.1"
FULL_SCHEDULE = k.Schedule(
    "acme",
    "q",
    "k/é",
    "txn-2",
    DIGEST,
    0,
    deliver_at_ms=T0_MS,
    expire_at_ms=T0_MS + 5_000,
    partition_key="p",
    headers=(("h1", "v1"), ("h2", "")),
    destination="orders",
    capability=k.Capability("delayed_handoff", 500, 200),
    expected_version=3,
    producer_sub="svc",
    encrypted=True,
)
ADMISSION = k.PublishAdmission(
    mid(),
    1,
    2,
    AID,
    "claim-1",
    "node-a",
    "d" * 16,
    k.Capability(),
    interval_at(T0_MS),
    k.Capacity(True, lane_permits=3, bytes_reserved=1_024),
)
ADMISSION_2 = msgspec.structs.replace(
    ADMISSION,
    message_id=mid("k2"),
    attempt_id=f"{mid('k2')}.1.1",
    capability=k.Capability("delayed_handoff", 500, 200),
)
PUBLISHED = k.PublishOutcome(AID, mid(), 1, published(42))
NOT_PUBLISHED = k.PublishOutcome(AID, mid(), 1, not_published("permanent", "e"))
GATE = k.LaneGate("acme", "q", "CLOSED", "maintenance")

# (expected tag, record). Optional fields are set away from their defaults where a record
# has them, so a field the codec dropped would show.
SAMPLES: tuple[tuple[str, k.Record], ...] = (
    ("SCHEDULE_V1", k.Schedule("acme", "q", "k1", "txn-1", DIGEST, 7, delay_ms=1_000)),
    ("SCHEDULE_V1", FULL_SCHEDULE),
    ("RESCHEDULE_V1", k.Reschedule("acme", "q", "k1", "txn-r", lifetime_ms=9_000, delay_ms=5)),
    ("RESCHEDULE_V1", k.Reschedule("acme", "q", "k1", "t", deliver_at_ms=-1, expire_at_ms=0)),
    ("CANCEL_V1", k.Cancel("acme", "q", "k1")),
    ("CANCEL_V1", k.Cancel("acme", "q", "k1", expected_version=2, txn="txn-c")),
    ("PUBLISH_ADMISSION_V1", ADMISSION),
    ("PUBLISH_OUTCOME_V1", PUBLISHED),
    ("PUBLISH_OUTCOME_V1", NOT_PUBLISHED),
    ("PUBLISH_OUTCOME_V1", k.PublishOutcome(AID, mid(), 1, k.Unknown("timeout", "no ack"))),
    ("CLAIM_RESULT_V1", k.ClaimResult(mid(), 1, 1, "claim-1", "payload_missing", "gone")),
    ("EXPIRE_V1", k.Expire(mid(), 1, 1, k.TrustedInterval(-(2**62), 2**62))),
    ("LANE_GATE_V1", GATE),
    ("SHARD_STATE_V1", k.ShardState("FROZEN", "restore")),
    ("SHARD_STATE_V1", k.ShardState("ACTIVE_FOR_COMMANDS")),
    (
        "DEAD_LETTER_WRITTEN_V1",
        k.DeadLetterWritten(mid(), 3, k.Evidence("q.dlq", 2, 17, T0_MS + 9)),
    ),
    ("PUBLISH_ADMISSIONS_V1", k.batched([ADMISSION, ADMISSION_2])),
    ("PUBLISH_ADMISSIONS_V1", k.PublishAdmissions("node-a", interval_at(T0_MS), (), "tx-1")),
    ("PUBLISH_OUTCOMES_V1", k.batched([PUBLISHED, NOT_PUBLISHED])),
    ("PUBLISH_OUTCOMES_V1", k.PublishOutcomes(())),
    (
        "COMMANDS_V1",
        k.batched(
            [
                FULL_SCHEDULE,
                k.Reschedule("acme", "q", "k1", "txn-r", delay_ms=5),
                k.Cancel("acme", "q", "k1", expected_version=2, txn="txn-c"),
            ]
        ),
    ),
    ("COMMANDS_V1", k.CommandBatch(())),
)


def _entry(record: k.Record, position: int = 7) -> k.LogEntry:
    return k.LogEntry(position, T0_MS, record)


def _ids(samples: tuple[tuple[str, k.Record], ...]) -> list[str]:
    return [f"{tag}-{i}" for i, (tag, _) in enumerate(samples)]


def test_every_record_type_has_a_sample() -> None:
    assert {type(r) for _, r in SAMPLES} == set(typing.get_args(k.Record))


def test_the_reducer_dispatches_every_record_type_and_nothing_else() -> None:
    assert set(HANDLERS) == set(typing.get_args(k.Record))


def test_every_publish_result_has_a_sample() -> None:
    results = {type(r.result) for _, r in SAMPLES if isinstance(r, k.PublishOutcome)}
    assert results == {k.Published, k.NotPublished, k.Unknown}


@pytest.mark.parametrize(("tag", "record"), SAMPLES, ids=_ids(SAMPLES))
def test_msgpack_round_trip(tag: str, record: k.Record) -> None:
    entry = _entry(record)
    decoded = k.decode_entry(k.encode_entry(entry))
    assert decoded == entry
    assert type(decoded.record) is type(record)
    assert decode_record(encode_record(record)) == record


@pytest.mark.parametrize(("tag", "record"), SAMPLES, ids=_ids(SAMPLES))
def test_json_round_trip(tag: str, record: k.Record) -> None:
    entry = _entry(record)
    data = entry_to_json(entry)
    decoded = entry_from_json(data)
    assert decoded == entry
    assert type(decoded.record) is type(record)
    assert entry_from_json(data.decode()) == entry
    assert msgspec.json.decode(data)["record"]["type"] == tag


@pytest.mark.parametrize(("tag", "record"), SAMPLES, ids=_ids(SAMPLES))
def test_record_type_is_the_versioned_tag(tag: str, record: k.Record) -> None:
    assert record_type(record) == tag
    assert msgspec.msgpack.decode(encode_record(record))["type"] == tag


def test_tags_are_distinct_and_versioned() -> None:
    tags = [typ.__struct_config__.tag for typ in typing.get_args(k.Record)]
    assert len(set(tags)) == len(tags)
    assert all(isinstance(tag, str) and re.fullmatch(r"[A-Z_]+_V[1-9][0-9]*", tag) for tag in tags)


# Rejections -------------------------------------------------------------------------------


def _doc(record: k.Record) -> dict[str, Any]:
    doc: dict[str, Any] = msgspec.to_builtins(_entry(record))
    return doc


GOOD, OUTCOME, ADMITTED = _doc(FULL_SCHEDULE), _doc(PUBLISHED), _doc(ADMISSION)


def _with(base: dict[str, Any], path: tuple[str, ...], value: object) -> bytes:
    """`base` as msgpack with the field at `path` set to `value`, or deleted if it is `...`."""
    doc = msgspec.msgpack.decode(msgspec.msgpack.encode(base))  # a deep copy
    node = doc
    for key in path[:-1]:
        node = node[key]
    if value is ...:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return msgspec.msgpack.encode(doc)


VALID = k.encode_entry(_entry(FULL_SCHEDULE))
DE, VE = msgspec.DecodeError, msgspec.ValidationError

REJECTED: tuple[tuple[str, bytes, type[msgspec.DecodeError]], ...] = (
    ("empty input", b"", DE),
    ("reserved msgpack opcode", b"\xc1", DE),
    ("truncated entry", VALID[:-1], DE),
    ("trailing bytes", VALID + b"\x00", DE),
    ("random garbage", bytes(range(7, 40)), DE),
    ("not a map", msgspec.msgpack.encode(42), VE),
    ("a list", msgspec.msgpack.encode([1, 2, 3]), VE),
    ("record not a map", _with(GOOD, ("record",), "SCHEDULE_V1"), VE),
    ("unknown tag", _with(GOOD, ("record", "type"), "SCHEDULE_V9"), VE),
    ("tag of another layer", _with(OUTCOME, ("record", "type"), "PUBLISHED"), VE),
    ("missing tag", _with(GOOD, ("record", "type"), ...), VE),
    ("tag not a string", _with(GOOD, ("record", "type"), 1), VE),
    ("unknown result tag", _with(OUTCOME, ("record", "result", "result"), "LOST"), VE),
    ("unknown field in record", _with(GOOD, ("record", "priority"), 1), VE),
    ("unknown field in entry", _with(GOOD, ("shard",), 1), VE),
    ("unknown field in capability", _with(GOOD, ("record", "capability", "x"), 1), VE),
    ("unknown field in evidence", _with(OUTCOME, ("record", "result", "evidence", "x"), 1), VE),
    ("missing required field", _with(GOOD, ("record", "txn"), ...), VE),
    ("missing position", _with(GOOD, ("position",), ...), VE),
    ("missing record", _with(GOOD, ("record",), ...), VE),
    ("position as a string", _with(GOOD, ("position",), "1"), VE),
    ("position as a bool", _with(GOOD, ("position",), True), VE),
    ("persisted_at as a float", _with(GOOD, ("persisted_at_ms",), 1.5), VE),
    ("payload_size as a string", _with(GOOD, ("record", "payload_size"), "7"), VE),
    ("txn as bytes", _with(GOOD, ("record", "txn"), b"txn"), VE),
    ("header not a pair", _with(GOOD, ("record", "headers"), [["h"]]), VE),
    ("header value not a string", _with(GOOD, ("record", "headers"), [["h", 1]]), VE),
    (
        "capability kind outside the literal",
        _with(GOOD, ("record", "capability", "kind"), "teleport"),
        VE,
    ),
    ("encrypted as an int", _with(GOOD, ("record", "encrypted"), 1), VE),
    ("gate outside the literal", _with(_doc(GATE), ("record", "gate"), "AJAR"), VE),
    ("empty trusted interval", _with(ADMITTED, ("record", "interval", "earliest_ms"), 2**62), VE),
    (
        "disposition outside the literal",
        _with(_doc(NOT_PUBLISHED), ("record", "result", "disposition"), "maybe"),
        VE,
    ),
)


@pytest.mark.parametrize(
    ("data", "error"), [(d, e) for _, d, e in REJECTED], ids=[name for name, _, _ in REJECTED]
)
def test_decode_entry_rejects(data: bytes, error: type[msgspec.DecodeError]) -> None:
    with pytest.raises(error):
        k.decode_entry(data)


@pytest.mark.parametrize(
    "text", ["", "{", "[]", '{"position": 1}', '{"position":1,"persisted_at_ms":1,"record":{}}']
)
def test_entry_from_json_rejects(text: str) -> None:
    with pytest.raises(msgspec.DecodeError):
        entry_from_json(text)


def test_mutated_bytes_decode_or_raise_a_decode_error_and_nothing_else() -> None:
    # The h11 fuzzer's rule: parse it or raise the protocol error. Every truncation and a
    # fixed-seed sample of byte flips of each sample entry; a success must be a LogEntry.
    rng = random.Random(20_240_601)
    decoded = rejected = 0
    for _, record in SAMPLES:
        data = k.encode_entry(_entry(record))
        candidates = [data[:n] for n in range(len(data))]
        for _ in range(60):
            flipped = bytearray(data)
            for _ in range(rng.randint(1, 3)):
                flipped[rng.randrange(len(flipped))] = rng.randrange(256)
            candidates.append(bytes(flipped))
        for candidate in candidates:
            try:
                entry = k.decode_entry(candidate)
            except msgspec.DecodeError:
                rejected += 1
            else:
                assert isinstance(entry, k.LogEntry)
                decoded += 1
    assert rejected > 0 and decoded > 0
