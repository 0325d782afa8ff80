"""Appending DELETEs in Kafka mode, against the real broker (specs/http.md, "Rate limit").

Kafka mode appends every cancel it takes, so a credential's bucket of appending DELETEs is
what bounds its DELETEs there. With the bucket empty:
* a DELETE of a finished timer whose shard this process owns is refused `429 rate_limited`
  (Retry-After) and nothing reaches the commands topic: the next command of that shard
  lands right after the last one before the refusals;
* a DELETE of a pending timer is never refused: `canceled`, one entry each;
* a process that owns no shard cannot judge a DELETE, and appends it (never refuses).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from nereus.adapters.clock import SystemClock
from nereus.adapters.http.api import TimerApi
from nereus.adapters.kafka.service import KafkaService
from nereus.adapters.metering import RateLimiter
from nereus.adapters.tenancy import Tenancy
from nereus.kernel.keys import DEFAULT_TENANT
from nereus.service.arguments import schedule_record
from tests.support import kafka_env
from tests.support.kafka_cluster import Topics, service_config, wait_until
from tests.support.kafka_env import create_topic, unique_topic

kafka_bootstrap = kafka_env.kafka_bootstrap
REFUSED = int(os.environ.get("NEREUS_KAFKA_REFUSED_DELETES", "200"))
LIVE = int(os.environ.get("NEREUS_KAFKA_LIVE_DELETES", "10"))


def _api(service: KafkaService) -> TimerApi:
    """The HTTP routes over `service`, one appending DELETE a second, on a rate clock that
    never moves: the bucket's one token, once spent, never comes back."""
    tenancy = Tenancy.open_default()
    policy = tenancy.tenants[DEFAULT_TENANT]
    tenancy.tenants[DEFAULT_TENANT] = dataclasses.replace(policy, max_appending_deletes_per_s=1)
    return TimerApi(service, tenancy=tenancy, rate_limiter=RateLimiter(lambda: 1000.0))


def _delete(api: TimerApi, queue: str, key: str) -> tuple[int, dict[str, str], Any]:
    """A DELETE through the routes: status, headers, JSON body."""
    response = asyncio.run(api.respond("DELETE", f"/api/v1/timers/{queue}/{key}", "", b"", {}))
    return response.status, dict(response.headers), json.loads(response.body)


def test_a_drained_credential_is_refused_only_what_cancels_nothing(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    destination = create_topic(
        kafka_bootstrap, unique_topic("dest"), config={"message.timestamp.type": "LogAppendTime"}
    )
    topics = Topics.unique(destination)
    owner = KafkaService(
        service_config(kafka_bootstrap, topics, tmp_path / "owner"),
        clock=SystemClock(assumed_error_ms=2),
    )
    visitor = KafkaService(
        service_config(kafka_bootstrap, topics, tmp_path / "visitor", own_shards=False),
        clock=SystemClock(assumed_error_ms=2),
    )
    q = topics.queue
    try:
        owner.start()
        visitor.start()
        wait_until(lambda: owner.shard_states() == {0: "active"}, 60, "the shard active")
        live = [f"live-{i}" for i in range(LIVE)]
        items = [schedule_record(q, key, b"x", delay_ms=600_000) for key in ["done", *live]]
        assert [o.code for o in owner.execute(items, 30)] == ["scheduled"] * (LIVE + 1)
        api = _api(owner)
        status, _headers, doc = _delete(api, q, "done")
        assert (status, doc["status"]) == (200, "canceled")  # the one token
        store = owner.owned_store(0)
        assert store is not None
        before = store.meta.position
        for _ in range(REFUSED):
            status, headers, doc = _delete(api, q, "done")
            assert (status, doc["error"]["code"]) == (429, "rate_limited")
            assert headers["Retry-After"] == "1"
        # Nothing reached the shard's partition: the next command lands right after.
        (probe,) = owner.execute([schedule_record(q, "probe", b"p", delay_ms=600_000)], 30)
        assert (probe.code, probe.position) == ("scheduled", before + 1)
        # A pending timer's DELETE always goes through.
        for key in live:
            status, _headers, doc = _delete(api, q, key)
            assert (status, doc["status"]) == (200, "canceled"), (key, doc)
        assert store.meta.position == before + 1 + LIVE
        # A process without the shard cannot tell; it appends, and the log answers.
        status, _headers, doc = _delete(_api(visitor), q, "done")
        assert (status, doc["status"]) == (200, "absent")
        wait_until(lambda: store.meta.position == before + 2 + LIVE, 30, "the visitor's cancel")
    finally:
        visitor.close()
        owner.close()
