"""When the runtime halts: nothing half-done is kept, and nobody is left waiting.

A commit that raises aborts its whole write transaction and halts the loop (restarting
replays the log rather than guessing). Every caller must learn of it at once: the commands
already taken into the failed round as well as those still queued, and new submissions.
The loop is run on the test's thread (`ShardRuntime.run()`), so this is deterministic.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from adapters.clock import SimulatedClock
from adapters.embedded import Nereus, schedule_record
from adapters.http.api import TimerApi
from kernel.digest import state_digest
from kernel.records import Schedule
from replay.fold import replay
from runtime.errors import RuntimeHalted
from runtime.shard import CommandFuture
from storage.store import Appendable
from tests.runtime_harness import T0_MS


def _poisoned() -> Appendable:
    """A schedule whose payload bytes do not match its digest: the store refuses it inside
    the commit, so the round fails (no reducer or storage is mocked)."""
    return (
        Schedule("default", "q", "poison", "t", hashlib.sha256(b"a").hexdigest(), 1, delay_ms=0),
        b"b",
    )


def _halt(n: Nereus) -> CommandFuture:
    future = n.runtime.submit([schedule_record("q", "innocent", b"x"), _poisoned()])
    n.runtime.run()  # the first round raises; run() records the halt and returns
    assert isinstance(n.runtime.halted, ValueError)
    return future


def test_a_failed_round_appends_nothing_and_new_commands_are_refused(tmp_path: Path) -> None:
    with Nereus.open(str(tmp_path), clock=SimulatedClock(T0_MS)) as n:
        before = n.store.log_last_position
        _halt(n)
        assert n.store.log_last_position == before
        with pytest.raises(RuntimeHalted):
            n.runtime.submit([schedule_record("q", "later", b"x")])
        api = TimerApi(n)
        status, _, body = api.handle("GET", "/healthz", b"")
        assert status == 503 and json.loads(body)["ok"] is False
        op = {"op": "schedule", "queue": "q", "timerKey": "k", "delayMs": 0}
        status, _, body = api.handle(
            "POST", "/api/v1/timers", json.dumps({"operations": [op]}).encode()
        )
        assert status == 503 and json.loads(body)["error"]["code"] == "unavailable"
    # A restart finds a consistent store without any part of the failed round.
    with Nereus.open(str(tmp_path), clock=SimulatedClock(T0_MS)) as n:
        assert n.store.log_last_position == before
        assert n.peek("q", "innocent").found is False
        _, result = replay(n.store.iter_log(), n.store.config)
        with n.store.state_view() as state:
            assert state_digest(state) == result.digest
        assert n.schedule("q", "innocent", b"x").status == "scheduled"


def test_commands_queued_behind_a_failed_round_are_failed(tmp_path: Path) -> None:
    with Nereus.open(str(tmp_path), clock=SimulatedClock(T0_MS)) as n:
        cfg = n.runtime.config
        n.runtime.submit([_poisoned()])
        # A round takes whole submissions up to max_commands_per_tick: this one fills it...
        n.runtime.submit(
            [schedule_record("q", f"k{i}", b"x") for i in range(cfg.max_commands_per_tick)]
        )
        # ...and this one is still queued when the round fails.
        queued = n.runtime.submit([schedule_record("q", "queued", b"x")])
        n.runtime.run()
        assert queued.done()
        with pytest.raises(RuntimeHalted):
            queued.result(0)


def test_commands_in_the_failed_round_learn_of_the_halt_at_once(tmp_path: Path) -> None:
    with Nereus.open(str(tmp_path), clock=SimulatedClock(T0_MS)) as n:
        future = _halt(n)
        assert future.done(), "the caller of a command in the failed round is left waiting"
        with pytest.raises(RuntimeHalted):
            future.result(0)
