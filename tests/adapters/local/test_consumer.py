"""How an embedded program receives its timers: `Nereus.consumer(queue, group=...)`.

Timers are fired by the runtime's thread onto the local destination (a simulated clock is
advanced past their deliverAt); consumers read them with the iterator form, the handler
form and `poll`, with and without auto commit. A group's position is durable (a new
consumer, after a reopen, starts where the last one left), never moves past a record that
was not handled (an exception or a `break` hands the record out again), and is shared with
`nereus tail --group`. A consumer waiting for records is woken by the send, not by
polling, whether the send is this process's or another's (`nereus.open_consumer`); one
group and queue has one consumer at a time, in any process.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from nereus import ConsumerBusy, LocalRecord, Nereus, open_consumer
from nereus.adapters.cli.main import main as nereus_cli
from nereus.adapters.clock import SimulatedClock
from nereus.adapters.local.destination import LocalDestination
from tests.adapters.local.test_async_consumer import counting_reads, fill, writer_process
from tests.support.runtime_harness import T0_MS

ROOT = Path(__file__).resolve().parents[3]
WAIT_S = 30.0


def _open(path: Path, clock: SimulatedClock | None = None) -> Nereus:
    return Nereus.open(str(path), clock=clock or SimulatedClock(T0_MS, error_ms=1))


def _wait(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _deliver(n: Nereus, count: int, queue: str = "q", first: int = 0) -> None:
    """Schedule `count` timers, fire them, and wait until the destination holds them."""
    assert isinstance(n.destination, LocalDestination)
    dest = n.destination
    before = dest.end_offset(queue)
    for i in range(first, first + count):
        assert n.schedule(queue, f"k{i}", f"p{i}".encode(), delay_ms=0).ok
    clock = n.runtime.clock
    assert isinstance(clock, SimulatedClock)
    clock.advance(5)
    n.start()
    _wait(f"{count} deliveries", lambda: dest.end_offset(queue) >= before + count)


@pytest.fixture
def delivered(tmp_path: Path) -> Iterator[Nereus]:
    """A shard whose queue "q" holds five delivered records (p0..p4)."""
    with _open(tmp_path) as n:
        _deliver(n, 5)
        yield n


def _payloads(records: list[LocalRecord]) -> list[bytes]:
    return [r.payload for r in records]


def test_the_iterator_hands_out_every_record_once_and_commits(delivered: Nereus) -> None:
    with delivered.consumer("q", group="app") as consumer:
        got = list(consumer.records(idle_timeout_s=0.2))
        assert _payloads(got) == [b"p0", b"p1", b"p2", b"p3", b"p4"]
        assert [r.offset for r in got] == [0, 1, 2, 3, 4]
        assert consumer.committed == 5
    with delivered.consumer("q", group="app") as again:
        assert again.committed == 5 and list(again.records(idle_timeout_s=0.1)) == []
    with delivered.consumer("q", group="other") as other:  # groups are independent
        assert len(list(other.records(idle_timeout_s=0.1))) == 5


def test_the_position_survives_a_reopen(tmp_path: Path) -> None:
    with _open(tmp_path) as n:
        _deliver(n, 3)
        with n.consumer("q", group="app") as consumer:
            batch = consumer.poll()
            assert _payloads(batch) == [b"p0", b"p1", b"p2"]
            consumer.commit(batch[0])  # only the first handled; closing commits no more
    with _open(tmp_path) as n, n.consumer("q", group="app") as consumer:
        assert consumer.committed == 1
        assert _payloads(list(consumer.records(idle_timeout_s=0.1))) == [b"p1", b"p2"]


def test_break_and_exceptions_hand_the_record_out_again(delivered: Nereus) -> None:
    with delivered.consumer("q", group="app") as consumer:
        for record in consumer.records(idle_timeout_s=0.2):
            if record.offset == 2:
                break
        assert consumer.committed == 2, "the record the loop left was committed"
        with pytest.raises(RuntimeError, match="handler failed"):
            for record in consumer.records(idle_timeout_s=0.2):
                assert record.offset == 2, "the record after a break was skipped"
                raise RuntimeError("handler failed")
        assert consumer.committed == 2
        rest = list(consumer.records(idle_timeout_s=0.2))
        assert [r.offset for r in rest] == [2, 3, 4]
        assert consumer.committed == 5


def test_the_handler_form_commits_after_each_batch_and_stops_at_a_failure(
    delivered: Nereus,
) -> None:
    seen: list[int] = []

    def fails_at_3(record: LocalRecord) -> None:
        seen.append(record.offset)
        if record.offset == 3:
            raise ValueError("cannot handle 3")

    with delivered.consumer("q", group="app") as consumer:
        with pytest.raises(ValueError, match="cannot handle 3"):
            consumer.run(fails_at_3, idle_timeout_s=0.2)
        assert seen == [0, 1, 2, 3] and consumer.committed == 3
        assert consumer.run(lambda r: seen.append(r.offset), idle_timeout_s=0.2) == 2
        assert seen[4:] == [3, 4] and consumer.committed == 5


def test_a_limit_stops_after_that_many_handled_and_committed(delivered: Nereus) -> None:
    with delivered.consumer("q", group="app") as consumer:
        assert [r.offset for r in consumer.records(limit=2, idle_timeout_s=5)] == [0, 1]
        assert consumer.committed == 2
        seen: list[int] = []
        assert consumer.run(lambda r: seen.append(r.offset), limit=2, idle_timeout_s=5) == 2
        assert seen == [2, 3] and consumer.committed == 4
        for record in consumer.records(idle_timeout_s=5):
            consumer.commit(record)  # handled: committed before leaving the loop
            break
        assert consumer.committed == 5 and list(consumer.records(idle_timeout_s=0.1)) == []


def test_without_auto_commit_the_program_commits(delivered: Nereus) -> None:
    with delivered.consumer("q", group="app", auto_commit=False, max_batch=2) as consumer:
        assert [r.offset for r in consumer.poll()] == [0, 1]
        assert [r.offset for r in consumer.poll()] == [2, 3]
        assert consumer.committed == 0
        consumer.commit()
        assert consumer.committed == 4
        with pytest.raises(ValueError, match="not handed out"):
            consumer.commit(_record_at(delivered, 4))
    with delivered.consumer("q", group="app", auto_commit=False) as consumer:
        assert [r.offset for r in consumer.poll()] == [4]  # handed out, never committed
        consumer.commit(_record_at(delivered, 4))
        assert consumer.committed == 5


def _record_at(n: Nereus, offset: int) -> LocalRecord:
    assert isinstance(n.destination, LocalDestination)
    return n.destination.read("q", offset, 1)[0]


def test_poll_with_auto_commit_commits_the_previous_poll(delivered: Nereus) -> None:
    with delivered.consumer("q", group="app", max_batch=3) as consumer:
        assert len(consumer.poll()) == 3 and consumer.committed == 0
        assert len(consumer.poll()) == 2 and consumer.committed == 3
        assert consumer.poll() == [] and consumer.committed == 5


def test_one_consumer_per_group_and_queue_in_any_process(delivered: Nereus, tmp_path: Path) -> None:
    with delivered.consumer("q", group="app"):
        with pytest.raises(ConsumerBusy, match="already has a consumer"):
            delivered.consumer("q", group="app")
        assert delivered.consumer("q", group="app2")  # another group may
        assert delivered.consumer("q.dlq", group="app")  # another queue too
        probe = (
            "import sys\n"
            "from nereus import ConsumerBusy\n"
            "from nereus.adapters.local.consumer import LocalConsumer\n"
            "from nereus.adapters.local.destination import LocalDestination\n"
            "dest = LocalDestination(sys.argv[1])\n"
            "try:\n"
            "    LocalConsumer(dest, 'q', group='app')\n"
            "except ConsumerBusy as exc:\n"
            "    print(exc)\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", probe, str(tmp_path / "destination")],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        assert "already has a consumer" in out and "pid" in out
    with delivered.consumer("q", group="app") as consumer:  # free again once closed
        assert consumer.committed == 0


def test_a_waiting_consumer_is_woken_by_the_send_not_by_polling(tmp_path: Path) -> None:
    clock = SimulatedClock(T0_MS, error_ms=1)
    with _open(tmp_path, clock) as n:
        n.start()
        dest = n.destination
        assert isinstance(dest, LocalDestination)
        looks = 0
        end_offset = dest.end_offset

        def counting(topic: str) -> int:
            nonlocal looks
            looks += 1
            return end_offset(topic)

        dest.end_offset = counting  # type: ignore[method-assign]
        got: list[LocalRecord] = []
        consumer = n.consumer("q", group="app")
        reader = threading.Thread(
            target=lambda: got.extend(consumer.records(idle_timeout_s=WAIT_S))
        )
        reader.start()
        _wait("the consumer to wait", lambda: looks >= 1)
        time.sleep(1.0)
        assert looks <= 2, f"a waiting consumer looked {looks} times in a second"
        assert n.schedule("q", "k", b"wake", delay_ms=0).ok
        clock.advance(5)
        _wait("the delivery to reach the consumer", lambda: len(got) == 1)
        consumer.close()  # wakes the waiting iterator, which ends
        reader.join(WAIT_S)
        assert not reader.is_alive()
        assert got[0].payload == b"wake"


def test_closing_nereus_stops_a_blocked_consumer(tmp_path: Path) -> None:
    n = _open(tmp_path)
    n.start()
    consumer = n.consumer("q", group="app")
    ended = threading.Event()

    def read() -> None:
        for _ in consumer.records():
            pass
        ended.set()

    reader = threading.Thread(target=read)
    reader.start()
    time.sleep(0.2)
    n.close()
    reader.join(WAIT_S)
    assert ended.is_set()
    with pytest.raises(RuntimeError, match="closed"):
        consumer.poll()


def test_bad_consumer_arguments_are_refused(delivered: Nereus) -> None:
    for kwargs, error in (
        ({"group": ""}, ValueError),
        ({"group": "a\x00b"}, ValueError),
        ({"group": 5}, TypeError),
        ({"group": "g", "auto_commit": 1}, TypeError),
        ({"group": "g", "max_batch": 0}, ValueError),
    ):
        with pytest.raises(error):
            delivered.consumer("q", **kwargs)
    with delivered.consumer("q", group="g") as consumer:
        with pytest.raises(TypeError, match="timeout_s"):
            consumer.poll(timeout_s="1")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="max_records"):
            consumer.poll(max_records=0)


def test_tail_with_a_group_shares_the_librarys_positions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json  # noqa: PLC0415

    with _open(tmp_path) as n:
        _deliver(n, 5)
        with n.consumer("q", group="app") as consumer:
            for record in consumer.records(idle_timeout_s=0.2):
                if record.offset == 2:
                    break  # 0 and 1 handled
    capsys.readouterr()
    assert nereus_cli(["tail", "q", "--data", str(tmp_path), "--group", "app", "--limit", "2"]) == 0
    printed = [json.loads(line)["offset"] for line in capsys.readouterr().out.splitlines()]
    assert printed == [2, 3]
    assert nereus_cli(["tail", "q", "--data", str(tmp_path), "--group", "app"]) == 0
    printed = [json.loads(line)["offset"] for line in capsys.readouterr().out.splitlines()]
    assert printed == [4]
    assert nereus_cli(["tail", "q", "--data", str(tmp_path), "--group", "app", "--from", "0"]) == 2
    assert "drop --from" in capsys.readouterr().err
    later = SimulatedClock(T0_MS + 60_000, error_ms=1)  # past the first session's log times
    with _open(tmp_path, later) as n, n.consumer("q", group="app") as consumer:
        assert consumer.committed == 5
        _deliver(n, 1, first=5)
        assert [r.offset for r in consumer.records(idle_timeout_s=0.2)] == [5]


def test_a_waiting_sync_consumer_of_another_process_does_not_poll(tmp_path: Path) -> None:
    fill(tmp_path, "q", 0)
    with open_consumer(tmp_path, "q", group="g") as c:
        looks = counting_reads(c._destination)
        assert c.poll(timeout_s=1.5) == []
        assert looks[0] <= 3, f"an idle wait of 1.5 s looked {looks[0]} times"
        writer = writer_process(tmp_path, 3, 1.0)
        got: list[LocalRecord] = []
        lags_ms: list[float] = []
        try:
            looks[0] = 0
            for record in c.records(limit=3, idle_timeout_s=WAIT_S):
                got.append(record)
                lags_ms.append(time.time() * 1000 - record.delivered_at_ms)
        finally:
            writer.wait(WAIT_S)
        assert [r.payload for r in got] == [b"w0", b"w1", b"w2"]
        assert looks[0] <= 12, f"three wake-ups took {looks[0]} looks"
        # Written 1 s apart, each is seen when written: a waiter that only re-read every
        # 5 s (the backstop) would see at least one of the three 3 s late.
        assert max(lags_ms) < 1_500, lags_ms
