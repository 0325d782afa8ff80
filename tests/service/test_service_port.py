"""The application layer's port (`service.port.TimerService`) and the calls made over it
(`service.calls.TimerCalls`), one suite run over both implementations: the embedded shard
(`Nereus.open(DIR).service`) and Kafka mode (`KafkaNereus.connect(..., data_dir=...)`, which
owns every shard of its commands topic) against the real broker.

The expected answers are the rules' (specs/library.md, specs/codes.md), written here: a new
key is `scheduled`, an identical retry `unchanged`, new content under the same key
`rescheduled`, a pending timer's cancel `canceled` and a second one `absent`, a stale
`expected_version` `rejected`/`version_mismatch`; a sync call and its `_async` twin answer
alike; the port's reads and usage agree with what was committed; a unit of cancels from a
caller with no token left is never refused when it cancels a pending timer.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from nereus.adapters.clock import SystemClock
from nereus.adapters.kafka.library import KafkaNereus
from nereus.adapters.local.embedded import Nereus
from nereus.service.arguments import cancel_record, schedule_record
from nereus.service.calls import TimerCalls
from nereus.service.port import TimerService
from nereus.service.results import Result
from tests.support import kafka_env
from tests.support.kafka_cluster import Topics, wait_until

SHARDS = 2
QUEUE_DELAY_MS = 600_000  # nothing in this suite is due while it runs
LOG_APPEND = {"message.timestamp.type": "LogAppendTime"}


def _embedded(tmp: Path) -> Iterator[TimerCalls]:
    with Nereus.open(str(tmp / "embedded"), assume_clock_error_ms=5) as n:
        n.start()
        yield n


def _kafka(tmp: Path) -> Iterator[TimerCalls]:
    bootstrap = os.environ.get(kafka_env.ENV, "").strip()
    if not bootstrap:
        pytest.fail(f"{kafka_env.ENV} is not set: the Kafka half of this suite needs a broker")
    dest = kafka_env.create_topic(
        bootstrap, kafka_env.unique_topic("dest"), partitions=1, config=LOG_APPEND
    )
    topics = Topics.unique(dest)
    with KafkaNereus.connect(
        bootstrap,
        data_dir=str(tmp / "kafka"),
        clock=SystemClock(assumed_error_ms=2),
        commands_topic=topics.commands,
        replies_topic=topics.replies,
        group=topics.group,
        shards=SHARDS,
        destination_topics={"q": topics.destination},
    ) as lib:
        wait_until(
            lambda: lib.service.readiness() == [] and len(lib.service.shard_states()) == SHARDS,
            60,
            "the library owns every shard",
        )
        yield lib


@pytest.fixture(scope="module", params=["embedded", "kafka"])
def calls(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TimerCalls]:
    tmp = tmp_path_factory.mktemp(request.param)
    yield from (_embedded(tmp) if request.param == "embedded" else _kafka(tmp))


def _codes(results: list[Result]) -> list[str]:
    return [r.code for r in results]


def test_commands_answer_by_the_rules(calls: TimerCalls) -> None:
    first = calls.schedule("q", "a-1", b"x", delay_ms=QUEUE_DELAY_MS, txn="t1")
    assert (first.ok, first.status, first.code) == (True, "scheduled", "scheduled")
    assert first.queue == "q" and first.timer_key == "a-1" and first.txn == "t1"
    assert first.message is None and first.deliver_at_ms is not None
    same = calls.schedule("q", "a-1", b"x", delay_ms=QUEUE_DELAY_MS, txn="t1")
    upsert = calls.schedule("q", "a-1", b"y", delay_ms=QUEUE_DELAY_MS, txn="t2")
    moved = calls.reschedule("q", "a-1", delay_ms=QUEUE_DELAY_MS + 1000)
    stale = calls.cancel("q", "a-1", expected_version=1)
    gone = calls.cancel("q", "a-1")
    again = calls.cancel("q", "a-1")
    never = calls.cancel("q", "a-never")
    assert _codes([same, upsert, moved, stale, gone, again, never]) == [
        "unchanged",
        "rescheduled",
        "rescheduled",
        "version_mismatch",
        "canceled",
        "absent",
        "absent",
    ]
    assert stale.status == "rejected" and not stale.ok and stale.message is not None
    assert again.status == "absent" and not again.ok
    # One id per (tenant, queue, key), whichever implementation derived it.
    assert first.message_id == upsert.message_id == gone.message_id


def test_a_refusal_is_an_answer_with_the_same_message(calls: TimerCalls) -> None:
    ceiling = calls.kernel_config.max_payload_bytes
    big = calls.schedule("q", "b-big", b"x" * (ceiling + 1), delay_ms=QUEUE_DELAY_MS)
    assert (big.ok, big.status, big.code) == (False, "rejected", "payload_too_large")
    assert big.message == f"{ceiling + 1} bytes > ceiling {ceiling}"
    assert calls.peek("q", "b-big").found is False


def test_the_sync_and_async_forms_agree(calls: TimerCalls) -> None:
    def sync() -> list[Result]:
        return [
            calls.schedule("q", "c-sync", b"x", delay_ms=QUEUE_DELAY_MS, txn="c"),
            calls.schedule("q", "c-sync", b"x", delay_ms=QUEUE_DELAY_MS, txn="c"),
            calls.reschedule("q", "c-sync", delay_ms=QUEUE_DELAY_MS),
            calls.cancel("q", "c-sync"),
        ]

    async def both() -> list[Result]:
        return [
            await calls.schedule_async("q", "c-async", b"x", delay_ms=QUEUE_DELAY_MS, txn="c"),
            await calls.schedule_async("q", "c-async", b"x", delay_ms=QUEUE_DELAY_MS, txn="c"),
            await calls.reschedule_async("q", "c-async", delay_ms=QUEUE_DELAY_MS),
            await calls.cancel_async("q", "c-async"),
        ]

    expected = ["scheduled", "unchanged", "rescheduled", "canceled"]
    assert _codes(sync()) == expected
    assert _codes(asyncio.run(both())) == expected
    calls.schedule("q", "c-read", b"payload", delay_ms=QUEUE_DELAY_MS)
    peeked = calls.peek("q", "c-read")
    assert asyncio.run(calls.peek_async("q", "c-read")) == peeked
    assert peeked.found and peeked.status == "SCHEDULED" and peeked.payload == b"payload"


def test_reads_and_usage_show_what_was_committed(calls: TimerCalls) -> None:
    service: TimerService = calls.service
    before = service.tenant_usage("default")
    for key in ("z-3", "z-1", "z-2"):
        assert calls.schedule("q", key, b"12345", delay_ms=QUEUE_DELAY_MS).ok
    after = service.tenant_usage("default")
    assert after.live - before.live == 3
    assert after.bytes - before.bytes == 15
    page = calls.list("q", after="z-", limit=2)
    assert [row.timer_key for row in page.rows] == ["z-1", "z-2"]
    assert page.truncated and page.next_after == "z-2"
    rest = asyncio.run(calls.list_async("q", after=page.next_after, limit=2))
    assert [row.timer_key for row in rest.rows] == ["z-3"] and not rest.truncated
    assert all(row.payload is None and row.claimed is None for row in rest.rows)
    rows, truncated = service.list_timers("q", "z-", 10, tenant="default")
    assert [m.timer_key for m in rows] == ["z-1", "z-2", "z-3"] and not truncated
    assert service.peek("q", "z-1", tenant="default") == calls.peek("q", "z-1")
    assert 0.0 < service.map_usage() < 0.95
    ok, doc = service.health()
    assert ok and doc["ok"] is True
    assert service.readiness() == []


def test_a_pending_timers_cancel_is_never_refused_for_want_of_a_token(
    calls: TimerCalls,
) -> None:
    service = calls.service
    asked: list[bool] = []

    def no_token() -> bool:
        asked.append(True)
        return False

    assert calls.schedule("q", "d-1", b"x", delay_ms=QUEUE_DELAY_MS).ok
    outcomes = asyncio.run(service.cancel_async([cancel_record("q", "d-1")], no_token, 30))
    assert outcomes is not None and [str(o.code) for o in outcomes] == ["canceled"]
    # Nothing pending under the key: answered `absent` without an entry, or refused.
    nothing = asyncio.run(service.cancel_async([cancel_record("q", "d-none")], no_token, 30))
    assert nothing is None or [str(o.code) for o in nothing] == ["absent"]


def test_the_port_executes_a_unit_in_order_and_refuses_what_the_log_cannot_carry(
    calls: TimerCalls,
) -> None:
    service = calls.service
    items = [
        schedule_record("q", "e-1", b"x", delay_ms=QUEUE_DELAY_MS),
        cancel_record("q", "e-1"),
        cancel_record("q", "e-1"),
    ]
    outcomes = service.execute(items, 30)
    assert [str(o.code) for o in outcomes] == ["scheduled", "canceled", "absent"]
    late = asyncio.run(service.execute_async([cancel_record("q", "e-1")], 30))
    assert [str(o.code) for o in late] == ["absent"]
    with pytest.raises((TypeError, ValueError)):
        service.execute([("not a record", None)], 30)  # type: ignore[list-item]
