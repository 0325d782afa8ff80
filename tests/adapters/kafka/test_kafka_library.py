"""The library facade in Kafka mode (`adapters.kafka.library.KafkaNereus`) against the real broker.

A `nereus serve --kafka` process owns every shard; an application embeds a client-only
`KafkaNereus`: its schedule / reschedule / cancel calls are produced to the commands topic and
answered through the replies topic once the owner has applied them. The auditor re-reads the
Kafka log: the library's commands are in it, in the order the calls returned, and the timers
were published once, never early. A second library instance with a data directory joins the
group and takes a share of the shards; peek then answers for those shards only, and, owning
them all, so do the async calls and list.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from nereus.adapters.clock import SystemClock
from nereus.adapters.kafka.library import KafkaNereus
from nereus.adapters.kafka.wire import shard_for
from nereus.kernel.model import Status
from nereus.kernel.records import Cancel, Reschedule, Schedule
from nereus.service.errors import ShardNotLocal
from tests.support import kafka_env
from tests.support.kafka_cluster import (
    TENANT,
    ServiceProc,
    Topics,
    audit,
    check_delivery,
    wait_until,
)
from tests.support.kafka_env import create_topic, unique_topic

kafka_bootstrap = kafka_env.kafka_bootstrap
SHARDS = 2
LOG_APPEND = {"message.timestamp.type": "LogAppendTime"}


def _topics(bootstrap: str) -> Topics:
    return Topics.unique(
        create_topic(bootstrap, unique_topic("dest"), partitions=1, config=LOG_APPEND)
    )


def _connect(bootstrap: str, topics: Topics, data_dir: Path | None = None) -> KafkaNereus:
    return KafkaNereus.connect(
        bootstrap,
        data_dir=str(data_dir) if data_dir is not None else None,
        clock=SystemClock(assumed_error_ms=2),
        commands_topic=topics.commands,
        replies_topic=topics.replies,
        group=topics.group,
        shards=SHARDS,
        destination_topics={topics.queue: topics.destination},
    )


def test_library_commands_go_through_the_commands_topic(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topics = _topics(kafka_bootstrap)
    owner = ServiceProc("owner", kafka_bootstrap, topics, tmp_path / "owner", shards=SHARDS)
    owner.start().wait_serving()
    try:
        wait_until(lambda: owner.active_shards() == set(range(SHARDS)), 60, "owner active")
        with _connect(kafka_bootstrap, topics) as client:
            keys = [f"k{i}" for i in range(8)]
            for key in keys:
                r = client.schedule(topics.queue, key, f"v-{key}".encode(), delay_ms=800)
                assert r.ok and r.status == "scheduled" and r.deliver_at_ms is not None
            again = client.schedule(topics.queue, "k0", b"v-k0", delay_ms=800, txn="fixed")
            assert again.status == "rescheduled"  # new content (txn): an upsert
            same = client.schedule(topics.queue, "k0", b"v-k0", delay_ms=800, txn="fixed")
            assert same.status == "unchanged"  # an identical retry
            moved = client.reschedule(topics.queue, "k1", delay_ms=1200)
            assert moved.ok and moved.status == "rescheduled"
            gone = client.cancel(topics.queue, "k2")
            assert gone.ok and gone.status == "canceled"
            assert client.cancel(topics.queue, "never").status == "absent"
            with pytest.raises(ShardNotLocal):
                client.peek(topics.queue, "k3")  # a client owns no shard
            live = [k for k in keys if k != "k2"]

            def delivered() -> bool:
                status, doc = owner.http("GET", f"/api/v1/timers/{topics.queue}/{live[-1]}")
                return status == 200 and doc.get("status") == "DELIVERED"

            wait_until(delivered, 30, "the client's timers delivered by the owner")
            wait_until(
                lambda: all(
                    owner.http("GET", f"/api/v1/timers/{topics.queue}/{k}")[1].get("status")
                    == "DELIVERED"
                    for k in live
                ),
                30,
                "every live timer delivered",
            )
    finally:
        owner.stop()
    a = audit(kafka_bootstrap, topics, SHARDS, 1)
    counts = check_delivery(a, live, where="library client")
    assert counts["records"] == len(live) and not counts.get("duplicates")
    canceled = a.message("k2")
    assert canceled is not None and canceled.status is Status.CANCELED
    # The library's calls are records of the shard log like the HTTP API's.
    kinds = {type(x.entry.record) for log in a.logs.values() for x in log}
    assert {Schedule, Reschedule, Cancel} <= kinds


def test_a_library_instance_with_a_data_dir_owns_shards(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topics = _topics(kafka_bootstrap)
    with _connect(kafka_bootstrap, topics, tmp_path / "lib") as lib:
        wait_until(
            lambda: (
                set(lib.service.shard_states().values()) == {"active"}
                and len(lib.service.shard_states()) == SHARDS
            ),
            60,
            "the library owns every shard",
        )
        key = next(
            k
            for k in (f"x{i}" for i in range(100))
            if shard_for(TENANT, topics.queue, k, SHARDS) == 0
        )
        r = lib.schedule(topics.queue, key, b"payload", delay_ms=300)
        assert r.status == "scheduled"
        wait_until(lambda: lib.peek(topics.queue, key).status == "DELIVERED", 30, "delivered")
        peek = lib.peek(topics.queue, key)
        assert peek.found and peek.message_id == r.message_id

        async def calls() -> None:
            later = await lib.schedule_async(
                topics.queue, "async", b"a", delay_ms=timedelta(minutes=10)
            )
            assert later.status == "scheduled"
            assert (await lib.peek_async(topics.queue, "async")).status == "SCHEDULED"
            page = await lib.list_async(topics.queue)
            assert [row.timer_key for row in page.rows] == ["async"]  # the other was delivered
            assert (await lib.cancel_async(topics.queue, "async")).status == "canceled"
            with pytest.raises(ValueError, match="naive"):
                await lib.schedule_async(topics.queue, "n", b"n", deliver_at_ms=datetime.now())

        asyncio.run(calls())
        assert lib.list(topics.queue).rows == ()
