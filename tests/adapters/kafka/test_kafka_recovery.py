"""Recovery at scale in Kafka mode, against the real broker: thousands of attempts in flight.

Each scenario runs `nereus serve --kafka` processes (6 shards) whose commands topic is on the
shared broker and whose destination topic is on a broker of the module's own
(`--destination-bootstrap`). A few thousand timers come due together while that broker is
paused (SIGSTOP: it stops answering, connections stay open), so every send waits in an open
transaction, and the owner is killed once `/metrics` shows them all admitted. The broker is
resumed a seeded moment before the kill, so some transactions commit before it and some never
do (the broker still appends what the dead producer had sent, in a transaction nobody will
commit): recovery meets records that are there, and records that are in the log but never
visible.

* **restart**: kill -9 the one process and restart it on the same data directory;
* **takeover**: two processes; kill -9 the one that owns the in-flight attempts; the other
  takes its shards over once the group notices;
* **rejoin**: two processes; kill one, the other takes every shard, the killed one comes
  back and the cooperative rebalance moves shards back to it while timers fire and clients
  keep scheduling: no request waits for recovery, none answers 503.

Every timer is delivered exactly once with the transactional capability (the default), at
or after its deliverAt by broker time, and every in-flight attempt is settled without a
single UNKNOWN: found by evidence, or proven absent by the fence. With the idempotent
capability (`restart` only) the same holds except that not-found attempts are UNKNOWN and
duplicates may stand behind them. Each test prints its recovery figures: from the restart
(or the kill) to the first new delivery and to the last in-flight attempt settled.

Sizes: NEREUS_RECOVERY_TIMERS (default 2500) timers in flight at the kill.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import kafka_env
from tests.support.kafka_cluster import (
    Audit,
    ServiceProc,
    Topics,
    all_delivered,
    audit,
    check_delivery,
    check_stores_are_prefixes,
    keys_on_shards,
    metric_sum,
    open_obligations,
    recovery_figures,
    schedule_many,
    schedule_op,
    wait_until,
)
from tests.support.kafka_env import create_topic, unique_topic
from tests.support.own_broker import Broker, own_broker_fixture

kafka_bootstrap = kafka_env.kafka_bootstrap
SHARDS = 6  # a pair splits them 3 and 3: 2,500 in flight fit the per-lane claim bound
DEST_PARTITIONS = 4
TIMERS = int(os.environ.get("NEREUS_RECOVERY_TIMERS", "2500"))
SEED = int(os.environ.get("NEREUS_RECOVERY_SEED", "1501"))


dest_broker = own_broker_fixture("kafka-destination")


def _keys(prefix: str, n: int, shards: set[int] | None = None) -> list[str]:
    return keys_on_shards(prefix, n, SHARDS, shards)


def _fire_and_kill(
    dest: Broker,
    owner: ServiceProc,
    scheduler: ServiceProc,
    keys: list[str],
    *,
    resume_first: bool = True,
) -> set[str]:
    """Pause the destination, let `keys` come due together, and kill `owner` once they are
    all admitted: a seeded moment after the destination answers again (some transactions
    commit first), or while it is still paused (`resume_first` False: what the producer had
    sent lands when the broker resumes, what it still held never does). Returns the killed
    process's tenures."""
    rng = random.Random(SEED)
    dest.pause()
    try:
        schedule_many(scheduler, keys, delay_ms=1_500)
        wait_until(lambda: open_obligations(owner) >= len(keys), 120, "every timer admitted")
        killed = set(owner.tenures())
        if not resume_first:
            owner.kill()
    finally:
        dest.resume()
    if resume_first:
        # Short: on an idle machine every answer, commit and outcome of 2,000 attempts lands
        # in about 0.1 s, and a kill after that leaves nothing in flight to recover.
        time.sleep(rng.uniform(0.0, 0.03))
        owner.kill()
    return killed


def _proc(
    name: str, bootstrap: str, dest: Broker, topics: Topics, tmp_path: Path, *extra: str
) -> ServiceProc:
    args = ("--destination-bootstrap", dest.bootstrap, *extra)
    return ServiceProc(name, bootstrap, topics, tmp_path / name, shards=SHARDS, extra=args)


