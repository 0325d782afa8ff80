"""The Kafka destination against a real broker (scripts/kafka; NEREUS_KAFKA_BOOTSTRAP).

Both capabilities, transactional and idempotent, unless a test names one. Sends are
published and read back with a plain read_committed consumer: key, value and every Nereus
header arrive, and the evidence in the delivery report names the very record read back.
`find` locates a published attempt by its header and answers None for one that is not
there. Delivery failures come back in their true class: a record over the topic's
max.message.bytes is NOT_PUBLISHED permanent, an unknown topic (auto creation is off) is
lane_unavailable; with the idempotent producer, records refused only for their batch are
retriable, a full local queue is retriable, a broker that never answers gives UNKNOWN, and
so does every record a producer held when it failed fatally. The error table itself is
checked on real `KafkaError` values. End to end, a `ShardRuntime` on a real LMDB store with
the host clock publishes timers due in 0..1500 ms through this destination: each record
arrives exactly once, never stamped (LogAppendTime) before its deliverAt. The transactional
capability's cases under faults (aborts, transactions in doubt, the fence) are in
test_kafka_faults.py, test_kafka_broker_restart.py and test_kafka_partition.py.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, KafkaError, TopicPartition

from nereus.adapters.clock import SystemClock
from nereus.adapters.kafka.destination import (
    FRAMING_RESERVE_BYTES,
    Delivery,
    KafkaDestination,
    KafkaDestinationConfig,
)
from nereus.adapters.kafka.outcomes import classify_error, classify_produce_exception
from nereus.adapters.local.embedded import Nereus
from nereus.kernel.keys import message_id
from nereus.kernel.records import NotPublished, Published, Unknown
from nereus.runtime.destination import (
    H_ATTEMPT_ID,
    H_DELIVER_AT,
    H_GENERATION,
    H_MESSAGE_ID,
    H_PRODUCER,
    H_TXN,
    PreparedPublish,
    Send,
    SendResult,
)
from nereus.runtime.shard import ShardRuntime
from nereus.storage.store import ShardStore
from tests.support import kafka_env
from tests.support.kafka_env import create_topic, unique_topic

kafka_bootstrap = kafka_env.kafka_bootstrap
LOG_APPEND = {"message.timestamp.type": "LogAppendTime"}


def make_send(topic: str, *, key: bytes | None = b"key", value: bytes = b"value") -> Send:
    mid = uuid.uuid4().hex
    headers = (
        ("app-header", b"app-value"),
        (H_MESSAGE_ID, mid.encode()),
        (H_GENERATION, b"1"),
        (H_TXN, b"txn-" + mid[:8].encode()),
        (H_DELIVER_AT, b"0"),
        (H_PRODUCER, b"test-producer"),
    )
    prepared = PreparedPublish(
        destination="kafka",
        topic=topic,
        key=key,
        value=value,
        headers=headers,
        message_id=mid,
        generation=1,
        txn="txn-" + mid[:8],
        deliver_at_ms=0,
        producer_sub=None,
        encrypted=False,
    )
    return Send(f"{mid}:1:{uuid.uuid4().hex[:6]}", prepared)


def wait_results(
    dest: KafkaDestination, sends: list[Send], timeout_s: float = 30.0
) -> dict[str, SendResult]:
    want = {s.attempt_id for s in sends}
    got: dict[str, SendResult] = {}
    deadline = time.monotonic() + timeout_s
    while want - got.keys() and time.monotonic() < deadline:
        for res in dest.poll(0.1):
            assert res.attempt_id not in got, "two results for one attempt"
            got[res.attempt_id] = res
    assert not want - got.keys(), f"no result for {sorted(want - got.keys())}"
    return got


def consume_all(bootstrap: str, topic: str, count: int, timeout_s: float = 30.0) -> list[Any]:
    """Read `count` records (and then anything else already there) from every partition."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"test-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[Any] = []
        eof: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and (len(out) < count or len(eof) < len(parts)):
            for m in consumer.consume(num_messages=100, timeout=0.2):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        eof.add(int(m.partition() or 0))
                    continue
                eof.discard(int(m.partition() or 0))
                out.append(m)
        return out
    finally:
        consumer.close()


def opened(config: KafkaDestinationConfig) -> KafkaDestination:
    """A destination as the runtime would have it: opened for a store of its own."""
    dest = KafkaDestination(config)
    dest.open(uuid.uuid4().hex)
    return dest


