"""Kafka: a tenant's deliveries are its own, on a real broker (NEREUS_KAFKA_BOOTSTRAP).

The rule (`specs/destinations.md`): a tenant's queue is published to its own topic (its
`tenant/queue` mapping, the queue's bare mapping, or `<tenant>.<queue>`), every record
carries the header `nereus-tenant`, and a topic declared shared holds several tenants'
records, told apart by that header; every record carries its timer's key too
(`nereus-timer-key`; an odd key encoded). Tenants acme and globex schedule to a queue named
`same` through a shard runtime publishing to Kafka: acme's topic holds acme's records only,
globex's only globex's, and the shared `audit` topic both, each record naming the tenant its
message id belongs to. An attempt sent before topics were named by tenant (to the queue's
plain topic) is still found by the evidence search that asks for the tenant's new topic, so
the transactional capability never takes its absence there for a proof. The refusal of a
configuration that maps two tenants to one topic is in `test_kafka_config.py`.
`NEREUS_KAFKA_TENANT_TIMERS` (default 60) timers per tenant and queue.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

from nereus import decode_timer_key
from nereus.adapters.clock import SystemClock
from nereus.adapters.kafka.destination import KafkaDestination, KafkaDestinationConfig
from nereus.adapters.local.embedded import Nereus
from nereus.kernel.keys import message_id
from nereus.runtime.destination import (
    H_ATTEMPT_ID,
    H_MESSAGE_ID,
    PreparedPublish,
    Send,
    SendResult,
)
from nereus.runtime.shard import ShardRuntime
from nereus.storage.store import ShardStore
from tests.support import kafka_env
from tests.support.kafka_cluster import read_destination
from tests.support.kafka_env import create_topic, unique_topic

kafka_bootstrap = kafka_env.kafka_bootstrap
LOG_APPEND = {"message.timestamp.type": "LogAppendTime"}
TIMERS = int(os.environ.get("NEREUS_KAFKA_TENANT_TIMERS", "60"))
TENANTS = ("acme", "globex")
# A few keys a header cannot carry as they are (`specs/destinations.md`, the timer key), and
# the longest one; the rest plain.
ODD_KEYS = {1: "two\nlines", 2: "ł" * 75, 3: "b64:x"}
HEADER_OF = {
    "two\nlines": b"b64:dHdvCmxpbmVz",
    "ł" * 75: ("ł" * 75).encode(),
    "b64:x": b"b64:YjY0Ong=",
}


def _key(i: int) -> str:
    return ODD_KEYS.get(i, f"k{i}")


def test_each_tenants_records_land_in_its_own_topic_and_name_their_tenant(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    own = {t: create_topic(kafka_bootstrap, unique_topic(t), config=LOG_APPEND) for t in TENANTS}
    audit = create_topic(kafka_bootstrap, unique_topic("audit"), config=LOG_APPEND)
    mapping = {f"{t}/same": topic for t, topic in own.items()} | {"audit": audit}
    dest = KafkaDestination(KafkaDestinationConfig(bootstrap=kafka_bootstrap, topics=mapping))
    store = ShardStore.open(str(tmp_path / "shard"))
    runtime = ShardRuntime(store, dest, SystemClock(assumed_error_ms=2))
    nereus = Nereus(store, dest, runtime)
    try:
        nereus.start()
        for i in range(TIMERS):
            for tenant in TENANTS:
                for queue in ("same", "audit"):
                    body = f"{tenant}-{queue}-{i}".encode()
                    res = nereus.schedule(queue, _key(i), body, delay_ms=0, tenant=tenant)
                    assert res.ok, res
        deadline = time.monotonic() + 60
        while not all(
            nereus.peek(q, _key(i), tenant=t).status == "DELIVERED"
            for t in TENANTS
            for q in ("same", "audit")
            for i in (0, TIMERS - 1)
        ):
            assert runtime.halted is None, runtime.halted
            assert time.monotonic() < deadline, "the timers were not delivered"
            time.sleep(0.1)
        time.sleep(0.5)  # the rest, scheduled before the last ones, are in too
    finally:
        nereus.close()
    for tenant, topic in own.items():
        records = read_destination(kafka_bootstrap, topic, 1)
        assert {r.headers["nereus-tenant"] for r in records} == {tenant.encode()}
        assert {r.message_id for r in records} == {
            message_id(tenant, "same", _key(i)) for i in range(TIMERS)
        }
        # Every record names its timer: the key itself, or marked base64 where it must be.
        key_of = {message_id(tenant, "same", _key(i)): _key(i) for i in range(TIMERS)}
        for r in records:
            key = key_of[r.message_id]
            assert r.headers["nereus-timer-key"] == HEADER_OF.get(key, key.encode())
            assert decode_timer_key(r.headers["nereus-timer-key"]) == key  # as a consumer would
    shared = read_destination(kafka_bootstrap, audit, 1)
    owner = {message_id(t, "audit", _key(i)): t for t in TENANTS for i in range(TIMERS)}
    assert {r.message_id for r in shared} == set(owner)
    for r in shared:
        assert r.headers["nereus-tenant"] == owner[r.message_id].encode()


def test_an_attempt_sent_to_the_old_topic_is_found_from_the_tenants_new_one(
    kafka_bootstrap: str,
) -> None:
    queue = unique_topic("q")  # its plain topic is where every tenant's went before
    create_topic(kafka_bootstrap, queue, config=LOG_APPEND)
    dest = KafkaDestination(
        KafkaDestinationConfig(bootstrap=kafka_bootstrap, metadata_propagation_ms=1000)
    )
    dest.open(uuid.uuid4().hex)  # transactional: fences, so a complete miss proves absence
    try:
        mid = message_id("acme", queue, "k")
        since_ms = int(time.time() * 1000)
        prepared = PreparedPublish(
            "kafka", queue, None, b"v", ((H_MESSAGE_ID, mid.encode()),), mid, 1, "t", 0, None, False
        )
        sent = Send(f"{mid}.1.before-upgrade", prepared)
        dest.submit([sent], since_ms)
        deadline = time.monotonic() + 30
        results: list[SendResult] = []
        while not results and time.monotonic() < deadline:
            results = dest.poll(0.1)
        assert [type(r.result).__name__ for r in results] == ["Published"]
        [record] = read_destination(kafka_bootstrap, queue, 1)
        assert record.headers[H_ATTEMPT_ID] == sent.attempt_id.encode()
        # After the upgrade, recovery asks for acme's topic of the queue: a new name.
        topic = dest.topic_for(queue, tenant="acme")
        assert topic == f"acme.{queue}"
        evidence = dest.find(sent.attempt_id, topic, since_ms)
        assert evidence is not None
        assert (evidence.destination, evidence.offset) == (queue, record.offset)
    finally:
        dest.close()
