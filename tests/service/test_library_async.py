"""The async calls: `schedule_async`, `reschedule_async`, `cancel_async`, `peek_async` and
`list_async` answer like their sync forms, and a command awaits its durable commit without
blocking the event loop and without a thread of its own.

Hundreds of commands are made to wait at once by holding the runtime's tick lock (its
commit cannot start): meanwhile another task of the loop must keep running, and no thread
may have been started per call; released, every one of them completes.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from nereus import Nereus
from nereus.adapters.clock import SimulatedClock
from tests.support.runtime_harness import T0_MS

CONCURRENT = 500


@pytest.fixture
def nereus(tmp_path: Path) -> Iterator[Nereus]:
    with Nereus.open(str(tmp_path), clock=SimulatedClock(T0_MS)) as n:
        yield n


def test_the_async_calls_answer_like_the_sync_ones(nereus: Nereus) -> None:
    nereus.start()

    async def main() -> None:
        r = await nereus.schedule_async("q", "k", b"x", delay_ms=timedelta(minutes=1), txn="t1")
        assert (r.ok, r.status, r.deliver_at_ms) == (True, "scheduled", T0_MS + 60_000)
        same = await nereus.schedule_async("q", "k", b"x", delay_ms=60_000, txn="t1")
        assert same.status == "unchanged"
        moved = await nereus.reschedule_async("q", "k", delay_ms=120_000, txn="t2")
        assert (moved.status, moved.deliver_at_ms) == ("rescheduled", T0_MS + 120_000)
        p = await nereus.peek_async("q", "k")
        assert p == nereus.peek("q", "k") and p.generation == 2
        await nereus.schedule_async("q", "j", b"y", delay_ms=60_000)
        page = await nereus.list_async("q", limit=1)
        assert [row.timer_key for row in page.rows] == ["j"]
        assert (page.truncated, page.next_after) == (True, "j")
        rest = await nereus.list_async("q", after="j")
        assert [row.timer_key for row in rest.rows] == ["k"] and not rest.truncated
        assert rest.rows[0].payload is None
        gone = await nereus.cancel_async("q", "k")
        assert (gone.ok, gone.status) == (True, "canceled")
        assert (await nereus.cancel_async("q", "k")).status == "absent"
        refused = await nereus.schedule_async("q", "a/b/" * 60, b"x")
        assert (refused.ok, refused.status, refused.code) == (False, "rejected", "invalid_identity")
        with pytest.raises(TypeError, match="delay_ms"):
            await nereus.schedule_async("q", "k", b"x", delay_ms="soon")  # type: ignore[arg-type]

    asyncio.run(main())


def test_hundreds_of_awaited_commits_leave_the_loop_running(nereus: Nereus) -> None:
    nereus.start()
    hold = nereus.runtime._tick_lock

    async def main() -> None:
        ticks = 0
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.001)

        spinner = asyncio.create_task(ticker())
        threads_before = threading.active_count()
        hold.acquire()  # no commit can start until it is released
        try:
            calls = [
                asyncio.create_task(nereus.schedule_async("q", f"k{i}", b"x", delay_ms=60_000))
                for i in range(CONCURRENT)
            ]
            await asyncio.sleep(0.05)
            ticks_at_start = ticks
            while ticks < ticks_at_start + 50:
                await asyncio.sleep(0.001)
            assert not any(c.done() for c in calls), "a command completed without its commit"
            assert threading.active_count() <= threads_before + 1, "threads were started"
        finally:
            hold.release()
        results = await asyncio.wait_for(asyncio.gather(*calls), 60)
        stop.set()
        await spinner
        assert [r.status for r in results] == ["scheduled"] * CONCURRENT

    asyncio.run(main())
    assert nereus.store.meta.counters.scheduled == CONCURRENT


def test_the_async_calls_need_the_runtime_running(nereus: Nereus) -> None:
    before = nereus.store.log_last_position

    async def main() -> None:
        with pytest.raises(RuntimeError, match="start"):
            await nereus.schedule_async("q", "k", b"x")

    asyncio.run(main())
    assert nereus.store.log_last_position == before


def test_run_async_and_the_async_calls_share_one_event_loop(nereus: Nereus) -> None:
    async def main() -> None:
        task = asyncio.create_task(nereus.run_async())
        await asyncio.sleep(0)  # the task starts the runtime thread
        r = await nereus.schedule_async("q", "k", b"x", delay_ms=60_000)
        assert r.status == "scheduled"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
