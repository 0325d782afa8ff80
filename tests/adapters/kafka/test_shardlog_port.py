"""The pieces of the Kafka shard log that need no broker.

* The shard of an identity is a stable function of the message id (pinned values: changing
  it would move every timer of a running deployment to another shard).
* Envelopes and replies round-trip; anything else is refused by the decoder.
* `ShardStore.apply` with a `LogSource` and payload bytes writes them in the fold's
  transaction: after a reopen the store resumes from the same offset, holds the payload
  bytes, and its mirrored log equals the entries folded. `before_commit` sees the results
  inside the transaction, and an exception there writes nothing.
* The default shard log of a `ShardRuntime` is the embedded one.
* Scoped metrics add the shard label, and `drop_series` forgets a shard's series.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import msgspec
import pytest

from nereus.adapters.clock import SimulatedClock, SystemClock
from nereus.adapters.kafka.config import KafkaServiceConfig
from nereus.adapters.kafka.rpc import CommandRpc, Waiter, _outcomes
from nereus.adapters.kafka.wire import (
    Envelope,
    Reply,
    checked_payloads,
    decode_envelope,
    decode_reply,
    encode_envelope,
    encode_reply,
    shard_for,
)
from nereus.adapters.local.destination import LocalDestination
from nereus.kernel.codes import Code
from nereus.kernel.effects import EntryOutcome, outcomes_of
from nereus.kernel.records import Appendable, Cancel, CommandBatch, LogEntry, Schedule
from nereus.kernel.validation import payload_matches
from nereus.runtime.batching import command_record
from nereus.runtime.clock import read_clock
from nereus.runtime.metrics import Metrics, ScopedMetrics, drop_series
from nereus.runtime.shard import ShardRuntime
from nereus.runtime.shardlog import EmbeddedLog
from nereus.service.arguments import schedule_record
from nereus.storage.errors import StoreError
from nereus.storage.request import FoldRequest
from nereus.storage.schema import LogSource
from nereus.storage.store import ShardStore

T0_MS = 1_780_000_000_000


def test_shard_of_an_identity_is_pinned() -> None:
    assert [shard_for("default", "q", f"k{i}", 8) for i in range(8)] == [
        shard_for("default", "q", f"k{i}", 8) for i in range(8)
    ]
    # Pinned: the message id's first 8 bytes, big-endian, mod N.
    assert shard_for("default", "reminders", "trial:acme:day7", 4) == 1
    assert shard_for("default", "reminders", "trial:acme:day7", 7) == 6
    assert {shard_for("default", "q", f"k{i}", 3) for i in range(50)} == {0, 1, 2}


def test_envelopes_and_replies_round_trip() -> None:
    record, payload = schedule_record("q", "k", b"bytes", delay_ms=5, txn="t")
    assert isinstance(record, Schedule) and isinstance(payload, bytes)
    env = Envelope("r1", "proc", record, payload)
    assert decode_envelope(encode_envelope(env)) == env
    assert payload_matches(record, payload) and not payload_matches(record, b"other")
    outcome = EntryOutcome(3, "CANCEL_V1", False, Code.ABSENT, message_id="m")
    assert decode_reply(encode_reply(Reply("r1", outcome))) == Reply("r1", outcome)
    with pytest.raises(msgspec.DecodeError):
        decode_envelope(b"\x00not an envelope")
    with pytest.raises(msgspec.DecodeError):
        decode_envelope(msgspec.msgpack.encode({"request_id": "r", "reply_to": None}))


def test_apply_writes_the_source_offset_and_payloads_with_the_fold(tmp_path: Path) -> None:
    path = str(tmp_path / "shard")
    record, payload = schedule_record("q", "k", b"payload", delay_ms=1000, txn="t")
    assert payload is not None
    entries = [
        LogEntry(1, T0_MS, record),
        LogEntry(2, T0_MS + 5, Cancel("default", "q", "other")),
    ]
    seen: list[int] = []
    with ShardStore.open(path, shard_id="kafka:cmd:0") as store:
        assert store.source is None
        source = LogSource("kafka", "cmd", 0, 41)
        request = FoldRequest(
            source=source,
            payloads={1: payload},
            before_commit=lambda res: seen.extend(e.position for e, _ in res),
        )
        results = store.apply(entries, request)
        assert [e.position for e, _ in results] == seen == [1, 2]
        assert store.source == source
        with pytest.raises(RuntimeError):
            store.apply(
                [LogEntry(3, T0_MS + 6, Cancel("default", "q", "k"))],
                FoldRequest(
                    source=LogSource("kafka", "cmd", 0, 45),
                    before_commit=lambda _res: (_ for _ in ()).throw(RuntimeError("no")),
                ),
            )
    with ShardStore.open(path, shard_id="kafka:cmd:0", create=False) as store:
        assert store.source == LogSource("kafka", "cmd", 0, 41)  # the failed batch left nothing
        assert store.meta.position == 2
        assert store.payload(hashlib.sha256(payload).hexdigest()) == payload
        assert list(store.iter_log()) == entries


def test_a_store_that_follows_a_topic_refuses_an_embedded_log(tmp_path: Path) -> None:
    """The reverse of a Kafka log refusing an embedded store: a store folded from a partition
    takes no embedded appends, which would give its positions a second history."""
    path = str(tmp_path / "shard")
    record, payload = schedule_record("q", "k", b"payload", delay_ms=1000, txn="t")
    with ShardStore.open(path, shard_id="kafka:cmd:0") as store:
        store.apply(
            [LogEntry(1, T0_MS, record)],
            FoldRequest(source=LogSource("kafka", "cmd", 0, 7), payloads={1: payload}),
        )
    with ShardStore.open(path, shard_id="kafka:cmd:0", create=False) as store:
        with pytest.raises(StoreError, match=r"follows the Kafka shard log cmd\[0\]"):
            EmbeddedLog(store)
        dest = LocalDestination(str(tmp_path / "dest"))
        with pytest.raises(StoreError, match="cannot append"):
            ShardRuntime(store, dest, SystemClock(assumed_error_ms=1.0))
        dest.close()
        assert store.log_last_position == 1  # nothing was appended


def test_the_default_shard_log_is_embedded(tmp_path: Path) -> None:
    store = ShardStore.open(str(tmp_path / "shard"))
    dest = LocalDestination(str(tmp_path / "dest"))
    try:
        clock = SimulatedClock(T0_MS, error_ms=1)
        runtime = ShardRuntime(store, dest, clock)
        assert isinstance(runtime.shard_log, EmbeddedLog)
        future = runtime.submit([schedule_record("q", "k", b"x", delay_ms=0)])
        runtime.tick(read_clock(clock))
        outcome = future.result(0)[0]
        assert outcome.code is Code.SCHEDULED and store.meta.position == 1
    finally:
        dest.close()
        store.close()


def test_scoped_metrics_label_and_forget_a_shard() -> None:
    root = Metrics()
    for shard in ("0", "1"):
        scoped = ScopedMetrics(root, {"shard": shard})
        scoped.inc("c_total", labels={"type": "x"})
        scoped.set("g", 2.0)
        scoped.observe("h_seconds", 0.01)
        assert scoped.value("g") == 2.0
    assert root.value("c_total", {"type": "x", "shard": "1"}) == 1
    drop_series(ScopedMetrics(root, {"shard": "0"}), {"shard": "0"})
    text = root.render()
    assert 'shard="0"' not in text and 'shard="1"' in text


def _schedule(item: Appendable) -> Schedule:
    assert isinstance(item[0], Schedule)
    return item[0]


def test_a_calls_commands_for_one_shard_travel_as_one_record_cut_by_size(
    tmp_path: Path,
) -> None:
    rpc = CommandRpc(
        KafkaServiceConfig(bootstrap="unused:1", data_dir=str(tmp_path)), 40_000, threading.Event()
    )
    rpc._shards = 2
    items = [schedule_record("q", f"k{n}", b"x" * 10_000, txn=f"t{n}") for n in range(8)]
    groups = rpc._groups(items)
    # Each shard's commands in order, cut where the next payload would not fit the record.
    for shard in (0, 1):
        mine = [
            item
            for item in items
            if shard_for("default", "q", _schedule(item).timer_key, 2) == shard
        ]
        runs = [group for s, group in groups if s == shard]
        assert [item for run in runs for item in run] == mine
        assert all(1 <= len(run) <= 3 for run in runs)
    record, payload = command_record(next(group for _s, group in groups if len(group) > 1))
    assert isinstance(record, CommandBatch) and isinstance(payload, tuple)
    assert len(payload) == len(record.items) and all(p == b"x" * 10_000 for p in payload)
    checked, dropped = checked_payloads(record, payload)
    assert checked == payload and not dropped
    tampered = (b"y" * 10_000, *payload[1:])
    checked, dropped = checked_payloads(record, tampered)
    assert dropped and isinstance(checked, tuple) and checked[0] is None

    # Outcomes come back per record (per shard); the call's answers are in its own order.
    waiters: list[Waiter] = []
    for shard, group in groups:
        waiter = Waiter(len(group))
        waiter.shard = shard
        waiter.finish(
            [
                EntryOutcome(1, "SCHEDULE_V1", True, Code.SCHEDULED, txn=_schedule(i).txn)
                for i in group
            ],
            None,
        )
        waiters.append(waiter)
    answers = _outcomes(items, 2, waiters)
    assert [o.txn for o in answers] == [f"t{n}" for n in range(8)]
    # During a rolling upgrade every command travels alone.
    config = KafkaServiceConfig(bootstrap="unused:1", data_dir=".", command_batches=False)
    single = CommandRpc(config, 40_000, threading.Event())
    single._shards = 2
    assert [len(group) for _s, group in single._groups(items)] == [1] * len(items)
    short = Waiter(3)
    short.finish([EntryOutcome(1, "SCHEDULE_V1", True, Code.SCHEDULED)] * 2, None)
    assert short.error is not None and "2 outcomes for 3" in short.error
    # A batch refused as a whole has one outcome: its reply answers every command with it.
    refused = EntryOutcome(1, "COMMANDS_V1", False, Code.PERSISTED_AT_REGRESSED)
    batch = CommandBatch(tuple(_schedule(item) for item in items[:3]))
    whole = Waiter(3)
    whole.finish(outcomes_of(batch, (refused,)), None)
    assert whole.error is None and list(whole.outcomes) == [refused] * 3


def test_a_batch_reply_carries_every_items_outcome() -> None:
    outcomes = tuple(EntryOutcome(4, "CANCEL_V1", False, Code.ABSENT, index=n) for n in range(3))
    reply = Reply("r", outcomes[0], outcomes)
    assert decode_reply(encode_reply(reply)).answers() == outcomes
    single = Reply("r", outcomes[0])
    assert decode_reply(encode_reply(single)).answers() == (outcomes[0],)
    # A single reply is encoded exactly as before batches (no `outcomes` field).
    assert b"outcomes" not in encode_reply(single)
