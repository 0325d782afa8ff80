"""The bridge between the runtime's commits and the event loop: `CommandFuture`'s done
callbacks, and `await_command` (a request awaits its fsync without a thread of its own)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from nereus.adapters.local.embedded import Nereus
from nereus.runtime.shard import CommandFuture
from nereus.service.arguments import schedule_record
from nereus.service.embedded import await_command


def test_a_done_callback_runs_once_whether_added_before_or_after_completion() -> None:
    future = CommandFuture(0)
    calls: list[str] = []
    future.add_done_callback(lambda f: calls.append("before"))
    assert calls == []
    future._set([])
    future.add_done_callback(lambda f: calls.append("after"))
    future._set([])  # a second completion does not call anyone again
    assert calls == ["before", "after"]


def test_await_command_returns_the_outcomes_once_durable(tmp_path: Path) -> None:
    with Nereus.open(str(tmp_path), assume_clock_error_ms=2) as n:
        n.start()
        future = n.runtime.submit([schedule_record("q", "k", b"x", delay_ms=60_000)])
        (outcome,) = asyncio.run(await_command(future, 30))
        assert str(outcome.code) == "scheduled"


def test_a_commit_that_completes_after_its_loop_is_gone_harms_nobody() -> None:
    future = CommandFuture(0)
    with pytest.raises(TimeoutError):
        asyncio.run(await_command(future, 0.01))
    future._set([])  # the waker finds the loop closed; the runtime's thread must not raise
    assert future.done()
