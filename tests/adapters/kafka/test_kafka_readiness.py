"""Kafka mode's readiness on the real broker (specs/http.md): not ready before the group's
assignment reached the process and its shards caught up, ready once every shard it was given
is active, never ready while a shard is halted (here: the commands topic's start deleted and
no snapshot, a gap the shard must not guess past), and `stopping` once it closes. A process
that owns shards refuses an unbounded clock at `KafkaNereus.connect`, before it joins.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from nereus.adapters.clock import SimulatedClock, SystemClock
from nereus.adapters.http.api import TimerApi
from nereus.adapters.kafka.library import KafkaNereus
from nereus.adapters.kafka.service import KafkaService
from nereus.service.arguments import schedule_record
from nereus.service.clock_bound import ClockUnbounded
from tests.adapters.kafka.test_kafka_snapshots import _delete_commands_before
from tests.support import kafka_env
from tests.support.kafka_cluster import Topics, service_config, wait_until
from tests.support.kafka_env import create_topic, unique_topic
from tests.support.runtime_harness import T0_MS

kafka_bootstrap = kafka_env.kafka_bootstrap


def _service(bootstrap: str, data: Path, topics: Topics, shards: int = 1) -> KafkaService:
    return KafkaService(
        service_config(bootstrap, topics, data, shards=shards),
        clock=SystemClock(assumed_error_ms=2),  # bounded on any host
    )


def _readyz(service: KafkaService) -> tuple[int, dict[str, Any]]:
    status, _, body = TimerApi(service).handle("GET", "/readyz", b"")
    return status, json.loads(body)


def _codes(service: KafkaService) -> set[tuple[str, int | None]]:
    return {(r.code, r.shard) for r in service.readiness()}


def test_ready_only_after_the_assignment_and_recovery(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = Topics.unique(create_topic(kafka_bootstrap, unique_topic("dest")))
    service = _service(kafka_bootstrap, tmp_path / "a", topics, shards=2)
    try:
        status, doc = _readyz(service)
        assert status == 503 and [r["code"] for r in doc["reasons"]] == ["ownership_unsettled"]
        service.start()
        seen: list[set[tuple[str, int | None]]] = []
        deadline = time.monotonic() + 60
        while (codes := _codes(service)) and time.monotonic() < deadline:
            seen.append(codes)
            time.sleep(0.01)
        assert codes == set(), f"never ready: {codes}"
        assert seen and ("ownership_unsettled", None) in seen[0], "asked before the join"
        # Ready means every shard given to this process is serving.
        assert service.ownership.joined and service.shard_states() == {0: "active", 1: "active"}
        assert _readyz(service) == (200, {"ready": True})
        allowed = {"ownership_unsettled", "shard_recovering"}
        assert all(code in allowed for codes in seen for code, _ in codes), seen
    finally:
        service.close()
    assert ("stopping", None) in _codes(service)
    assert _readyz(service)[0] == 503


def test_a_shard_halted_on_a_gap_is_never_ready(kafka_bootstrap: str, tmp_path: Path) -> None:
    topics = Topics.unique(create_topic(kafka_bootstrap, unique_topic("dest")))
    a = _service(kafka_bootstrap, tmp_path / "a", topics)
    try:
        a.start()
        wait_until(lambda: a.shard_states() == {0: "active"}, 30, "A's shard active")
        items = [schedule_record(topics.queue, "k", b"x", delay_ms=3_600_000)]
        assert [o.code for o in a.execute(items, 30)] == ["scheduled"]
    finally:
        a.close()
    _delete_commands_before(kafka_bootstrap, topics.commands, 1)  # no snapshot covers it
    b = _service(kafka_bootstrap, tmp_path / "b", topics)
    try:
        b.start()
        wait_until(lambda: b.shard_states() == {0: "halted"}, 60, "B's shard halted")
        status, doc = _readyz(b)
        assert status == 503 and doc["ready"] is False
        (reason,) = doc["reasons"]
        assert (reason["code"], reason["shard"]) == ("shard_halted", 0)
        assert "starts at offset 1, not 0" in reason["detail"]
    finally:
        b.close()


def test_an_owner_refuses_an_unbounded_clock_before_joining(tmp_path: Path) -> None:
    clock = SimulatedClock(T0_MS)
    clock.lose_sync()
    with pytest.raises(ClockUnbounded) as info:
        # Nothing listens at 127.0.0.1:1: the refusal comes before any contact.
        KafkaNereus.connect("127.0.0.1:1", data_dir=str(tmp_path / "d"), clock=clock)
    assert "assume_clock_error_ms=" in str(info.value) and info.value.measured == "simulated"
    assert not (tmp_path / "d").exists()
    # Allowed, the service says why it is not ready (here also: not started, no broker).
    service = KafkaService(
        service_config("127.0.0.1:1", Topics.unique("dest"), tmp_path / "d"), clock=clock
    )
    assert _codes(service) == {("ownership_unsettled", None), ("clock_unbounded", None)}