def _pair(bootstrap: str, dest: Broker, tmp_path: Path) -> tuple[Topics, ServiceProc, ServiceProc]:
    topics = Topics.unique(_destination(dest.bootstrap))
    a = _proc("a", bootstrap, dest, topics, tmp_path)
    b = _proc("b", bootstrap, dest, topics, tmp_path)
    a.start().wait_serving()
    b.start().wait_serving()
    wait_until(
        lambda: (
            a.active_shards() | b.active_shards() == set(range(SHARDS))
            and bool(a.active_shards())
            and bool(b.active_shards())
        ),
        90,
        "the shards spread over both processes",
    )
    return topics, a, b


def _destination(bootstrap: str) -> str:
    return create_topic(
        bootstrap,
        unique_topic("dest"),
        partitions=DEST_PARTITIONS,
        config={"message.timestamp.type": "LogAppendTime"},
    )


def _audit(bootstrap: str, dest: Broker, topics: Topics) -> Audit:
    return audit(bootstrap, topics, SHARDS, DEST_PARTITIONS, destination_bootstrap=dest.bootstrap)


def _check(a: Audit, keys: list[str], delivery: str, where: str) -> dict[str, int]:
    counts = check_delivery(a, keys, where=where)
    if delivery == "transactional":
        assert not counts.get("duplicates"), (where, counts)
        assert not a.unknown_generations, (where, len(a.unknown_generations))
    return counts


@pytest.mark.parametrize("delivery", ["transactional", "idempotent"])
def test_kill_mid_fire_and_restart(
    kafka_bootstrap: str, dest_broker: Broker, tmp_path: Path, delivery: str
) -> None:
    topics = Topics.unique(_destination(dest_broker.bootstrap))
    a = _proc("a", kafka_bootstrap, dest_broker, topics, tmp_path, "--delivery", delivery)
    keys = _keys("k", TIMERS)
    after = _keys("n", 200)
    try:
        a.start().wait_serving()
        wait_until(lambda: a.active_shards() == set(range(SHARDS)), 60, "every shard active")
        # The idempotent producer's records land the moment the broker answers, so its
        # owner dies before that: otherwise nearly every attempt would settle before the kill.
        killed = _fire_and_kill(dest_broker, a, a, keys, resume_first=delivery == "transactional")
        restarted_ms = int(time.time() * 1000)
        a.start().wait_serving()
        # New timers, due at once: the restarted owner fires them while it settles.
        schedule_many(a, after, delay_ms=0)
        wait_until(all_delivered([a], keys + after), 180, "every timer DELIVERED")
        # Each shard's commits (fold + Kafka transaction) are timed in /metrics.
        assert metric_sum(a, "nereus_commit_duration_seconds_count") > 0
    finally:
        a.stop()
    result = _audit(kafka_bootstrap, dest_broker, topics)
    where = f"restart ({delivery})"
    counts = _check(result, keys + after, delivery, where)
    check_stores_are_prefixes(result, [a.data], where=where)
    figures = recovery_figures(result, killed, restarted_ms)
    print(figures.line(where), counts)
    assert figures.in_flight >= min(TIMERS, 2_000), figures
    if delivery == "transactional":
        assert figures.unknown == 0, figures
    else:
        assert figures.absent == 0, figures  # no fence, so no proof of absence
        assert figures.unknown > 0, figures  # what the producer still held never landed


def test_kill_and_takeover_by_the_other_process(
    kafka_bootstrap: str, dest_broker: Broker, tmp_path: Path
) -> None:
    topics, a, b = _pair(kafka_bootstrap, dest_broker, tmp_path)
    try:
        owned = a.active_shards()
        keys = _keys("t", TIMERS, owned)
        after = _keys("u", 100, owned)
        killed = _fire_and_kill(dest_broker, a, b, keys)
        killed_ms = int(time.time() * 1000)
        wait_until(lambda: b.active_shards() == set(range(SHARDS)), 60, "b owns every shard")
        taken_ms = int(time.time() * 1000)
        schedule_many(b, after, delay_ms=0)
        wait_until(all_delivered([b], keys + after), 180, "every timer DELIVERED")
    finally:
        a.kill()
        b.stop()
    result = _audit(kafka_bootstrap, dest_broker, topics)
    counts = _check(result, keys + after, "transactional", "takeover")
    check_stores_are_prefixes(result, [a.data, b.data], where="takeover")
    figures = recovery_figures(result, killed, taken_ms)
    print(
        figures.line("takeover"),
        f"(the group moved the shards {(taken_ms - killed_ms) / 1000:.1f} s after the kill)",
        counts,
    )
    assert figures.in_flight >= min(TIMERS, 2_000) * 3 // 4, figures
    assert figures.unknown == 0, figures


