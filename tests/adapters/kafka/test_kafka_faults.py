"""Broker faults against the real broker: the destination topic deleted mid-fire.

An embedded shard publishes to a Kafka topic while a steady stream of timers falls due; the
topic is deleted (the broker runs with auto-create off, as production brokers should), stays
gone for a while, and is created again. While it is gone every send must come back as the
truth, never PUBLISHED: with the idempotent producer NOT_PUBLISHED with the lane-unavailable
disposition (the topic is definitely not there) or UNKNOWN (the record was in flight when the
topic went); with the transactional one NOT_PUBLISHED (its transaction was aborted), never
UNKNOWN. Once the topic is back every timer is delivered into the new topic: once per
generation (with the idempotent producer, unless an UNKNOWN attempt stands behind it), never
before deliverAt (broker timestamps), and every PUBLISHED attempt's evidence names a record
that really is there.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from nereus.adapters.clock import SystemClock
from nereus.adapters.kafka.destination import Delivery, KafkaDestination, KafkaDestinationConfig
from nereus.adapters.local.embedded import Nereus
from nereus.kernel.keys import message_id
from nereus.kernel.model import Attempt, AttemptStatus, Table
from nereus.runtime.config import RuntimeConfig
from nereus.runtime.destination import H_ATTEMPT_ID, H_DELIVER_AT
from nereus.runtime.shard import ShardRuntime
from nereus.storage.store import ShardStore
from tests.adapters.kafka.test_kafka_destination import consume_all
from tests.support import kafka_env
from tests.support.kafka_cluster import wait_until
from tests.support.kafka_env import create_topic, unique_topic

kafka_bootstrap = kafka_env.kafka_bootstrap
LOG_APPEND = {"message.timestamp.type": "LogAppendTime"}
QUEUE = "reminders"
TIMERS = 60


def _delete(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic], operation_timeout=30)[topic].result(timeout=30)
    wait_until(lambda: topic not in admin.list_topics(timeout=5).topics, 30, "topic gone")


def _recreate(bootstrap: str, topic: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            create_topic(bootstrap, topic, partitions=1, config=LOG_APPEND)
            return
        except KafkaException as exc:
            # Deletion finishes asynchronously: "marked for deletion" / "already exists".
            if time.monotonic() > deadline or exc.args[0].code() not in (
                KafkaError.TOPIC_ALREADY_EXISTS,
                KafkaError.UNKNOWN_TOPIC_OR_PART,
            ):
                raise
            time.sleep(0.5)


@pytest.mark.parametrize("delivery", ["transactional", "idempotent"])
def test_destination_topic_deleted_mid_fire(
    kafka_bootstrap: str, tmp_path: Path, delivery: Delivery
) -> None:
    topic = create_topic(kafka_bootstrap, unique_topic("gone"), partitions=1, config=LOG_APPEND)
    dest = KafkaDestination(
        KafkaDestinationConfig(
            bootstrap=kafka_bootstrap,
            delivery=delivery,
            topics={QUEUE: topic},
            limits_ttl_s=0.5,
            # A record for a topic missing from the metadata fails after 1 s (default 5 s),
            # so the 4 s outage below shows the lane-unavailable path, not only retries.
            metadata_propagation_ms=1_000,
        )
    )
    store = ShardStore.open(str(tmp_path / "shard"))
    runtime = ShardRuntime(
        store,
        dest,
        SystemClock(assumed_error_ms=2),
        config=RuntimeConfig(lane_unready_ms=300),
    )
    nereus = Nereus(store, dest, runtime)
    keys = [f"t{i}" for i in range(TIMERS)]
    try:
        nereus.start()
        for i, key in enumerate(keys):
            # Due over ~6 s: some before the deletion, many while the topic is gone.
            assert nereus.schedule(QUEUE, key, f"p-{key}".encode(), delay_ms=i * 100).ok
        time.sleep(1.5)
        _delete(kafka_bootstrap, topic)
        gone_at_ms = int(time.time() * 1000)
        time.sleep(4.0)
        _recreate(kafka_bootstrap, topic)
        back_at_ms = int(time.time() * 1000)

        def settled() -> bool:
            return all(nereus.peek(QUEUE, k).status in ("DELIVERED",) for k in keys)

        wait_until(settled, 90, "every timer delivered after the topic came back")
        assert runtime.halted is None, runtime.halted
        with store.read() as view:
            attempts = [a for _, a in view.items(Table.ATTEMPTS) if isinstance(a, Attempt)]
    finally:
        nereus.close()

    records = consume_all(kafka_bootstrap, topic, 1, timeout_s=10)
    in_new_topic = {dict(r.headers())[H_ATTEMPT_ID].decode(): r for r in records}
    lane_unavailable = [
        a
        for a in attempts
        if a.status is AttemptStatus.NOT_PUBLISHED and a.disposition == "lane_unavailable"
    ]
    if delivery == "idempotent":
        assert lane_unavailable, "no send met the missing topic"
    else:
        # A transaction waits for a missing topic (up to message_timeout_ms) or is aborted:
        # either way nothing is UNKNOWN, and what was sent while the topic was gone landed
        # in the new one.
        assert not any(a.status is AttemptStatus.UNKNOWN for a in attempts)
        met_the_gap = [a for a in attempts if gone_at_ms <= a.admitted_at_ms < back_at_ms - 500]
        assert met_the_gap, "no send met the missing topic"
    for r in records:
        headers = dict(r.headers())
        assert r.timestamp()[1] >= int(headers[H_DELIVER_AT]), "published before deliverAt"
    for a in attempts:
        if a.status is AttemptStatus.NOT_PUBLISHED:
            # Definitely not published: it is not in the new topic either.
            assert a.attempt_id not in in_new_topic
        if a.status is AttemptStatus.PUBLISHED and a.evidence is not None:
            if a.evidence.timestamp_ms >= back_at_ms:
                # Evidence names a record the topic really holds.
                r = in_new_topic[a.attempt_id]
                assert r.offset() == a.evidence.offset
            assert not gone_at_ms + 500 <= a.evidence.timestamp_ms < back_at_ms - 500
    per_message: dict[str, int] = {}
    for attempt_id in in_new_topic:
        a = next(x for x in attempts if x.attempt_id == attempt_id)
        per_message[a.message_id] = per_message.get(a.message_id, 0) + 1
    unknown_behind = {a.message_id for a in attempts if a.status is AttemptStatus.UNKNOWN}
    for mid, n in per_message.items():
        assert n == 1 or mid in unknown_behind, f"{mid} published {n} times without UNKNOWN"
    delivered_late = {message_id("default", QUEUE, k) for k in keys[15:]}
    assert delivered_late & set(per_message), "nothing was delivered into the recreated topic"
    print(
        f"topic deleted mid-fire: {len(attempts)} attempts, {len(lane_unavailable)} "
        f"lane-unavailable, {len(unknown_behind)} unknown, {len(in_new_topic)} records after "
        "recreation"
    )
