"""Reading deliveries from another process, and from asyncio: `nereus.open_consumer`,
`nereus.open_async_consumer`, `Nereus.async_consumer`.

The public names import from `nereus`. A process that is not the service opens the data
directory's local destination for reading beside the running service (a real `nereus
serve` child here) and sees every timer it delivers; a directory without a destination,
and one this process has open itself, are refused. A waiting consumer, sync or async,
looks at the topic once and then sleeps until the writer (another process) commits a
record: it does not poll. The async consumer keeps the sync consumer's at-least-once
rules: a record left by `break` or an exception is handed out again, `close` commits what
was handled, and without auto commit only `commit()` commits; a hypothesis property runs
random histories of consumers that stop at random points and checks that each new one
starts exactly at the group's position and that no record is ever skipped.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nereus
from nereus import (
    AsyncConsumer,
    ConsumerBusy,
    LocalConsumer,
    LocalRecord,
    Nereus,
    open_async_consumer,
    open_consumer,
)
from nereus.adapters.clock import SimulatedClock
from nereus.adapters.local.destination import LocalDestination
from nereus.runtime.destination import PreparedPublish, Send
from tests.support.runtime_harness import T0_MS
from tests.support.serve_process import serve, stop, wait_serving

ROOT = Path(__file__).resolve().parents[3]
WAIT_S = 30.0

# Another process that writes the destination: `python -c WRITER DEST QUEUE COUNT GAP_S`.
WRITER = """
import sys, time, uuid
from nereus.adapters.local.destination import LocalDestination
from nereus.runtime.destination import PreparedPublish, Send
dest = LocalDestination(sys.argv[1])
dest.open("writer")
for i in range(int(sys.argv[3])):
    time.sleep(float(sys.argv[4]))
    p = PreparedPublish(
        "local", sys.argv[2], None, b"w%d" % i, (), "m%d" % i, 1, "t", 0, None, False
    )
    dest.submit([Send("m%d.1.%s" % (i, uuid.uuid4().hex[:6]), p)], int(time.time() * 1000))
dest.close()
"""


def fill(data: Path, queue: str, count: int) -> None:
    """`count` records p0.. in `queue` of DATA's local destination, written by this process
    (which then closes it: the consumers under test open their own)."""
    dest = LocalDestination(str(data / "destination"))
    try:
        sends = [
            Send(
                f"m{i}.1.{uuid.uuid4().hex[:6]}",
                PreparedPublish(
                    "local", queue, None, f"p{i}".encode(), (), f"m{i}", 1, "t", 0, None, False
                ),
            )
            for i in range(count)
        ]
        if sends:
            dest.submit(sends, 1_000)
    finally:
        dest.close()


def _offsets(records: list[LocalRecord]) -> list[int]:
    return [r.offset for r in records]


def test_the_consumers_are_public_names_of_nereus() -> None:
    for name in ("open_consumer", "open_async_consumer", "AsyncConsumer"):
        assert name in nereus.__all__
    from nereus.adapters.local import async_consumer, consumer  # noqa: PLC0415

    assert nereus.open_consumer is consumer.open_consumer
    assert nereus.open_async_consumer is async_consumer.open_async_consumer
    assert nereus.AsyncConsumer is async_consumer.AsyncConsumer


def test_open_consumer_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no local destination"):
        open_consumer(tmp_path / "nowhere", "q", group="g")
    with (
        Nereus.open(str(tmp_path / "data"), assume_clock_error_ms=5),
        pytest.raises(ValueError, match="this process has"),
    ):
        # LMDB allows one environment per file and process: use that Nereus's consumer().
        open_consumer(tmp_path / "data", "q", group="g")
    # Closed, the directory is anybody's to read.
    with open_consumer(tmp_path / "data", "q", group="g") as consumer:
        assert isinstance(consumer, LocalConsumer)
        assert consumer.poll() == []


def test_the_group_is_shared_with_another_process_and_one_at_a_time(tmp_path: Path) -> None:
    fill(tmp_path, "q", 3)
    with open_consumer(tmp_path, "q", group="g") as consumer:
        assert _offsets(list(consumer.records(limit=2))) == [0, 1]
        with pytest.raises(ConsumerBusy):
            open_async_consumer(tmp_path, "q", group="g")

    async def rest() -> list[LocalRecord]:
        async with open_async_consumer(tmp_path, "q", group="g") as c:
            return [r async for r in c.records(idle_timeout_s=0.2)]

    assert _offsets(asyncio.run(rest())) == [2]


def _schedule(url: str, key: str, delay_ms: int) -> None:
    op = {"op": "schedule", "queue": "q", "timerKey": key, "delayMs": delay_ms}
    op["payload"] = base64.b64encode(key.encode()).decode()
    body = json.dumps({"operations": [op]}).encode()
    request = urllib.request.Request(f"{url}/api/v1/timers", data=body, method="POST")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=WAIT_S) as answer:
        assert json.loads(answer.read())["results"][0]["ok"]


@pytest.fixture
def service(tmp_path: Path) -> Iterator[str]:
    """A `nereus serve` child process on tmp_path/data; yields its URL."""
    proc, port = serve(tmp_path / "data")
    try:
        wait_serving(proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


def test_another_process_reads_while_the_service_writes(tmp_path: Path, service: str) -> None:
    keys = [f"k{i}" for i in range(8)]
    _schedule(service, "first", 0)  # the destination exists once something was delivered
    with open_consumer(tmp_path / "data", "q", group="sync") as first:
        assert [r.payload for r in first.records(limit=1, idle_timeout_s=WAIT_S)] == [b"first"]

    async def read_while_written() -> list[tuple[bytes, float]]:
        got: list[tuple[bytes, float]] = []
        async with open_async_consumer(tmp_path / "data", "q", group="async") as c:
            async for record in c.records(limit=len(keys) + 1, idle_timeout_s=WAIT_S):
                got.append((record.payload, time.time() * 1000 - record.delivered_at_ms))
            assert c.committed == len(keys) + 1
        return got

    for i, key in enumerate(keys):  # due while the consumer waits
        _schedule(service, key, 300 + 150 * i)
    got = asyncio.run(read_while_written())
    assert [payload for payload, _ in got] == [b"first", *(k.encode() for k in keys)]
    lags_ms = [lag for _, lag in got[1:]]
    # Woken by the writer, not found by the backstop's re-read every 5 s.
    assert max(lags_ms) < 2_000, lags_ms
    with open_consumer(tmp_path / "data", "q", group="sync") as again:
        assert [r.payload for r in again.records(idle_timeout_s=0.5)] == [k.encode() for k in keys]


def counting_reads(destination: LocalDestination) -> list[int]:
    """Count the destination's reads of its topics (both ways a consumer looks)."""
    looks = [0]
    read, end_offset = destination.read, destination.end_offset

    def counted_read(topic: str, from_offset: int = 0, limit: int = 1000) -> list[LocalRecord]:
        looks[0] += 1
        return read(topic, from_offset, limit)

    def counted_end(topic: str) -> int:
        looks[0] += 1
        return end_offset(topic)

    destination.read = counted_read  # type: ignore[method-assign]
    destination.end_offset = counted_end  # type: ignore[method-assign]
    return looks