def test_rejoin_rebalances_while_clients_keep_scheduling(
    kafka_bootstrap: str, dest_broker: Broker, tmp_path: Path
) -> None:
    topics, a, b = _pair(kafka_bootstrap, dest_broker, tmp_path)
    keys: list[str] = []
    slow: list[float] = []
    refused: list[Any] = []
    try:
        a.kill()
        wait_until(lambda: b.active_shards() == set(range(SHARDS)), 60, "b owns every shard")
        # A steady fire across every shard while a comes back and takes its share.
        first = _keys("w", TIMERS)
        schedule_many(b, first, delay_ms=2_000)
        keys.extend(first)
        a.start().wait_serving()
        deadline = time.monotonic() + 20
        i = 0
        while time.monotonic() < deadline:
            batch = [f"r{i + j}" for j in range(20)]
            i += 20
            started = time.monotonic()
            status, doc = b.http(
                "POST", "/api/v1/timers", {"operations": [schedule_op(k, 300) for k in batch]}
            )
            took = time.monotonic() - started
            if status != 200:
                refused.append((status, doc))
            else:
                keys.extend(batch)
            slow.append(took)
            moved = a.active_shards()
            if moved and len(slow) > 20 and moved | b.active_shards() == set(range(SHARDS)):
                break
            time.sleep(0.05)
        assert a.active_shards(), "no shard moved back to the rejoined process"
        wait_until(all_delivered([a, b], keys), 180, "every timer DELIVERED")
    finally:
        a.stop()
        b.stop()
    assert not refused, refused[:3]
    result = _audit(kafka_bootstrap, dest_broker, topics)
    counts = _check(result, keys, "transactional", "rejoin")
    check_stores_are_prefixes(result, [a.data, b.data], where="rejoin")
    worst = max(slow)
    print(
        f"rejoin: {len(keys)} timers; {len(slow)} POSTs during the rebalance, "
        f"slowest {worst:.2f} s; {counts}"
    )
    assert worst < 10.0, slow


def test_sigterm_during_recovery_stops_within_the_stop_timeout(
    kafka_bootstrap: str, dest_broker: Broker, tmp_path: Path
) -> None:
    """Restarted while the destination still does not answer, the owner cannot fence its
    predecessor, so its recovery cannot finish: SIGTERM must still stop it, by itself and in
    time. Started again once the destination is back, it settles everything."""
    topics = Topics.unique(_destination(dest_broker.bootstrap))
    a = _proc("a", kafka_bootstrap, dest_broker, topics, tmp_path, "--stop-timeout-s", "20")
    keys = _keys("s", TIMERS)
    try:
        a.start().wait_serving()
        wait_until(lambda: a.active_shards() == set(range(SHARDS)), 60, "every shard active")
        dest_broker.pause()
        try:
            schedule_many(a, keys, delay_ms=1_000)
            wait_until(lambda: open_obligations(a) >= len(keys), 120, "every timer admitted")
            a.kill()
            a.start().wait_serving()

            def recovering() -> bool:
                started = [e for e in a.events() if e.get("event") == "recovery_started"]
                return len(started) == SHARDS

            wait_until(recovering, 60, "recovery started on every shard")
            assert open_obligations(a) >= len(keys)  # nothing could be settled
            began = time.monotonic()
            code = a.stop(timeout_s=60)
            took_s = time.monotonic() - began
        finally:
            dest_broker.resume()
        stopped = [e for e in a.events() if e.get("event") == "stopped"]
        print(f"sigterm during recovery: stopped in {took_s:.2f} s (exit code {code})")
        assert code == 0 and stopped, a.log_tail()
        assert took_s < 20, took_s
        a.start().wait_serving()
        wait_until(all_delivered([a], keys), 180, "every timer DELIVERED")
    finally:
        a.stop()
    result = _audit(kafka_bootstrap, dest_broker, topics)
    _check(result, keys, "transactional", "sigterm during recovery")
