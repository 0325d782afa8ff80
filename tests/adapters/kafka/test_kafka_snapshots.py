"""Shard snapshots through a real Kafka broker (`adapters/kafka/snapshots.py`): a state
written as chunk records and a manifest comes back whole into an empty store elsewhere; a
fenced producer publishes no manifest; a snapshot whose chunks were deleted is refused with
the offsets, never restored in part.

The state is a golden set's store (every record type, payloads, dead letters, open
obligations), its source rewritten to name the test's commands topic, as a Kafka owner's
store would.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from nereus.adapters.cli.main import main as nereus_cli
from nereus.adapters.clock import SystemClock
from nereus.adapters.kafka.config import KafkaServiceConfig
from nereus.adapters.kafka.log import KafkaLog, KafkaLogConfig
from nereus.adapters.kafka.service import KafkaService
from nereus.adapters.kafka.snapshots import (
    SnapshotManifest,
    latest_manifest,
    manifests_topic,
    publish_snapshot,
    restore_snapshot,
    snapshots_topic,
)
from nereus.adapters.kafka.topics import check_retention
from nereus.kernel.digest import state_digest
from nereus.kernel.model import Obligation, Table
from nereus.service.arguments import schedule_record
from nereus.storage.codec import encode_value
from nereus.storage.errors import StoreError
from nereus.storage.schema import LOG_SOURCE_KEY, LogSource, StoreOptions
from nereus.storage.store import ShardStore
from nereus.storage.transfer import TransferManifest, export_state
from tests.storage.test_storage_store import admission_for
from tests.support import kafka_env
from tests.support.builders import T0_MS, schedule
from tests.support.kafka_cluster import Topics, service_config, wait_until
from tests.support.kafka_env import create_topic, unique_topic

kafka_bootstrap = kafka_env.kafka_bootstrap

GOLDEN = (
    Path(__file__).resolve().parents[2]
    / "support"
    / "golden"
    / "2026-12-commands-v1-export-v3-schema-6"
)
COVERED_OFFSET = 4_321


@pytest.fixture
def topic(kafka_bootstrap: str) -> str:
    commands = unique_topic("snap")
    create_topic(kafka_bootstrap, snapshots_topic(commands), partitions=2)
    create_topic(
        kafka_bootstrap,
        manifests_topic(commands),
        partitions=2,
        config={"cleanup.policy": "compact"},
    )
    return commands


@pytest.fixture
def source(tmp_path: Path, topic: str) -> Iterator[ShardStore]:
    path = tmp_path / "source"
    shutil.copytree(GOLDEN / "store", path)
    with ShardStore.open(str(path), create=False) as store:
        env = store.env
        with env.env.begin(write=True) as txn:
            txn.put(
                LOG_SOURCE_KEY,
                encode_value(LogSource("kafka", topic, 1, COVERED_OFFSET)),
                db=env.meta,
            )
        store.reload_positions()
        yield store


def _producer(bootstrap: str, transactional_id: str) -> Producer:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 1}
    )
    producer.init_transactions(30)
    return producer


def _digest(store: ShardStore) -> str:
    with store.state_view() as state:
        return state_digest(state)


def _empty(tmp_path: Path, like: ShardStore, name: str = "restored") -> ShardStore:
    return ShardStore.open(
        str(tmp_path / name),
        shard_id=like.header.shard_id,
        config=like.config,
        options=StoreOptions(check_structure_on_open=False),
    )


def test_a_snapshot_written_through_kafka_restores_into_an_empty_store(
    kafka_bootstrap: str, topic: str, source: ShardStore, tmp_path: Path
) -> None:
    producer = _producer(kafka_bootstrap, f"nereus-test-{uuid.uuid4().hex}")
    written = publish_snapshot(
        source, producer, topic, 1, chunk_bytes=4096, bytes_per_transaction=16 * 1024
    )
    assert written.covered_offset == COVERED_OFFSET
    assert written.transfer.chunks > 4  # several transactions of several chunks
    settings = {"bootstrap.servers": kafka_bootstrap}
    assert latest_manifest(settings, topic, 0) is None  # another shard's partition
    found = latest_manifest(settings, topic, 1)
    assert found == written
    with _empty(tmp_path, source) as restored:
        restore_snapshot(restored, settings, found)
        assert restored.meta == source.meta
        assert restored.source == LogSource("kafka", topic, 1, COVERED_OFFSET)
        assert _digest(restored) == _digest(source)
        # The restored store folds on from the position after the snapshot's.
        assert restored.log_last_position == restored.meta.position == written.transfer.position


def test_the_newest_manifest_is_the_one_restored(
    kafka_bootstrap: str, topic: str, source: ShardStore, tmp_path: Path
) -> None:
    producer = _producer(kafka_bootstrap, f"nereus-test-{uuid.uuid4().hex}")
    settings = {"bootstrap.servers": kafka_bootstrap}
    first = publish_snapshot(source, producer, topic, 1, chunk_bytes=64 * 1024)
    second = publish_snapshot(source, producer, topic, 1, chunk_bytes=64 * 1024)
    assert second.first_chunk_offset > first.last_chunk_offset
    assert latest_manifest(settings, topic, 1) == second


def test_a_fenced_producer_publishes_no_snapshot(
    kafka_bootstrap: str, topic: str, source: ShardStore
) -> None:
    """A zombie: its transactional id was taken by a new owner. Its chunks abort with its
    transaction and no manifest of it is ever read."""
    transactional_id = f"nereus-test-{uuid.uuid4().hex}"
    zombie = _producer(kafka_bootstrap, transactional_id)
    _producer(kafka_bootstrap, transactional_id)  # the new owner fences it
    with pytest.raises(KafkaException):
        publish_snapshot(source, zombie, topic, 1, chunk_bytes=4096)
    assert latest_manifest({"bootstrap.servers": kafka_bootstrap}, topic, 1) is None


def test_a_snapshot_whose_chunks_were_deleted_is_refused_with_the_offsets(
    kafka_bootstrap: str, topic: str, source: ShardStore, tmp_path: Path
) -> None:
    producer = _producer(kafka_bootstrap, f"nereus-test-{uuid.uuid4().hex}")
    written = publish_snapshot(source, producer, topic, 1, chunk_bytes=4096)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    cut = TopicPartition(snapshots_topic(topic), 1, written.first_chunk_offset + 2)
    for future in admin.delete_records([cut]).values():
        future.result(30)
    problem = (
        rf"snapshot {written.snapshot_id} starts at .*offset {written.first_chunk_offset}, "
        rf"but the partition now starts at {written.first_chunk_offset + 2}"
    )
    with _empty(tmp_path, source) as restored, pytest.raises(StoreError, match=problem):
        restore_snapshot(restored, {"bootstrap.servers": kafka_bootstrap}, written)


# A new owner without a store -----------------------------------------------------------------


def _service(
    bootstrap: str, data: Path, topics: Topics, snapshot_interval_ms: int = 0
) -> KafkaService:
    config = service_config(
        bootstrap,
        topics,
        data,
        snapshot_interval_ms=snapshot_interval_ms,
        snapshot_bytes_per_tick=16 * 1024,
    )
    return KafkaService(
        config,
        clock=SystemClock(assumed_error_ms=2),
    )


def _schedule(service: KafkaService, topics: Topics, keys: list[str], delay_ms: int) -> None:
    items = [
        schedule_record(topics.queue, key, f"p-{key}".encode(), delay_ms=delay_ms, txn=key)
        for key in keys
    ]
    assert [o.code for o in service.execute(items, 30)] == ["scheduled"] * len(keys)


def _restored(bootstrap: str, data: Path, topics: Topics, position: int) -> KafkaService:
    """A new owner started on an empty data directory, its shard restored from the snapshot
    at `position` and active."""
    service = _service(bootstrap, data, topics)
    try:
        service.start()
        wait_until(lambda: service.shard_states() == {0: "active"}, 60, "the shard active")
        restored = service.owned_store(0)
        assert restored is not None and restored.log_info.snapshot_position == position
    except BaseException:
        service.close()
        raise
    return service


def _messages(path: Path) -> dict[bytes, object]:
    with ShardStore.open(str(path), create=False) as store, store.read() as view:
        return dict(view.items(Table.MESSAGES))


def _delete_commands_before(bootstrap: str, topic: str, offset: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, offset)]).values():
        future.result(30)


def test_a_new_owner_restores_the_snapshot_and_folds_only_the_tail(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Owner A folds 40 schedules and its state is published as a snapshot; the commands
    before it are deleted, so folding from offset 0 is impossible. Owner B, with no store,
    restores the snapshot, folds the commands after it, and serves all of them: the old
    timers are still pending with their payloads, the new ones fire."""
    topics = Topics.unique(create_topic(kafka_bootstrap, unique_topic("dest")))
    old = [f"old{i}" for i in range(40)]
    a = _service(kafka_bootstrap, tmp_path / "a", topics)
    try:
        a.start()
        wait_until(lambda: a.shard_states() == {0: "active"}, 30, "A's shard active")
        _schedule(a, topics, old, 3_600_000)
    finally:
        a.close()
    with ShardStore.open(str(tmp_path / "a" / "shard-0"), create=False) as store:
        producer = _producer(kafka_bootstrap, f"nereus-test-{uuid.uuid4().hex}")
        manifest = publish_snapshot(store, producer, topics.commands, 0, chunk_bytes=8192)
    assert manifest.covered_offset >= 0
    _delete_commands_before(kafka_bootstrap, topics.commands, manifest.covered_offset + 1)
    b = _restored(kafka_bootstrap, tmp_path / "b", topics, manifest.transfer.position)
    try:
        for key in old[:5]:
            peek = b.peek(topics.queue, key)
            assert peek.status == "SCHEDULED" and peek.payload is not None
        new = [f"new{i}" for i in range(5)]
        _schedule(b, topics, new, 200)
        wait_until(
            lambda: all(b.peek(topics.queue, k).status == "DELIVERED" for k in new),
            30,
            "the tail's timers DELIVERED",
        )
    finally:
        b.close()
    with ShardStore.open(str(tmp_path / "b" / "shard-0"), create=False) as store:
        assert store.log_info.snapshot_position == manifest.transfer.position
        assert store.meta.position > manifest.transfer.position
        first = next(store.iter_log(manifest.transfer.position + 1))
        assert first.position == manifest.transfer.position + 1


