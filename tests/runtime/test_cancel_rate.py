"""Cancels of finished timers answered from one snapshot, and a caller out of tokens
(`runtime/absent.py`, `service/embedded.py`; specs/http.md, "DELETE without an entry"
and "Rate limit").

The rules, each checked against answers written from the rule:
* a cancel of a finished timer (CANCELED, EXPIRED, DELIVERED) or of a key with no row gets
  from the snapshot exactly the answer the log gives the same cancel appended (the result
  and its HTTP body: status, message id, attempt id, evidence), and appends nothing; the
  same cancel appended changes no row, counter or shard status, only the log's place;
* a caller with no token left is never refused and never appends a cancel that changes
  nothing: a pending timer's cancel is appended and answered `canceled`; anything else is
  answered from the snapshot (hypothesis over schedules, cancels and bursts of concurrent
  cancels of one key, against a model of the rows);
* concurrent cancels of one pending timer from callers with no token append once between
  them.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nereus.adapters import Nereus
from nereus.adapters.clock import SimulatedClock
from nereus.adapters.http.shapes import result_json
from nereus.adapters.local.destination import LocalDestination
from nereus.kernel.digest import state_digest
from nereus.kernel.model import TABLES
from nereus.replay.fold import replay
from nereus.service.arguments import cancel_record, schedule_record
from nereus.service.codes import NAMES_JSON
from nereus.service.embedded import EmbeddedService
from nereus.service.results import to_result
from tests.support.runtime_harness import T0_MS

EXAMPLES = int(os.environ.get("NEREUS_DRAINED_EXAMPLES", "30"))
BURST = int(os.environ.get("NEREUS_DRAINED_BURST", "24"))
WAIT_S = 20.0

# What every surface says of a cancel with nothing pending under its key (specs/codes.md).
ABSENT = "no timer is pending under this key (never scheduled, or no longer pending)"


def _wait(what: str, done: Callable[[], bool], n: Nereus) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        assert n.runtime.halted is None, n.runtime.halted
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def _replay_matches(n: Nereus) -> bool:
    _, result = replay(n.store.iter_log(), n.store.config)
    with n.store.state_view() as state:
        return state_digest(state) == result.digest


def _rows(n: Nereus) -> tuple[Any, ...]:
    """Everything of the applied state but the log's place in it (position, latest
    persistence time): every row of every table, the counters and the shard status."""
    with n.store.state_view() as state:
        tables = tuple((table, list(state.items(table))) for table in TABLES)
        return tables, state.meta.counters, state.meta.shard_status


def _body(n: Nereus, key: str, *, through_log: bool) -> dict[str, Any]:
    """The HTTP body of a cancel of `key`: from the snapshot (`Nereus.submit`), or appended
    and decided by the log (the runtime's own submit, which never asks the snapshot)."""
    items = [cancel_record("q", key, txn=f"del-{key}")]
    future = n.runtime.submit(items) if through_log else n.submit(items)
    (outcome,) = future.result(WAIT_S)
    return result_json(to_result(outcome, items[0][0], n.store.config, NAMES_JSON), "cancel")


def test_a_finished_timer_gets_the_log_answer_from_the_snapshot(tmp_path: Path) -> None:
    clock = SimulatedClock(T0_MS, error_ms=5)
    with Nereus.open(str(tmp_path), clock=clock, allow_unbounded_clock=True) as n:
        # Both due while the clock is untrusted: "short" is past its expireAt before any
        # Admission can be made, so it expires; "fired" is delivered.
        clock.lose_sync()
        fired = n.schedule("q", "fired", b"f", delay_ms=0)
        short = n.schedule("q", "short", b"s", delay_ms=0, lifetime_ms=1_000)
        gone = n.schedule("q", "gone", b"g", delay_ms=60_000)
        assert n.cancel("q", "gone").status == "canceled"
        n.start()
        clock.advance(5_000)
        clock.regain_sync()
        clock.advance(10)
        _wait("the delivery", lambda: n.peek("q", "fired").status == "DELIVERED", n)
        _wait("the expiry", lambda: n.peek("q", "short").status == "EXPIRED", n)
        dest = n.destination
        assert isinstance(dest, LocalDestination)
        (record,) = [r for r in dest.iter_all("q") if r.message_id == fired.message_id]
        stored = n.peek("q", "fired").evidence
        assert stored is not None
        bare = {"ok": False, "status": "absent", "code": "absent", "queue": "q", "message": ABSENT}
        expected = {
            "gone": {**bare, "timerKey": "gone", "txn": "del-gone"},
            "short": {**bare, "timerKey": "short", "txn": "del-short"},
            "never": {**bare, "timerKey": "never", "txn": "del-never"},
            "fired": {
                "ok": False,
                "status": "too_late",
                "code": "too_late",
                "message": "the timer crossed Publish Admission (attempt "
                f"{record.attempt_id}): it is being or was delivered",
                "queue": "q",
                "timerKey": "fired",
                "txn": "del-fired",
                "messageId": fired.message_id,
                "attemptId": record.attempt_id,
                "evidence": {
                    "destination": stored.destination,  # the tenant's topic (destinations.md)
                    "partition": 0,
                    "offset": record.offset,
                    "timestamp": record.delivered_at_ms,
                },
            },
        }
        assert short.message_id is not None and gone.message_id is not None
        for key, body in expected.items():
            end = n.store.log_last_position
            for _ in range(50):
                assert _body(n, key, through_log=False) == body
            assert n.store.log_last_position == end, f"a cancel of {key!r} was appended"
            rows = _rows(n)
            assert _body(n, key, through_log=True) == body
            assert n.store.log_last_position == end + 1
            # The appended cancel moved the log's place and nothing else.
            assert _rows(n) == rows
        assert _replay_matches(n)


# A caller with no token ---------------------------------------------------------------------

KEYS = ("a", "b", "c")
plans = st.lists(
    st.one_of(
        st.tuples(st.just("schedule"), st.sampled_from(KEYS), st.just(1)),
        st.tuples(st.just("cancel"), st.sampled_from(KEYS), st.integers(1, BURST)),
    ),
    min_size=1,
    max_size=12,
)


def _never() -> bool:
    return False


async def _drained(backend: EmbeddedService, key: str, count: int) -> list[str | None]:
    """`count` concurrent cancels of `key` from a caller with no token: their codes, None
    for a refusal."""
    items = [cancel_record("q", key)]

    async def one() -> str | None:
        outcomes = await backend.cancel_async(items, _never, WAIT_S)
        return None if outcomes is None else str(outcomes[0].code)

    return list(await asyncio.gather(*(one() for _ in range(count))))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plans)
