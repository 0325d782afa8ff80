"""When the runtime halts: nothing half-done is kept, and nobody is left waiting.

A commit that raises aborts its whole write transaction and halts the loop (restarting
replays the log rather than guessing). Every caller must learn of it at once: the commands
already taken into the failed round as well as those still queued, and new submissions.
The loop is run on the test's thread (`ShardRuntime.run()`), so this is deterministic.
"""

from __future__ import annotations

import json
from pathlib import Path

import lmdb
import pytest

from nereus.adapters.clock import SimulatedClock
from nereus.adapters.http.api import TimerApi
from nereus.adapters.local.embedded import Nereus
from nereus.kernel.digest import state_digest
from nereus.kernel.records import Appendable
from nereus.replay.fold import replay
from nereus.runtime.errors import RuntimeHalted
from nereus.runtime.shard import CommandFuture
from nereus.service.arguments import schedule_record
from nereus.storage.schema import StoreOptions
from tests.support.runtime_harness import T0_MS

# A store whose LMDB map is smaller than what one round must write fails that round's commit
# with MDB_MAP_FULL: a real storage failure, found inside the commit (nothing is mocked, and
# no command is malformed: the runtime refuses those at submit).
SMALL_MAP = StoreOptions(map_size_bytes=512 * 1024)


def _open(path: Path) -> Nereus:
    return Nereus.open(str(path), clock=SimulatedClock(T0_MS), store_options=SMALL_MAP)


def _poisoned() -> Appendable:
    return schedule_record("q", "poison", bytes(600_000), delay_ms=0)


def _halt(n: Nereus) -> CommandFuture:
    future = n.runtime.submit([schedule_record("q", "innocent", b"x"), _poisoned()])
    n.runtime.run()  # the first round raises; run() records the halt and returns
    assert isinstance(n.runtime.halted, lmdb.MapFullError)
    return future


def test_a_failed_round_appends_nothing_and_new_commands_are_refused(tmp_path: Path) -> None:
    with _open(tmp_path) as n:
        before = n.store.log_last_position
        _halt(n)
        assert n.store.log_last_position == before
        with pytest.raises(RuntimeHalted):
            n.runtime.submit([schedule_record("q", "later", b"x")])
        api = TimerApi(n.service)
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
    with _open(tmp_path) as n:
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
    with _open(tmp_path) as n:
        future = _halt(n)
        assert future.done(), "the caller of a command in the failed round is left waiting"
        with pytest.raises(RuntimeHalted):
            future.result(0)