def test_without_a_snapshot_a_deleted_log_start_halts_the_shard_naming_the_offsets(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topics = Topics.unique(create_topic(kafka_bootstrap, unique_topic("dest")))
    a = _service(kafka_bootstrap, tmp_path / "a", topics)
    try:
        a.start()
        wait_until(lambda: a.shard_states() == {0: "active"}, 30, "A's shard active")
        _schedule(a, topics, ["k1", "k2"], 3_600_000)
    finally:
        a.close()
    _delete_commands_before(kafka_bootstrap, topics.commands, 1)
    b = _service(kafka_bootstrap, tmp_path / "b", topics)
    try:
        b.start()
        wait_until(lambda: b.shard_states() == {0: "halted"}, 60, "B's shard halted")
        (reason,) = b.ownership.halted().values()
        assert f"{topics.commands}[0] starts at offset 1, not 0" in reason
        assert f"no snapshot in {topics.commands}.manifests[0]" in reason
    finally:
        b.close()


def test_the_owner_writes_snapshots_while_it_works_and_a_new_owner_takes_the_newest(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Owner A writes a snapshot every 500 ms from its tick loop (16 KiB of chunks a tick)
    while clients schedule and timers fire. Once a snapshot covers every command, A stops,
    the commands it covers are deleted, and owner B, with no store, restores it: B's state is
    A's, and B goes on firing."""
    topics = Topics.unique(create_topic(kafka_bootstrap, unique_topic("dest")))
    keys = [f"k{i}" for i in range(60)]
    a = _service(kafka_bootstrap, tmp_path / "a", topics, snapshot_interval_ms=500)
    try:
        a.start()
        wait_until(lambda: a.shard_states() == {0: "active"}, 30, "A's shard active")
        _schedule(a, topics, keys[:30], 100)  # these fire meanwhile
        _schedule(a, topics, keys[30:], 3_600_000)
        wait_until(
            lambda: all(a.peek(topics.queue, k).status == "DELIVERED" for k in keys[:30]),
            30,
            "the first 30 DELIVERED",
        )
        store = a.owned_store(0)
        assert store is not None
        settled = store.meta.position

        def covers_everything() -> bool:
            found = latest_manifest({"bootstrap.servers": kafka_bootstrap}, topics.commands, 0)
            return found is not None and found.transfer.position >= settled

        wait_until(covers_everything, 30, "a snapshot covering every command")
    finally:
        a.close()
    manifest = latest_manifest({"bootstrap.servers": kafka_bootstrap}, topics.commands, 0)
    assert manifest is not None
    a_messages = _messages(tmp_path / "a" / "shard-0")
    _delete_commands_before(kafka_bootstrap, topics.commands, manifest.covered_offset + 1)
    b = _restored(kafka_bootstrap, tmp_path / "b", topics, manifest.transfer.position)
    try:
        for key in keys[30:35]:
            assert b.peek(topics.queue, key).status == "SCHEDULED"
        _schedule(b, topics, ["late"], 100)
        wait_until(lambda: b.peek(topics.queue, "late").status == "DELIVERED", 30, "B fires")
    finally:
        b.close()
    b_messages = _messages(tmp_path / "b" / "shard-0")
    late = {k for k in b_messages if k not in a_messages}
    assert len(late) == 1
    assert {k: v for k, v in b_messages.items() if k not in late} == a_messages


def test_snapshots_trim_what_no_restore_needs(
    kafka_bootstrap: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With snapshots every 300 ms, once three are complete after the last command the
    owner has deleted the commands the older of the newest two covers, and the chunks of
    the snapshots before it; the newest still restores a new owner; the metrics show it."""
    topics = Topics.unique(create_topic(kafka_bootstrap, unique_topic("dest")))
    a = _service(kafka_bootstrap, tmp_path / "a", topics, snapshot_interval_ms=300)
    settings = {"bootstrap.servers": kafka_bootstrap}
    probe = Consumer({**settings, "group.id": f"probe-{uuid.uuid4().hex}"})
    try:
        a.start()
        wait_until(lambda: a.shard_states() == {0: "active"}, 30, "A's shard active")
        _schedule(a, topics, [f"k{i}" for i in range(20)], 3_600_000)

        def trimmed() -> bool:
            low, _ = probe.get_watermark_offsets(TopicPartition(topics.commands, 0), timeout=5)
            chunks_low, _ = probe.get_watermark_offsets(
                TopicPartition(snapshots_topic(topics.commands), 0), timeout=5
            )
            return low > 0 and chunks_low > 0

        wait_until(trimmed, 30, "the commands and the old chunks trimmed")
        rendered = a.metrics.render()
        for name in (
            "nereus_snapshot_last_completed_seconds",
            "nereus_snapshot_bytes",
            "nereus_commands_trimmed_below_offset",
            "nereus_shard_log_lag_offsets",
        ):
            assert f"\n{name}{{" in rendered, name
    finally:
        a.close()
        probe.close()
    manifest = latest_manifest(settings, topics.commands, 0)
    assert manifest is not None
    # An auditor rebuilds the shard from Kafka alone (the newest snapshot, then the commands
    # after it), and reaches the state of A's own store.
    with ShardStore.open(str(tmp_path / "a" / "shard-0"), create=False) as store:
        a_digest, a_position = _digest(store), store.meta.position
    argv = ["--kafka", kafka_bootstrap, "--commands-topic", topics.commands, "--shard", "0"]
    code = nereus_cli(["replay", *argv, "--verify", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["verify"]["ok"] is True
    assert (doc["digest"], doc["position"]) == (a_digest, a_position)
    assert doc["kafka"]["snapshot"]["covered_offset"] >= 0
    b = _restored(kafka_bootstrap, tmp_path / "b", topics, manifest.transfer.position)
    try:
        assert b.peek(topics.queue, "k7").status == "SCHEDULED"
    finally:
        b.close()


class _Admin:
    """Records the deletions asked of it (the floor rule is decided before any broker)."""

    def __init__(self) -> None:
        self.cuts: list[TopicPartition] = []

    def delete_records(self, cuts: list[TopicPartition]) -> dict[TopicPartition, Any]:
        self.cuts.extend(cuts)
        return {}


def test_the_commands_an_open_obligations_admission_needs_are_never_trimmed(
    topic: str, tmp_path: Path
) -> None:
    """A shard with an open obligation (an Admitted attempt, PUBLISHING). A snapshot at or
    after its Admission may not let the commands before it go (only older snapshot chunks);
    one from before it may."""
    with ShardStore.open(str(tmp_path / "store")) as store:
        store.commit([(schedule("a", delay_ms=0), b"payload")], T0_MS)
        store.commit([(admission_for(store, "a", T0_MS + 10), None)], T0_MS + 10)
        with store.read() as view:
            (obligation,) = [o for _, o in view.items(Table.OBLIGATIONS)]
        assert isinstance(obligation, Obligation)
        admitted = obligation.admitted_position
        log = KafkaLog(store, KafkaLogConfig("unused:9092", topic, 1, "replies", "p"))
        for position, kept in ((admitted, True), (admitted - 1, False)):
            admin = _Admin()
            log.snapshots.admin = admin
            transfer = msgspec.structs.replace(_transfer(store), position=position)
            log.snapshots.trim(SnapshotManifest("s", topic, 1, 900, 40, 60, 0, transfer))
            assert TopicPartition(snapshots_topic(topic), 1, 40) in admin.cuts
            assert (TopicPartition(topic, 1, 901) in admin.cuts) is not kept


def _transfer(store: ShardStore) -> TransferManifest:
    with export_state(store) as export:
        for _ in export.chunks():
            pass
        return export.manifest()


# The rule for a commands topic's own retention ------------------------------------------------


class _Entry:
    def __init__(self, value: str) -> None:
        self.value = value


@pytest.mark.parametrize(
    ("retention_ms", "retention_bytes", "interval_ms", "problem"),
    [
        ("-1", "-1", 600_000, None),
        ("1800000", "-1", 600_000, None),
        ("1799999", "-1", 600_000, r"retention\.ms=1799999, below 3 snapshot intervals"),
        ("86400000", "-1", 0, "but snapshots are off"),
        ("-1", "1073741824", 600_000, r"retention\.bytes=1073741824: deleting commands by size"),
    ],
)
def test_a_commands_topic_retention_below_the_rule_is_refused(
    retention_ms: str, retention_bytes: str, interval_ms: int, problem: str | None
) -> None:
    config = KafkaServiceConfig("b:9092", "/d", snapshot_interval_ms=interval_ms)
    entries = {"retention.ms": _Entry(retention_ms), "retention.bytes": _Entry(retention_bytes)}
    if problem is None:
        check_retention(config, entries)
    else:
        with pytest.raises(ValueError, match=problem):
            check_retention(config, entries)


def test_the_service_refuses_a_commands_topic_whose_retention_is_too_short(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topics = Topics.unique(create_topic(kafka_bootstrap, unique_topic("dest")))
    create_topic(
        kafka_bootstrap,
        topics.commands,
        config={"message.timestamp.type": "LogAppendTime", "retention.ms": "60000"},
    )
    service = _service(kafka_bootstrap, tmp_path / "a", topics, snapshot_interval_ms=600_000)
    try:
        with pytest.raises(ValueError, match=r"retention\.ms=60000, below 3 snapshot intervals"):
            service.start()
    finally:
        service.close()


def test_a_store_left_behind_the_trimmed_start_is_replaced_by_the_newest_snapshot(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """Owner A folds ten schedules and stops, keeping its store. Owner B takes over, takes
    more commands, writes snapshots and trims the commands A never folded. A, restarted on
    its old store, cannot fold from where it stopped: it replaces its store by B's newest
    snapshot and goes on from there, with B's timers."""
    topics = Topics.unique(create_topic(kafka_bootstrap, unique_topic("dest")))
    a = _service(kafka_bootstrap, tmp_path / "a", topics)
    try:
        a.start()
        wait_until(lambda: a.shard_states() == {0: "active"}, 30, "A's shard active")
        _schedule(a, topics, [f"a{i}" for i in range(10)], 3_600_000)
        store = a.owned_store(0)
        assert store is not None and store.source is not None
        a_folded = store.source.last_offset
    finally:
        a.close()
    b = _service(kafka_bootstrap, tmp_path / "b", topics, snapshot_interval_ms=300)
    probe = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": uuid.uuid4().hex})
    try:
        b.start()
        wait_until(lambda: b.shard_states() == {0: "active"}, 30, "B's shard active")
        _schedule(b, topics, [f"b{i}" for i in range(10)], 3_600_000)

        def trimmed_past_a() -> bool:
            low, _ = probe.get_watermark_offsets(TopicPartition(topics.commands, 0), timeout=5)
            return low > a_folded + 1

        wait_until(trimmed_past_a, 30, "the commands A never folded trimmed")
    finally:
        b.close()
        probe.close()
    again = _service(kafka_bootstrap, tmp_path / "a", topics)
    try:
        again.start()
        wait_until(lambda: again.shard_states() == {0: "active"}, 60, "A's shard active again")
        assert again.peek(topics.queue, "b3").status == "SCHEDULED"
        assert again.peek(topics.queue, "a3").status == "SCHEDULED"
        store = again.owned_store(0)
        assert store is not None and store.log_info.snapshot_position > 0
    finally:
        again.close()


def test_replay_from_kafka_needs_a_shard(capsys: pytest.CaptureFixture[str]) -> None:
    assert nereus_cli(["replay", "--kafka", "127.0.0.1:1"]) == 2
    assert "--kafka needs --shard N" in capsys.readouterr().err