def test_a_caller_out_of_tokens_cancels_every_pending_timer_and_appends_nothing_else(
    plan: list[tuple[str, str, int]],
) -> None:
    with tempfile.TemporaryDirectory() as data, Nereus.open(data, assume_clock_error_ms=5) as n:
        n.start()
        backend = n.service
        live: set[str] = set()
        scheduled: set[str] = set()
        appended = 0
        for op, key, count in plan:
            if op == "schedule":
                n.submit([schedule_record("q", key, b"x", delay_ms=600_000)]).result(WAIT_S)
                live.add(key)
                scheduled.add(key)
                appended += 1
                continue
            codes = asyncio.run(_drained(backend, key, count))
            assert None not in codes, "a cancel was refused"
            if key in live:
                # One of the burst cancels the timer; the rest find it cancelled.
                assert sorted(str(c) for c in codes) == ["absent"] * (count - 1) + ["canceled"]
                live.discard(key)
                appended += 1
            else:
                assert codes == ["absent"] * count
            assert n.store.log_last_position == appended, (op, key, count, codes)
        for key in KEYS:
            expected = "SCHEDULED" if key in live else "CANCELED" if key in scheduled else None
            assert n.peek("q", key).status == expected
        assert _replay_matches(n)


THREAD_ROUNDS = int(os.environ.get("NEREUS_DRAINED_THREAD_ROUNDS", "40"))


def test_threads_out_of_tokens_cancelling_one_pending_timer_append_once(tmp_path: Path) -> None:
    """Library callers on threads of their own, each with no token, cancel one pending timer
    at once: the judgement and the append are one step, so one entry between them."""
    with Nereus.open(str(tmp_path), assume_clock_error_ms=5) as n:
        n.start()
        appended = 0
        for round_ in range(THREAD_ROUNDS):
            key = f"k{round_}"
            n.submit([schedule_record("q", key, b"x", delay_ms=600_000)]).result(WAIT_S)
            appended += 1
            gate = threading.Barrier(8)

            def cancel(key: str = key, gate: threading.Barrier = gate) -> str:
                gate.wait()
                while True:
                    future = n.submit_cancels([cancel_record("q", key)], _never)
                    if future is not None:
                        return str(future.result(WAIT_S)[0].code)
                    time.sleep(0.001)

            with ThreadPoolExecutor(max_workers=8) as pool:
                codes = sorted(pool.map(lambda _i: cancel(), range(8)))
            assert codes == ["absent"] * 7 + ["canceled"], (key, codes)
            appended += 1
            assert n.store.log_last_position == appended