@pytest.fixture(params=["transactional", "idempotent"])
def destination(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Iterator[KafkaDestination]:
    dest = opened(
        KafkaDestinationConfig(
            bootstrap=kafka_bootstrap, metadata_propagation_ms=1000, delivery=request.param
        )
    )
    yield dest
    dest.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


# Publishing and evidence --------------------------------------------------------------------


def test_published_records_carry_key_headers_and_matching_evidence(
    kafka_bootstrap: str, destination: KafkaDestination
) -> None:
    topic = create_topic(kafka_bootstrap, unique_topic("pub"), partitions=2, config=LOG_APPEND)
    sends = [make_send(topic, key=f"k{i}".encode(), value=f"v{i}".encode()) for i in range(6)]
    before_ms = int(time.time() * 1000)
    destination.submit(sends, before_ms)
    results = wait_results(destination, sends)
    records = consume_all(kafka_bootstrap, topic, len(sends))
    assert len(records) == len(sends)
    by_attempt = {dict(m.headers())[H_ATTEMPT_ID].decode(): m for m in records}
    for send in sends:
        res = results[send.attempt_id]
        assert isinstance(res.result, Published), res.result
        assert (res.message_id, res.generation) == (send.prepared.message_id, 1)
        m = by_attempt[send.attempt_id]
        assert m.key() == send.prepared.key and m.value() == send.prepared.value
        assert m.headers() == list(send.headers())
        ev = res.result.evidence
        ts_type, ts = m.timestamp()
        assert ts_type == TIMESTAMP_LOG_APPEND_TIME and ts >= before_ms - 5
        assert (ev.destination, ev.partition, ev.offset, ev.timestamp_ms) == (
            topic,
            m.partition(),
            m.offset(),
            ts,
        )


def test_find_returns_evidence_for_a_published_attempt_and_none_otherwise(
    kafka_bootstrap: str, destination: KafkaDestination
) -> None:
    topic = create_topic(kafka_bootstrap, unique_topic("find"), partitions=3, config=LOG_APPEND)
    since_ms = int(time.time() * 1000)
    sends = [make_send(topic, key=f"key-{i}".encode()) for i in range(9)]
    destination.submit(sends, since_ms)
    results = wait_results(destination, sends)
    for send in (sends[0], sends[4], sends[8]):
        res = results[send.attempt_id].result
        assert isinstance(res, Published)
        assert destination.find(send.attempt_id, topic, since_ms) == res.evidence
    absent = make_send(topic)
    assert destination.find(absent.attempt_id, topic, since_ms) is None
    # Outside the window (after every record, beyond the slack): nothing is read.
    assert destination.find(sends[0].attempt_id, topic, since_ms + 3_600_000) is None
    assert destination.find(sends[0].attempt_id, unique_topic("missing"), since_ms) is None


# Error classes --------------------------------------------------------------------------------


def test_record_over_the_topic_limit_is_permanent_and_the_producer_goes_on(
    kafka_bootstrap: str, destination: KafkaDestination
) -> None:
    """First with the limit not yet read (the broker refuses the record and the report is
    classified), then with it cached (submit refuses without sending)."""
    limit = 4096
    topic = create_topic(
        kafka_bootstrap, unique_topic("small"), config={"max.message.bytes": str(limit)}
    )
    refused_by_broker = make_send(topic, value=b"x" * (limit + 1))
    destination.submit([refused_by_broker], 0)
    results = wait_results(destination, [refused_by_broker])
    assert destination.max_record_bytes(topic) == limit - FRAMING_RESERVE_BYTES
    refused_here = make_send(topic, value=b"x" * (limit + 1))
    ok = make_send(topic, value=b"fits")
    destination.submit([refused_here], 0)
    destination.submit([ok], 0)
    results |= wait_results(destination, [refused_here, ok])
    for send in (refused_by_broker, refused_here):
        res = results[send.attempt_id].result
        assert isinstance(res, NotPublished)
        assert (res.disposition, res.error_code) == ("permanent", "record_too_large")
    broker_said = results[refused_by_broker.attempt_id].result
    assert isinstance(broker_said, NotPublished) and "Broker" in broker_said.detail
    assert isinstance(results[ok.attempt_id].result, Published)
    assert len(consume_all(kafka_bootstrap, topic, 1)) == 1


def test_records_refused_only_for_their_batch_are_retriable(kafka_bootstrap: str) -> None:
    """Each record fits the topic alone; batched together they exceed max.message.bytes and
    the broker refuses the whole batch (MSG_SIZE_TOO_LARGE): not persisted, not their
    fault, so retriable. Sent again one by one, they publish."""
    limit = 4096
    topic = create_topic(
        kafka_bootstrap, unique_topic("batch"), config={"max.message.bytes": str(limit)}
    )
    dest = KafkaDestination(
        KafkaDestinationConfig(bootstrap=kafka_bootstrap, linger_ms=200, delivery="idempotent")
    )
    try:
        assert dest.max_record_bytes(topic) > 2500  # also caches the limit for submit
        sends = [make_send(topic, value=b"y" * 2500) for _ in range(2)]
        dest.submit(sends, 0)
        results = wait_results(dest, sends)
        classes = []
        for send in sends:
            res = results[send.attempt_id].result
            if isinstance(res, NotPublished):
                assert (res.disposition, res.error_code) == ("retriable", "batch_too_large")
                classes.append("retriable")
            else:
                assert isinstance(res, Published)
                classes.append("published")
        assert "retriable" in classes  # linger 200 ms: the two share a batch
        for send in sends:
            again = Send(send.attempt_id + "-again", send.prepared)
            dest.submit([again], 0)
            res = wait_results(dest, [again])[again.attempt_id].result
            assert isinstance(res, Published)
        published = consume_all(kafka_bootstrap, topic, classes.count("published") + 2)
        assert len(published) == classes.count("published") + 2
    finally:
        dest.close()


def test_unknown_topic_is_lane_unavailable(destination: KafkaDestination) -> None:
    send = make_send(unique_topic("nowhere"))
    destination.submit([send], 0)
    res = wait_results(destination, [send])[send.attempt_id].result
    assert isinstance(res, NotPublished)
    assert res.disposition == "lane_unavailable", res


def test_unreachable_broker_gives_unknown_and_a_full_queue_gives_retriable() -> None:
    dest = KafkaDestination(
        KafkaDestinationConfig(
            bootstrap=f"127.0.0.1:{closed_port()}",
            delivery="idempotent",
            message_timeout_ms=1500,
            admin_timeout_s=1.0,
            client_config={"log_level": 0},
            producer_config={"queue.buffering.max.messages": 1},
        )
    )
    try:
        first, second = make_send("t-unreachable"), make_send("t-unreachable")
        dest.submit([first, second], 0)
        results = wait_results(dest, [first, second], timeout_s=15)
        res = results[first.attempt_id].result
        assert isinstance(res, Unknown) and res.reason == "timeout", res
        res = results[second.attempt_id].result
        assert isinstance(res, NotPublished), res
        assert (res.disposition, res.error_code) == ("retriable", "queue_full")
    finally:
        dest.close()


def test_a_fatal_producer_error_leaves_its_records_unknown_and_a_fresh_producer() -> None:
    """librdkafka raises fatal (idempotence) errors through the error callback; one is handed
    to that callback here. The next submit purges the broken producer: what it held is
    reported UNKNOWN (never NOT_PUBLISHED), and later sends go to a new producer."""
    dest = KafkaDestination(
        KafkaDestinationConfig(
            bootstrap=f"127.0.0.1:{closed_port()}",
            delivery="idempotent",
            message_timeout_ms=1500,
            client_config={"log_level": 0},
        )
    )
    try:
        held = [make_send("t-fatal"), make_send("t-fatal")]
        dest.submit(held, 0)
        old = dest._producer
        dest._on_error(KafkaError(KafkaError._FATAL, "injected fatal error", fatal=True))
        later = make_send("t-fatal")
        dest.submit([later], 0)
        assert dest._producer is not old
        results = wait_results(dest, [*held, later], timeout_s=15)
        for send in held:
            res = results[send.attempt_id].result
            assert isinstance(res, Unknown), res
        res = results[later.attempt_id].result
        assert isinstance(res, Unknown) and res.reason == "timeout", res
    finally:
        dest.close()


def test_error_table_on_real_kafka_errors() -> None:
    e = KafkaError

    def cls(code: int, *, fits: bool = True, disturbed: bool = False) -> tuple[str, str]:
        out = classify_error(e(code), fits_alone=fits, disturbed=disturbed)
        if isinstance(out, NotPublished):
            return (out.disposition, out.error_code)
        return ("UNKNOWN", out.reason)

    assert cls(e.MSG_SIZE_TOO_LARGE, fits=False) == ("permanent", "record_too_large")
    assert cls(e.MSG_SIZE_TOO_LARGE) == ("retriable", "batch_too_large")
    assert cls(e.RECORD_LIST_TOO_LARGE, fits=False) == ("permanent", "record_too_large")
    for code in (e.UNKNOWN_TOPIC_OR_PART, e._UNKNOWN_TOPIC, e._UNKNOWN_PARTITION):
        assert cls(code)[0] == "lane_unavailable"
        assert cls(code, disturbed=True)[0] == "lane_unavailable"
    for code in (e.INVALID_RECORD, e.TOPIC_AUTHORIZATION_FAILED, e.POLICY_VIOLATION):
        assert cls(code)[0] == "permanent"
        assert cls(code, disturbed=True) == ("UNKNOWN", "possibly_persisted")
    for code in (e.NOT_ENOUGH_REPLICAS, e.NOT_LEADER_FOR_PARTITION, e._PURGE_QUEUE):
        assert cls(code)[0] == "retriable"
        assert cls(code, disturbed=True) == ("UNKNOWN", "possibly_persisted")
    assert cls(e._MSG_TIMED_OUT) == ("UNKNOWN", "timeout")
    for code in (
        e._PURGE_INFLIGHT,
        e.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        e.REQUEST_TIMED_OUT,
        e._TIMED_OUT,
        e._TRANSPORT,
        e._FATAL,
        e.OUT_OF_ORDER_SEQUENCE_NUMBER,
        e.UNKNOWN_PRODUCER_ID,
        e.UNKNOWN,
    ):
        assert cls(code) == ("UNKNOWN", "possibly_persisted"), e(code).name()
    # produce() raising never enqueued the record: never UNKNOWN.
    raised = classify_produce_exception(e(e.MSG_SIZE_TOO_LARGE))
    assert (raised.disposition, raised.error_code) == ("permanent", "record_too_large")
    assert classify_produce_exception(e(e._UNKNOWN_TOPIC)).disposition == "lane_unavailable"
    assert classify_produce_exception(e(e._FATAL)).disposition == "retriable"


# End to end ---------------------------------------------------------------------------------


@pytest.mark.parametrize("delivery", ["transactional", "idempotent"])
def test_shard_runtime_publishes_each_timer_once_never_early(
    kafka_bootstrap: str, tmp_path: Path, delivery: Delivery
) -> None:
    topic = create_topic(kafka_bootstrap, unique_topic("e2e"), partitions=2, config=LOG_APPEND)
    queue = "reminders"
    dest = KafkaDestination(
        KafkaDestinationConfig(bootstrap=kafka_bootstrap, topics={queue: topic}, delivery=delivery)
    )
    store = ShardStore.open(str(tmp_path / "shard"))
    runtime = ShardRuntime(store, dest, SystemClock(assumed_error_ms=2))
    nereus = Nereus(store, dest, runtime)
    delays = [i * 1500 // 39 for i in range(40)]
    try:
        nereus.start()
        for i, delay in enumerate(delays):
            res = nereus.schedule(
                queue, f"timer-{i}", f"payload-{i}".encode(), delay_ms=delay, partition=f"u{i % 5}"
            )
            assert res.ok, res
        first = consume_all(kafka_bootstrap, topic, len(delays), timeout_s=30)
        assert len(first) >= len(delays)
        # Every outcome recorded; then read the topic again to see any late duplicate.
        deadline = time.monotonic() + 10
        statuses: set[str | None] = set()
        while time.monotonic() < deadline:
            statuses = {nereus.peek(queue, f"timer-{i}").status for i in range(len(delays))}
            if statuses == {"DELIVERED"}:
                break
            time.sleep(0.05)
        assert statuses == {"DELIVERED"}
        assert runtime.halted is None, runtime.halted
        records = consume_all(kafka_bootstrap, topic, len(delays))
        keys = {message_id("default", queue, f"timer-{i}"): f"u{i % 5}" for i in range(40)}
        seen: dict[str, int] = {}
        for m in records:
            headers = dict(m.headers())
            for name in (H_MESSAGE_ID, H_GENERATION, H_ATTEMPT_ID, H_TXN, H_PRODUCER):
                assert headers.get(name), f"{name} missing"
            mid = headers[H_MESSAGE_ID].decode()
            seen[mid] = seen.get(mid, 0) + 1
            ts_type, ts = m.timestamp()
            assert ts_type == TIMESTAMP_LOG_APPEND_TIME
            deliver_at = int(headers[H_DELIVER_AT])
            assert ts >= deliver_at, f"{mid} stamped {deliver_at - ts} ms before deliverAt"
            assert m.key() == keys[mid].encode()
        assert set(seen) == set(keys)
        assert all(n == 1 for n in seen.values()), {k: n for k, n in seen.items() if n > 1}
    finally:
        nereus.close()