def writer_process(data: Path, count: int, gap_s: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(data / "destination"), "q", str(count), str(gap_s)],
        cwd=ROOT,
    )


def test_a_waiting_async_consumer_does_not_poll(tmp_path: Path) -> None:
    fill(tmp_path, "q", 0)

    async def scenario() -> None:
        async with open_async_consumer(tmp_path, "q", group="g") as c:
            looks = counting_reads(c._c._destination)
            assert await c.poll(timeout_s=1.5) == []
            assert looks[0] <= 3, f"an idle wait of 1.5 s looked {looks[0]} times"
            writer = writer_process(tmp_path, 1, 1.0)
            try:
                looks[0] = 0
                started = time.monotonic()
                got = await c.poll(timeout_s=WAIT_S)
                waited_s = time.monotonic() - started
            finally:
                await asyncio.get_running_loop().run_in_executor(None, writer.wait, WAIT_S)
            assert [r.payload for r in got] == [b"w0"]
            # The writer sleeps 1 s after it starts: the wake-up, not a re-read, found it.
            assert waited_s < 4.0 and looks[0] <= 4, (waited_s, looks[0])

    asyncio.run(scenario())


def _open(path: Path) -> Nereus:
    return Nereus.open(str(path), clock=SimulatedClock(T0_MS, error_ms=1))


def _deliver(n: Nereus, count: int) -> None:
    dest = n.destination
    assert isinstance(dest, LocalDestination)
    for i in range(count):
        assert n.schedule("q", f"k{i}", f"p{i}".encode(), delay_ms=0).ok
    clock = n.runtime.clock
    assert isinstance(clock, SimulatedClock)
    clock.advance(5)
    n.start()
    deadline = time.monotonic() + WAIT_S
    while dest.end_offset("q") < count:
        assert time.monotonic() < deadline, "the timers were not delivered"
        time.sleep(0.01)


def test_async_for_hands_a_record_left_by_break_or_exception_out_again(tmp_path: Path) -> None:
    async def scenario(n: Nereus) -> None:
        async with n.async_consumer("q", group="app") as c:
            assert isinstance(c, AsyncConsumer)
            async for record in c:
                if record.offset == 2:
                    break  # 0 and 1 handled; 2 was not
            with pytest.raises(RuntimeError, match="boom"):
                async for record in c:
                    assert record.offset >= 2, "handled records came back"
                    if record.offset == 3:
                        raise RuntimeError("boom")
            # Record 2 is handled, its page (all five) not done: committed by the next
            # loop before it starts, or by close.
            assert c.committed == 2
            seen = [r.offset async for r in c.records(limit=2)]
            assert seen == [3, 4]
            assert c.committed == 5
        # Waits for records the runtime (this process) sends: a wake-up, then the end.
        async with n.async_consumer("q", group="app") as c:
            waiting = asyncio.ensure_future(c.poll(timeout_s=WAIT_S))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            assert (await asyncio.to_thread(n.schedule, "q", "late", b"late", delay_ms=0)).ok
            clock = n.runtime.clock
            assert isinstance(clock, SimulatedClock)
            clock.advance(5)
            got = await asyncio.wait_for(waiting, WAIT_S)
            assert [r.payload for r in got] == [b"late"]

    with _open(tmp_path) as n:
        _deliver(n, 5)
        asyncio.run(scenario(n))


