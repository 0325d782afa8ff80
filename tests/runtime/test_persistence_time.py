"""A command's persistence time is read after it arrived; an Admission is judged by when its
commit began (specs/time.md, "the seal reading").

The rule, from the seeds: `bp` is the command's persistence time, `deliverAt = bp + delayMs`,
and `expireAt` is the latest time a new Admission may be durably persisted. A stamp taken
before the command arrived, or before the Admission's commit began, breaks both. So:

* a command that reaches the intake after the tick read the clock is stamped no earlier than
  its arrival (its deliverAt is at least arrival + delay);
* an Admission proposed while the clock allowed it, whose commit begins at or after its
  expireAt, is refused (`admission_after_expire`) and nothing is sent; the timer expires;
* black box: clients of a real `nereus serve` under load, across SIGKILLs, each see
  send + delay <= the answered deliverAt <= answer + delay (+ the clock bound).

`NEREUS_ARRIVAL_SCHEDULES` (default 4,000), `NEREUS_ARRIVAL_CLIENTS` (16) and
`NEREUS_ARRIVAL_KILLS` (2) size the black-box run.
"""

from __future__ import annotations

import base64
import http.client
import json
import math
import os
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nereus.adapters.clock import SimulatedClock
from nereus.kernel.codes import Code
from nereus.kernel.records import PublishAdmission, PublishAdmissions
from nereus.runtime.clock import read_clock
from nereus.service.arguments import schedule_record
from tests.support.runtime_harness import T0_MS, Harness
from tests.support.serve_process import serve, stop, wait_serving

SCHEDULES = int(os.environ.get("NEREUS_ARRIVAL_SCHEDULES", "4000"))
CLIENTS = int(os.environ.get("NEREUS_ARRIVAL_CLIENTS", "16"))
KILLS = int(os.environ.get("NEREUS_ARRIVAL_KILLS", "2"))
CLOCK_ERROR_MS = 5


# The runtime, with a clock that moves while a tick runs --------------------------------------


@pytest.fixture
def h(tmp_path: Path) -> Iterator[Harness]:
    """A shard runtime on a simulated clock (error 5 ms) that has ticked once."""
    harness = Harness(tmp_path, SimulatedClock(T0_MS, error_ms=5))
    try:
        harness.tick()
        yield harness
    finally:
        harness.close()


def test_a_command_arriving_after_the_ticks_reading_is_stamped_after_its_arrival(
    h: Harness,
) -> None:
    clock = h.clock
    reading = read_clock(clock)  # the tick reads the clock ...
    clock.advance(30)  # ... and the command is sent 30 ms later, while it gathers
    sent_ms = clock.now_ms()
    future = h.runtime.submit([schedule_record("q", "k", b"p", delay_ms=200)])
    clock.advance(20)  # the batch is sealed later still
    h.runtime.tick(reading)
    (outcome,) = future.result(0)
    assert outcome.code is Code.SCHEDULED
    assert outcome.deliver_at_ms is not None
    assert outcome.deliver_at_ms >= sent_ms + 200, (
        f"deliverAt {sent_ms + 200 - outcome.deliver_at_ms} ms before send + delay"
    )
    (entry,) = [e for e in h.log() if e.position == outcome.position]
    assert entry.persisted_at_ms >= sent_ms


def test_an_admission_whose_commit_begins_at_its_expire_at_is_refused_and_never_sent(
    h: Harness,
) -> None:
    clock = h.clock
    # deliverAt = bp + 100, expireAt = bp + 1,100 (the minimum delivery window).
    out = h.schedule("k", delay_ms=100, lifetime_ms=1_100)
    assert out.code is Code.SCHEDULED and out.deliver_at_ms is not None
    expire_at_ms = h.message("k").expire_at_ms
    # The tick reads the clock where the interval allows an Admission: earliest past
    # deliverAt, latest (now + 5) just before expireAt ...
    clock.advance(expire_at_ms - 6 - clock.now_ms())
    reading = read_clock(clock)
    assert reading.interval.earliest_ms >= out.deliver_at_ms
    assert reading.interval.latest_ms < expire_at_ms
    clock.advance(25)  # ... and its commit begins after expireAt.
    h.runtime.tick(reading)
    for _ in range(10):  # the timer then expires; nothing is ever sent
        clock.advance(50)
        h.tick()
    assert h.sends == [], "an Admission committed after expireAt was sent"
    assert h.attempts(h.message("k").message_id) == []
    assert str(h.message("k").status) == "EXPIRED"
    admissions = [e for e in h.log() if isinstance(e.record, PublishAdmission | PublishAdmissions)]
    assert admissions, "the tick proposed no Admission: the test did not reach its case"
    assert all(e.persisted_at_ms >= expire_at_ms for e in admissions)


