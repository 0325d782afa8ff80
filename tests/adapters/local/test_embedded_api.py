"""The library API (`adapters.Nereus`): open a shard on a directory, schedule, reschedule,
cancel and peek, without a thread (commands commit on the caller's thread), with the runtime
in a thread (`start()`), and under asyncio (`run_async()`); and the fail-closed clock: a host
clock without synchronisation fires nothing and expires nothing.

Everything runs on real LMDB stores in tmp_path. Deliveries are read from the local
destination. Waits are generous; only "never early" is a timing assertion.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import nereus.adapters.local.embedded
from nereus.adapters import Nereus, Peek, Result
from nereus.adapters.clock import SimulatedClock
from nereus.adapters.local.destination import LocalDestination, LocalRecord
from nereus.kernel.digest import state_digest
from nereus.kernel.keys import message_id
from nereus.kernel.records import Expire, PublishAdmission
from nereus.replay.fold import replay
from tests.support.runtime_harness import T0_MS

ROOT = Path(__file__).resolve().parents[3]
ERROR_MS = 5
WAIT_S = 20.0


def _clock() -> SimulatedClock:
    return SimulatedClock(T0_MS, error_ms=ERROR_MS)


def _records(n: Nereus, queue: str = "q") -> list[LocalRecord]:
    dest = n.destination
    assert isinstance(dest, LocalDestination)
    return list(dest.iter_all(queue))


def _wait(what: str, done: Callable[[], bool], n: Nereus) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        assert n.runtime.halted is None, n.runtime.halted
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _shard_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "nereus-shard"]


def _replay_matches(n: Nereus) -> bool:
    _, result = replay(n.store.iter_log(), n.store.config)
    with n.store.state_view() as state:
        return state_digest(state) == result.digest


def test_commands_commit_on_the_callers_thread_without_a_loop(tmp_path: Path) -> None:
    threads_before = len(_shard_threads())
    with Nereus.open(str(tmp_path), clock=_clock()) as n:
        r = n.schedule("q", "trial:acme/day7", b'{"day":7}', delay_ms=1_000, txn="t-1")
        assert isinstance(r, Result)
        assert (r.ok, r.status, r.queue, r.timer_key, r.txn) == (
            True,
            "scheduled",
            "q",
            "trial:acme/day7",
            "t-1",
        )
        assert r.message_id == message_id("default", "q", "trial:acme/day7")
        assert r.deliver_at_ms == T0_MS + 1_000
        assert len(_shard_threads()) == threads_before, "a command started a thread"

        p = n.peek("q", "trial:acme/day7")
        assert isinstance(p, Peek)
        assert p.found and p.status == "SCHEDULED" and p.generation == 1
        assert p.deliver_at_ms == T0_MS + 1_000 and p.txn == "t-1"
        assert p.payload == b'{"day":7}'  # bytes in the library, base64 only over HTTP
        assert p.claimed is False and p.attempts == 0

        same = n.schedule("q", "trial:acme/day7", b'{"day":7}', delay_ms=1_000, txn="t-1")
        assert (same.ok, same.status) == (True, "unchanged")

        moved = n.reschedule("q", "trial:acme/day7", delay_ms=5_000, txn="t-2")
        assert (moved.ok, moved.status, moved.txn) == (True, "rescheduled", "t-2")
        assert moved.deliver_at_ms == T0_MS + 5_000
        p = n.peek("q", "trial:acme/day7")
        assert p.generation == 2 and p.deliver_at_ms == T0_MS + 5_000
        assert p.payload == b'{"day":7}'  # bytes in the library, base64 only over HTTP

        absolute = n.schedule(
            "q", "abs", b"a", deliver_at_ms=T0_MS + 2_000, expire_at_ms=T0_MS + 10_000
        )
        assert absolute.status == "scheduled" and absolute.deliver_at_ms == T0_MS + 2_000
        assert n.peek("q", "abs").expire_at_ms == T0_MS + 10_000

        gone = n.cancel("q", "trial:acme/day7")
        assert (gone.ok, gone.status) == (True, "canceled")
        assert n.peek("q", "trial:acme/day7").status == "CANCELED"
        assert (n.cancel("q", "trial:acme/day7").ok, n.cancel("q", "x").status) == (
            False,
            "absent",
        )
        assert n.reschedule("q", "trial:acme/day7", delay_ms=10).status == "absent"
        assert n.peek("q", "never") == Peek(found=False, queue="q", timer_key="never")
        position = n.store.log_last_position
    # Durable: a new process (here: a new open) sees the same state.
    with Nereus.open(str(tmp_path), clock=_clock()) as n:
        assert n.store.log_last_position == position
        assert n.peek("q", "trial:acme/day7").status == "CANCELED"
        assert n.peek("q", "abs").status == "SCHEDULED"
        assert _replay_matches(n)


def test_tenants_are_separate_identities(tmp_path: Path) -> None:
    with Nereus.open(str(tmp_path), clock=_clock()) as n:
        a = n.schedule("q", "k", b"a", tenant="acme", delay_ms=100)
        b = n.schedule("q", "k", b"b", tenant="globex", delay_ms=100)
        assert a.status == b.status == "scheduled" and a.message_id != b.message_id
        assert n.peek("q", "k").found is False  # the default tenant has no such timer
        assert n.peek("q", "k", tenant="acme").found is True
        assert n.cancel("q", "k", tenant="acme").status == "canceled"
        assert n.peek("q", "k", tenant="globex").status == "SCHEDULED"


def test_refused_commands_answer_with_a_code_not_an_exception(tmp_path: Path) -> None:
    with Nereus.open(str(tmp_path), clock=_clock()) as n:
        bad_queue = n.schedule("a/b", "k", b"x")
        assert (bad_queue.ok, bad_queue.status, bad_queue.code) == (
            False,
            "rejected",
            "invalid_identity",
        )
        assert bad_queue.message == "queue must be one path segment of 1..150 bytes without NUL"
        too_big = n.schedule("q", "k", b"x" * (n.store.config.max_payload_bytes + 1))
        assert (too_big.ok, too_big.status, too_big.code) == (
            False,
            "rejected",
            "payload_too_large",
        )
        assert too_big.message == "1048577 bytes > ceiling 1048576"
        early_expiry = n.schedule("q", "k", b"x", delay_ms=0, lifetime_ms=10)
        assert (early_expiry.ok, early_expiry.code) == (False, "expire_before_window")
        assert n.peek("q", "k").found is False


def test_the_runtime_thread_fires_reschedules_and_cancels(tmp_path: Path) -> None:
    clock = _clock()
    with Nereus.open(str(tmp_path), clock=clock) as n:
        n.start()
        (thread,) = _shard_threads()
        fire = n.schedule("q", "fire", b"fire", delay_ms=1_000, partition="p1")
        moved = n.schedule("q", "moved", b"moved", delay_ms=60_000)
        doomed = n.schedule("q", "doomed", b"doomed", delay_ms=1_000)
        assert n.reschedule("q", "moved", delay_ms=500).status == "rescheduled"
        assert n.cancel("q", "doomed").status == "canceled"
        assert doomed.ok
        time.sleep(0.2)
        assert _records(n) == [], "fired before its time"
        clock.advance(1_000 + ERROR_MS)
        _wait("two deliveries", lambda: len(_records(n)) >= 2, n)
        _wait("the outcomes", lambda: n.peek("q", "fire").status == "DELIVERED", n)
        _wait("the outcomes", lambda: n.peek("q", "moved").status == "DELIVERED", n)
        time.sleep(0.2)
        records = {r.message_id: r for r in _records(n)}
        assert len(_records(n)) == 2
        assert fire.message_id is not None and moved.message_id is not None
        assert set(records) == {fire.message_id, moved.message_id}
        assert records[fire.message_id].payload == b"fire"
        assert records[fire.message_id].partition == "p1"
        assert records[moved.message_id].generation == 2
        assert records[moved.message_id].deliver_at_ms == T0_MS + 500
        for r in records.values():
            assert r.delivered_at_ms >= r.deliver_at_ms
        late = n.cancel("q", "fire")
        assert (late.ok, late.status) == (False, "too_late")
        assert late.attempt_id == records[fire.message_id].attempt_id
        assert late.evidence is not None
        assert late.evidence["offset"] == records[fire.message_id].offset
        assert n.peek("q", "doomed").status == "CANCELED"
    assert not thread.is_alive(), "close() did not stop the runtime thread"


def test_with_the_thread_running_many_callers_may_schedule_at_once(tmp_path: Path) -> None:
    with Nereus.open(str(tmp_path), clock=_clock()) as n:
        n.start()
        answers: list[str] = []
        errors: list[BaseException] = []

        def caller(t: int) -> None:
            try:
                for i in range(40):
                    answers.append(n.schedule("q", f"{t}/{i}", b"x", delay_ms=60_000).status)
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        callers = [threading.Thread(target=caller, args=(t,)) for t in range(4)]
        for c in callers:
            c.start()
        for c in callers:
            c.join()
        assert errors == []
        assert answers == ["scheduled"] * 160
        assert n.store.meta.counters.scheduled == 160
        assert _replay_matches(n)


def test_without_the_thread_many_callers_may_schedule_at_once(tmp_path: Path) -> None:
    with Nereus.open(str(tmp_path), clock=_clock()) as n:
        answers: list[str] = []
        errors: list[BaseException] = []

        def caller(t: int) -> None:
            try:
                for i in range(100):
                    answers.append(n.schedule("q", f"{t}/{i}", b"x", delay_ms=60_000).status)
            except BaseException as exc:
                errors.append(exc)

        callers = [threading.Thread(target=caller, args=(t,)) for t in range(4)]
        for c in callers:
            c.start()
        for c in callers:
            c.join()
        assert errors == []
        assert answers == ["scheduled"] * 400
        assert n.store.meta.counters.scheduled == 400
        assert _replay_matches(n)


def test_run_async_fires_under_asyncio_and_stops_when_cancelled(tmp_path: Path) -> None:
    clock = _clock()

    async def main() -> tuple[list[LocalRecord], Result]:
        with Nereus.open(str(tmp_path), clock=clock) as n:
            task = asyncio.create_task(n.run_async())
            await asyncio.sleep(0)  # the task starts the runtime thread
            assert len(_shard_threads()) == 1
            r = await asyncio.to_thread(n.schedule, "q", "async", b"from asyncio", delay_ms=200)
            assert r.status == "scheduled"
            await asyncio.sleep(0.1)
            assert _records(n) == []
            clock.advance(200 + ERROR_MS)
            deadline = time.monotonic() + WAIT_S
            while not _records(n):
                assert time.monotonic() < deadline, "timed out waiting for the delivery"
                assert not task.done(), task
                await asyncio.sleep(0.01)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            assert _shard_threads() == [], "cancelling run_async did not stop the runtime"
            assert n.runtime._loop_thread is None
            return _records(n), r

    records, r = asyncio.run(main())
    (record,) = records
    assert record.message_id == r.message_id and record.payload == b"from asyncio"
    assert record.delivered_at_ms >= record.deliver_at_ms == r.deliver_at_ms


def test_an_unsynchronised_clock_fires_nothing_and_expires_nothing(tmp_path: Path) -> None:
    clock = _clock()
    with Nereus.open(str(tmp_path), clock=clock, allow_unbounded_clock=True) as n:
        due = n.schedule("q", "due", b"due", delay_ms=0)
        short = n.schedule("q", "short", b"short", delay_ms=0, lifetime_ms=1_000)
        assert due.ok and short.ok
        clock.lose_sync()
        n.start()
        clock.advance(5_000)  # past deliverAt of both and past expireAt of "short"
        time.sleep(0.5)  # the loop turns many times meanwhile
        assert n.runtime.halted is None
        assert _records(n) == []
        assert n.peek("q", "due").status == "SCHEDULED"
        assert n.peek("q", "short").status == "SCHEDULED"
        assert n.peek("q", "due").last_error == "clock_unbounded"  # said where one looks
        kinds = {type(e.record) for e in n.store.iter_log()}
        assert PublishAdmission not in kinds and Expire not in kinds
        assert n.runtime.metrics.value("nereus_clock_error_bound_seconds") == -1
        # Commands still commit while the clock is untrusted.
        assert n.schedule("q", "meanwhile", b"m", delay_ms=0).status == "scheduled"

        clock.regain_sync()
        clock.advance(ERROR_MS)  # "meanwhile" was due at the reading it was committed at
        _wait("the delivery", lambda: n.peek("q", "due").status == "DELIVERED", n)
        _wait("the expiry", lambda: n.peek("q", "short").status == "EXPIRED", n)
        _wait("the delivery", lambda: n.peek("q", "meanwhile").status == "DELIVERED", n)
        delivered = {r.message_id for r in _records(n)}
        assert short.message_id not in delivered
        assert due.message_id in delivered
        for r in _records(n):
            assert r.delivered_at_ms >= r.deliver_at_ms


def test_an_operator_assumed_clock_bound_lets_the_host_clock_fire(tmp_path: Path) -> None:
    with Nereus.open(str(tmp_path), assume_clock_error_ms=2) as n:
        n.start()
        r = n.schedule("q", "k", b"host clock", delay_ms=50)
        _wait("the delivery", lambda: bool(_records(n)), n)
        (record,) = _records(n)
        assert record.message_id == r.message_id
        assert record.delivered_at_ms >= record.deliver_at_ms == r.deliver_at_ms


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def _doc_example(doc: str) -> str:
    """The indented code block at the top of a module docstring."""
    head = doc.split("Theory of operation", 1)[0]
    lines = [ln[4:] if ln.startswith("    ") else ln for ln in head.splitlines()]
    start = next(i for i, ln in enumerate(head.splitlines()) if ln.startswith("    "))
    return "\n".join(lines[start:]).strip() + "\n"


def _hermetic(code: str, data_dir: Path) -> str:
    """Point the example's data directory into tmp_path, so it runs fresh every time."""
    return re.sub(r'Nereus\.open\(\s*"[^"]*"', f'Nereus.open("{data_dir}"', code)


def test_the_module_docstring_example_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = nereus.adapters.local.embedded.__doc__
    assert doc is not None
    example = _doc_example(doc)
    assert "Nereus.open" in example and "nereus.start()" in example
    monkeypatch.chdir(tmp_path)
    exec(compile(example, "adapters/local/embedded.py docstring", "exec"), {})
    out = capsys.readouterr().out
    assert out.startswith("scheduled ")
    assert "Peek(found=True" in out


def test_the_readme_library_example_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    blocks = [b for b in _python_blocks((ROOT / "README.md").read_text()) if "Nereus.open" in b]
    if not blocks:
        pytest.skip("README.md has no library example (a ```python block using Nereus.open)")
    monkeypatch.chdir(tmp_path)
    for i, block in enumerate(blocks):
        exec(compile(_hermetic(block, tmp_path / f"readme-{i}"), "README.md", "exec"), {})
    capsys.readouterr()
