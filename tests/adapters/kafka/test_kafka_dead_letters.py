"""Dead-letter copies in Kafka mode, against a real broker (NEREUS_KAFKA_BOOTSTRAP).

A timer whose record can never fit its destination topic is dead-lettered by the shard that
owns it; the copy it owes is recorded in the shard log, which is a partition of the commands
topic. While the dead-letter topic does not exist every write of the copy is refused
(lane_unavailable) and retried after a backoff. The owner then stops with the copy still
owed; another process with an empty data directory takes the shard over, folds the log from
Kafka, finds the owed copy at recovery, and writes it once the topic exists. The copy is in
the dead-letter topic exactly once, filed under the DLQ consumer group with its history, and
DEAD_LETTER_WRITTEN_V1 in the Kafka log names that very record; the new owner's store equals
the kernel's fold of the Kafka log.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from nereus.adapters.clock import SystemClock
from nereus.adapters.kafka.service import KafkaService
from nereus.kernel.config import KernelConfig
from nereus.kernel.digest import state_digest
from nereus.kernel.keys import message_id
from nereus.kernel.model import Message, Status, Table
from nereus.kernel.records import DeadLetterWritten
from nereus.runtime.config import RuntimeConfig
from nereus.runtime.destination import (
    DLQ_CONSUMER_GROUP,
    H_ATTEMPT_ID,
    H_CONSUMER_GROUP,
    dead_letter_attempt_id,
)
from nereus.service.arguments import schedule_record
from nereus.storage.memory import MemoryStore
from nereus.storage.store import ShardStore
from tests.support import kafka_env
from tests.support.kafka_cluster import TENANT, Topics, read_shard_log, service_config, wait_until
from tests.support.kafka_env import create_topic, unique_topic

kafka_bootstrap = kafka_env.kafka_bootstrap
LOG_APPEND = {"message.timestamp.type": "LogAppendTime"}
KERNEL = KernelConfig(max_attempts=1)
RUNTIME = RuntimeConfig(dead_letter_backoff_base_ms=100, dead_letter_backoff_max_ms=400)


def _service(bootstrap: str, topics: Topics, data: Path) -> KafkaService:
    return KafkaService(
        service_config(bootstrap, topics, data, session_timeout_ms=6_000),
        clock=SystemClock(assumed_error_ms=2),
        kernel_config=KERNEL,
        runtime_config=RUNTIME,
    )


def _read_topic(bootstrap: str, topic: str, timeout_s: float = 10.0) -> list[Any]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique_topic("reader"),
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        if high <= low:
            return []
        consumer.assign([TopicPartition(topic, 0, low)])
        out: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and (not out or out[-1].offset() < high - 1):
            for m in consumer.consume(100, 0.5):
                if m.error() is None:
                    out.append(m)
        return out
    finally:
        consumer.close()


def test_an_owed_copy_is_retried_survives_a_takeover_and_is_recorded_in_the_kafka_log(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    small = {**LOG_APPEND, "max.message.bytes": "2000"}
    topics = Topics.unique(create_topic(kafka_bootstrap, unique_topic("dest"), config=small))
    dlq = topics.destination + ".dlq"  # created only after the first owner is gone
    payload = b"y" * 3_000  # never fits the destination topic: record_too_large at claim
    mid = message_id(TENANT, topics.queue, "big")

    first = _service(kafka_bootstrap, topics, tmp_path / "first")
    try:
        first.start()
        wait_until(lambda: first.shard_states() == {0: "active"}, 30, "shard 0 active")
        (out,) = first.execute([schedule_record(topics.queue, "big", payload, txn="t1")], 30)
        assert out.code == "scheduled"
        wait_until(
            lambda: first.peek(topics.queue, "big").status == "DEAD_LETTERED",
            30,
            "the timer dead-lettered",
        )
        store = first.owned_store(0)
        assert store is not None
        time.sleep(1.5)  # writes of the copy are refused (no such topic) and retried
        assert store.meta.counters.dead_letters_pending == 1
    finally:
        first.close()

    create_topic(kafka_bootstrap, dlq, config=LOG_APPEND)
    second = _service(kafka_bootstrap, topics, tmp_path / "second")
    try:
        second.start()
        wait_until(lambda: second.shard_states() == {0: "active"}, 60, "the takeover")

        def recorded() -> bool:
            s = second.owned_store(0)
            return s is not None and s.meta.counters.dead_letters_pending == 0

        wait_until(recorded, 60, "the copy recorded by the new owner")
    finally:
        second.close()

    copies = _read_topic(kafka_bootstrap, dlq)
    assert len(copies) == 1, f"{len(copies)} copies in {dlq}"
    (copy,) = copies
    headers = dict(copy.headers())
    assert copy.value() == payload
    assert headers[H_ATTEMPT_ID].decode() == dead_letter_attempt_id(mid, 1)
    assert headers[H_CONSUMER_GROUP].decode() == DLQ_CONSUMER_GROUP
    assert headers["nereus-dlq-last-error"] == b"record_too_large"
    assert headers["nereus-dlq-attempts-spent"] == b"1"
    assert headers["nereus-timer-key"] == b"big"  # the copy names its timer too

    logged = read_shard_log(kafka_bootstrap, topics.commands, 0)
    written = [x.entry.record for x in logged if isinstance(x.entry.record, DeadLetterWritten)]
    assert len(written) == 1
    (w,) = written
    assert (w.message_id, w.generation) == (mid, 1)
    assert (w.evidence.destination, w.evidence.partition, w.evidence.offset) == (
        dlq,
        0,
        copy.offset(),
    )
    memory = MemoryStore(KERNEL)
    memory.feed([x.entry for x in logged])
    path = str(tmp_path / "second" / "shard-0")
    with ShardStore.open(path, create=False) as store, store.state_view() as live:
        assert state_digest(live) == state_digest(memory.state)
        m = live.get(Table.MESSAGES, mid.encode())
    assert isinstance(m, Message)
    assert m.status is Status.DEAD_LETTERED and m.dead_letter_evidence == w.evidence