# Black box: clients of a real service under load, across kills ------------------------------


@dataclass(frozen=True)
class Answered:
    sent_ms: int  # the client's clock, just before the request was written
    answered_ms: int  # ... and just after the answer was read
    delay_ms: int
    deliver_at_ms: int


def _now_floor_ms() -> int:
    return time.time_ns() // 1_000_000


def _now_ceil_ms() -> int:
    return math.ceil(time.time_ns() / 1_000_000)


class _Client(threading.Thread):
    def __init__(self, port: int, rng: random.Random, quota: int, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.port, self.rng, self.quota, self.stop_event = port, rng, quota, stop
        self.answered: list[Answered] = []
        self.refused: list[str] = []
        self.failed_requests = 0

    def run(self) -> None:
        conn: http.client.HTTPConnection | None = None
        n = 0
        while len(self.answered) < self.quota and not self.stop_event.is_set():
            ops = [self._op(n + i) for i in range(self.rng.randint(1, 16))]
            n += len(ops)
            body = json.dumps({"operations": ops})
            try:
                conn = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                sent_ms = _now_floor_ms()
                conn.request("POST", "/api/v1/timers", body, {"Content-Type": "application/json"})
                reply = conn.getresponse()
                raw = reply.read()
                answered_ms = _now_ceil_ms()
            except (OSError, http.client.HTTPException):
                # The service was killed under this request: nobody answered it.
                self.failed_requests += 1
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.05)
                continue
            if reply.status != 200:
                self.refused.append(f"HTTP {reply.status}: {raw[:200]!r}")
                continue
            for op, result in zip(ops, json.loads(raw)["results"], strict=True):
                if result["status"] != "scheduled":
                    self.refused.append(str(result))
                    continue
                delay_ms = op["delayMs"]
                assert isinstance(delay_ms, int)
                self.answered.append(Answered(sent_ms, answered_ms, delay_ms, result["deliverAt"]))
        if conn is not None:
            conn.close()

    def _op(self, n: int) -> dict[str, object]:
        return {
            "op": "schedule",
            "queue": f"q{n % 4}",
            "timerKey": f"{self.name}-{n}",
            "delayMs": self.rng.choice((0, 1, self.rng.randint(2, 500), 5_000)),
            "payload": base64.b64encode(b"x" * self.rng.randint(1, 300)).decode(),
        }


def test_every_answered_deliver_at_lies_between_send_and_answer_plus_delay(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    proc, port = serve(data, clock_error_ms=CLOCK_ERROR_MS)
    stop_event = threading.Event()
    rng = random.Random(20261203)
    clients = [
        _Client(port, random.Random(rng.random()), -(-SCHEDULES // CLIENTS), stop_event)
        for _ in range(CLIENTS)
    ]
    try:
        wait_serving(proc)
        for client in clients:
            client.start()
        for _ in range(KILLS):
            target = sum(len(c.answered) for c in clients) + SCHEDULES // (KILLS + 1)
            deadline = time.monotonic() + 120
            while sum(len(c.answered) for c in clients) < target and time.monotonic() < deadline:
                time.sleep(0.05)
            proc.kill()  # SIGKILL, with requests in flight
            proc.wait()
            proc, port = serve(data, port=port, clock_error_ms=CLOCK_ERROR_MS)
            wait_serving(proc)
        for client in clients:
            client.join(300)
    finally:
        stop_event.set()
        stop(proc)
    answered = [a for c in clients for a in c.answered]
    refused = [r for c in clients for r in c.refused]
    assert not refused, refused[:5]
    assert len(answered) >= SCHEDULES * 0.95, (len(answered), SCHEDULES)
    early = [a for a in answered if a.deliver_at_ms < a.sent_ms + a.delay_ms]
    late = [a for a in answered if a.deliver_at_ms > a.answered_ms + a.delay_ms + CLOCK_ERROR_MS]
    gaps = [a.deliver_at_ms - (a.sent_ms + a.delay_ms) for a in answered]
    figures = (
        f"{len(answered)} schedules, {CLIENTS} clients, {KILLS} kills, "
        f"{sum(c.failed_requests for c in clients)} requests cut by a kill; "
        f"deliverAt - (send + delay): min {min(gaps)} ms, max {max(gaps)} ms"
    )
    print(figures)
    assert not early, f"{len(early)} deliverAt before send + delay, e.g. {early[:3]}; {figures}"
    assert not late, f"{len(late)} deliverAt after answer + delay, e.g. {late[:3]}; {figures}"