def test_without_auto_commit_only_commit_commits(tmp_path: Path) -> None:
    fill(tmp_path, "q", 6)

    async def scenario() -> None:
        async with open_async_consumer(tmp_path, "q", group="g", auto_commit=False) as c:
            records = [r async for r in c.records(limit=4)]
            assert c.committed == 0
            await c.commit(records[1])
            assert c.committed == 2
        async with open_async_consumer(tmp_path, "q", group="g", auto_commit=False) as c:
            assert _offsets(await c.poll(max_records=10)) == [2, 3, 4, 5]
            await c.commit()
        async with open_async_consumer(tmp_path, "q", group="g") as c:
            assert await c.poll(timeout_s=0.1) == []

    asyncio.run(scenario())


def test_close_stops_a_waiting_async_consumer(tmp_path: Path) -> None:
    fill(tmp_path, "q", 0)

    async def scenario() -> None:
        c = open_async_consumer(tmp_path, "q", group="g")
        waiting = asyncio.ensure_future(c.records(idle_timeout_s=None).__anext__())
        await asyncio.sleep(0.2)
        await c.close()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(waiting, WAIT_S)
        assert not list((tmp_path / "destination" / "wake").glob("*.fifo")), "a FIFO left"

    asyncio.run(scenario())


# A consumer's life: (records it handles, how it ends). Ends: "break" (auto commit: the
# record it stopped at is not handled), "raise" (the same, by an exception), "commit"
# (without auto commit: commits what it handled, then leaves), "drop" (without auto commit:
# leaves without committing).
LIVES = st.lists(
    st.tuples(st.integers(0, 12), st.sampled_from(["break", "raise", "commit", "drop"])),
    min_size=1,
    max_size=6,
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lives=LIVES, max_batch=st.integers(1, 5))
def test_each_consumer_starts_at_the_groups_position_and_skips_nothing(
    lives: list[tuple[int, str]], max_batch: int
) -> None:
    total = 20
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        fill(data, "q", total)
        position = 0  # the model: where the group's next consumer must start
        handled: set[int] = set()

        async def life(count: int, end: str) -> int:
            auto = end in ("break", "raise")
            async with open_async_consumer(
                data, "q", group="g", auto_commit=auto, max_batch=max_batch
            ) as c:
                seen: list[int] = []
                last: LocalRecord | None = None
                try:
                    async for record in c.records(idle_timeout_s=0.05):
                        if len(seen) == count:
                            if end == "raise":
                                raise LookupError(record.offset)
                            break
                        seen.append(record.offset)
                        last = record
                except LookupError:
                    pass
                expected = list(range(position, min(position + count, total)))
                assert seen == expected, (seen, expected)
                handled.update(seen)
                if end == "commit" and last is not None:
                    await c.commit(last)  # not the record the loop stopped at
            return c.committed  # after close, which commits what auto commit handled

        for count, end in lives:
            after = asyncio.run(life(count, end))
            if end in ("break", "raise", "commit"):
                position = min(position + count, total)
            assert after == position

        # A last consumer reads the rest: nothing was skipped.
        async def rest() -> list[int]:
            async with open_async_consumer(data, "q", group="g") as c:
                return [r.offset async for r in c.records(idle_timeout_s=0.05)]

        assert asyncio.run(rest()) == list(range(position, total))


def test_a_waiter_that_cannot_make_its_fifo_looks_instead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader without write permission on the destination's folder (another user, as
    `--file-mode 0640` allows; the tests run as root, so the refusal is made here) cannot
    make a FIFO: it falls back to looking every 0.1 s and still gets every record."""

    def refused(_path: str) -> None:
        raise PermissionError(13, "Permission denied")

    from nereus.adapters.local import arrivals, async_consumer  # noqa: PLC0415

    monkeypatch.setattr(async_consumer, "Waker", refused)
    monkeypatch.setattr(arrivals, "Waker", refused)
    fill(tmp_path, "q", 0)
    writer = writer_process(tmp_path, 2, 0.5)
    try:
        with open_consumer(tmp_path, "q", group="sync") as c:
            assert [r.payload for r in c.records(limit=1, idle_timeout_s=WAIT_S)] == [b"w0"]

        async def read() -> list[bytes]:
            async with open_async_consumer(tmp_path, "q", group="async") as c:
                return [r.payload async for r in c.records(limit=2, idle_timeout_s=WAIT_S)]

        assert asyncio.run(read()) == [b"w0", b"w1"]
    finally:
        writer.wait(WAIT_S)
