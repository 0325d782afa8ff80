"""A clock that cannot bound true time is said, not silent; `/readyz` says why a process is
not ready (specs/http.md, specs/time.md).

The rules, written here from the spec: `Nereus.start()` (and `run_async()`) raise
`ClockUnbounded`, naming the library's keywords, on a clock without a bound unless the shard
was opened with `allow_unbounded_clock=True`; a started shard then fires nothing, and every
SCHEDULED timer's peek says `last_error == "clock_unbounded"` until the clock is bounded.
`/readyz` answers 200 `{"ready": true}` only with no reason at all, and is never 200 while
the shard is halted, recovering, or without a clock bound; `/healthz` stays liveness.
Every clock here is the test's own (`SimulatedClock`, or a `SystemClock` over a scripted
host), never this machine's.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lmdb
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nereus.adapters.clock import SimulatedClock, SyncReport, SystemClock
from nereus.adapters.http.api import TimerApi
from nereus.adapters.local.embedded import Nereus
from nereus.service.arguments import schedule_record
from nereus.service.clock_bound import ClockUnbounded
from nereus.service.readiness import answer, clock_reason, shard_reasons
from nereus.storage.schema import StoreOptions
from tests.support.host_clock import EPOCH_NS, ScriptedHost
from tests.support.runtime_harness import T0_MS


class NoReadingHost(ScriptedHost):
    """A host without adjtimex: no synchronisation report at all."""

    def sync_report(self) -> SyncReport | None:
        return None


def _unsynchronised_host_clock() -> SystemClock:
    return SystemClock(host=ScriptedHost(EPOCH_NS, drift_ppm=500, max_error_us=None))


def _wait(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _get(api: TimerApi, path: str) -> tuple[int, dict[str, Any]]:
    status, content_type, body = api.handle("GET", path, b"")
    assert content_type == "application/json"
    return status, json.loads(body)


def _codes(doc: dict[str, Any]) -> list[tuple[str, int | None]]:
    return [(r["code"], r.get("shard")) for r in doc["reasons"]]


# The library -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("clock", "measured"),
    [
        (_unsynchronised_host_clock, "adjtimex says unsynchronised"),
        (
            lambda: SystemClock(host=NoReadingHost(EPOCH_NS, drift_ppm=500, max_error_us=None)),
            "adjtimex gave no reading",
        ),
    ],
    ids=["unsynchronised", "no_reading"],
)
def test_start_refuses_an_unbounded_clock_naming_the_keywords(
    tmp_path: Path, clock: Callable[[], SystemClock], measured: str
) -> None:
    with Nereus.open(str(tmp_path), clock=clock()) as n:
        with pytest.raises(ClockUnbounded) as info:
            n.start()
        message = str(info.value)
        assert info.value.measured == measured and measured in message
        assert "assume_clock_error_ms=" in message and "allow_unbounded_clock=True" in message
        assert "--assume-clock-error-ms" not in message, "the library names its keywords"
        assert n.runtime._loop_thread is None, "nothing was started"
        with pytest.raises(ClockUnbounded):
            asyncio.run(n.run_async())


def test_an_assumed_error_starts_on_any_host(tmp_path: Path) -> None:
    # Bounded whatever this machine's clock says: its own report, or the assumption.
    with Nereus.open(str(tmp_path), assume_clock_error_ms=5) as n:
        n.start()
        assert n.runtime._loop_thread is not None


def test_allowed_unbounded_clock_fires_nothing_and_peek_says_why(tmp_path: Path) -> None:
    clock = SimulatedClock(T0_MS)
    clock.lose_sync()
    with Nereus.open(str(tmp_path), clock=clock, allow_unbounded_clock=True) as n:
        n.start()
        assert n.schedule("q", "due", b"x", delay_ms=0).status == "scheduled"
        api = TimerApi(n.service)
        _wait(n.runtime.is_recovered, "the shard recovered")
        time.sleep(0.2)  # many ticks: none may admit without a bound
        peek = n.peek("q", "due")
        assert peek.status == "SCHEDULED" and peek.last_error == "clock_unbounded"
        status, doc = _get(api, "/api/v1/timers/q/due")
        assert status == 200 and doc["lastError"] == "clock_unbounded"
        status, doc = _get(api, "/readyz")
        assert status == 503 and doc["ready"] is False
        assert _codes(doc) == [("clock_unbounded", None)]
        assert "simulated" in doc["reasons"][0]["detail"]
        assert _get(api, "/healthz")[0] == 200, "liveness is not readiness"
        # Bounded again: the timer fires, and nothing says it waits for the clock any more.
        clock.regain_sync()
        clock.advance(1_000)
        _wait(lambda: n.peek("q", "due").status == "DELIVERED", "the timer delivered")
        assert n.peek("q", "due").last_error is None
        assert _get(api, "/readyz") == (200, {"ready": True})


# /readyz on the embedded shard ---------------------------------------------------------------


def test_ready_only_once_started_and_recovered(tmp_path: Path) -> None:
    with Nereus.open(str(tmp_path), clock=SimulatedClock(T0_MS)) as n:
        api = TimerApi(n.service)
        status, doc = _get(api, "/readyz")
        assert status == 503 and _codes(doc) == [("shard_recovering", 0)]
        n.start()
        _wait(lambda: _get(api, "/readyz")[0] == 200, "ready")
        assert _get(api, "/readyz") == (200, {"ready": True})
        assert _get(api, "/healthz")[0] == 200


def test_a_halted_shard_is_never_ready(tmp_path: Path) -> None:
    # A commit bigger than the LMDB map fails inside the round: the runtime halts (as in
    # tests/runtime/test_runtime_halt.py), a real storage failure with nothing mocked.
    small = StoreOptions(map_size_bytes=512 * 1024)
    with Nereus.open(str(tmp_path), clock=SimulatedClock(T0_MS), store_options=small) as n:
        api = TimerApi(n.service)
        n.runtime.run_once()
        n.runtime.run_once()
        assert _get(api, "/readyz")[0] == 200, "recovered and bounded: ready before the halt"
        n.runtime.submit([schedule_record("q", "poison", bytes(600_000), delay_ms=0)])
        n.runtime.run()  # the round raises; run() records the halt and returns
        assert isinstance(n.runtime.halted, lmdb.MapFullError)
        status, doc = _get(api, "/readyz")
        assert status == 503 and _codes(doc) == [("shard_halted", 0)]
        assert "MapFullError" in doc["reasons"][0]["detail"]


# The rule itself, over every combination -------------------------------------------------------

_SHARD = st.tuples(
    st.one_of(st.none(), st.sampled_from(["gap at 7", "commit failed"])), st.booleans()
)


@given(
    shards=st.dictionaries(st.integers(0, 63), _SHARD, max_size=8),
    measured=st.one_of(st.none(), st.sampled_from(["adjtimex says unsynchronised"])),
)
def test_ready_exactly_when_every_shard_serves_with_a_bounded_clock(
    shards: dict[int, tuple[str | None, bool]], measured: str | None
) -> None:
    reasons = clock_reason(measured)
    for shard, (halted, recovered) in shards.items():
        reasons += shard_reasons(shard, halted=halted, recovered=recovered)
    status, doc = answer(reasons)
    serving = all(halted is None and recovered for halted, recovered in shards.values())
    if serving and measured is None:
        assert (status, doc) == (200, {"ready": True})
        return
    assert status == 503 and doc["ready"] is False
    listed = {(r["code"], r.get("shard")) for r in doc["reasons"]}
    for shard, (halted, recovered) in shards.items():
        if halted is not None:
            assert ("shard_halted", shard) in listed
        elif not recovered:
            assert ("shard_recovering", shard) in listed
    assert (("clock_unbounded", None) in listed) == (measured is not None)
