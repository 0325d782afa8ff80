"""Due discovery and the send gate, driven tick by tick on a real LMDB store.

Work is due only when the shard is ACTIVE_FOR_COMMANDS, the lane gate is OPEN and `decide()`
says ADMIT: WAIT and PAUSE never produce an Admission, and EXPIRE_V1 is proposed only on
EXPIRE. An admitted attempt is handed to the destination only while the clock proves its
action time has come; a less certain reading makes it wait (late, never early). A proven
permanent pre-send error is a CLAIM_RESULT_V1, and a spent budget dead-letters the message
to the destination's DLQ topic.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

from nereus.adapters.clock import SimulatedClock
from nereus.kernel.codes import Code
from nereus.kernel.config import KernelConfig
from nereus.kernel.model import AttemptStatus, Status
from nereus.kernel.records import (
    Cancel,
    Capability,
    ClaimResult,
    Expire,
    LaneGate,
    PublishAdmission,
    Schedule,
    ShardState,
)
from nereus.kernel.timing import TrustedInterval
from tests.support.builders import records
from tests.support.runtime_harness import T0_MS, Harness

ERROR_MS = 5


def _harness(tmp_path: Path, error_ms: int = ERROR_MS) -> Harness:
    return Harness(tmp_path, SimulatedClock(T0_MS, error_ms=error_ms))


def _kinds(h: Harness) -> Counter[str]:
    return Counter(type(e.record).__name__ for e in h.log())


def test_nothing_is_admitted_before_the_earliest_reading_reaches_deliver_at(
    tmp_path: Path,
) -> None:
    h = _harness(tmp_path)
    r = h.schedule("k", delay_ms=1_000)
    assert r.deliver_at_ms == T0_MS + 1_000
    h.clock.advance(1_000 + ERROR_MS - 1)  # latest is past deliverAt, earliest is not
    h.tick(5)
    assert "PublishAdmission" not in _kinds(h)
    assert h.sends == []
    h.clock.advance(1)  # earliest == deliverAt
    h.tick(2)
    assert len(h.sends) == 1
    (record,) = h.delivered()
    assert record.delivered_at_ms >= record.deliver_at_ms
    assert h.message("k").status is Status.DELIVERED
    assert not h.problems
    h.close()


def test_pause_band_neither_admits_nor_expires(tmp_path: Path) -> None:
    """Due, but the interval straddles expireAt: too close to tell, so nothing happens."""
    h = _harness(tmp_path, error_ms=2_000)
    h.schedule("k", delay_ms=0, lifetime_ms=1_000)  # expireAt = T0 + 1000
    h.clock.advance(2_500)  # interval [T0+500, T0+4500]: due, and expireAt inside it
    h.tick(5)
    kinds = _kinds(h)
    assert "PublishAdmission" not in kinds and "Expire" not in kinds
    assert h.message("k").status is Status.SCHEDULED
    h.clock.advance(500)  # earliest == expireAt: provably expired
    h.tick(2)
    m = h.message("k")
    assert m.status is Status.EXPIRED
    assert h.sends == [] and h.delivered() == []
    h.close()


def test_latest_exactly_at_expire_at_neither_admits_nor_expires(tmp_path: Path) -> None:
    """The edges themselves: with the interval's latest end exactly on expireAt (and its
    earliest past actionAt) the timer is in the pause band; one millisecond more of the
    earliest end is not enough to expire it, and earliest == expireAt is."""
    h = _harness(tmp_path)
    h.schedule("k", delay_ms=0, lifetime_ms=1_000)
    expire_at_ms = h.message("k").expire_at_ms
    h.clock.advance(expire_at_ms - ERROR_MS - h.clock.now_ms())
    assert h.clock.interval().latest_ms == expire_at_ms
    h.tick(3)
    kinds = _kinds(h)
    assert "PublishAdmission" not in kinds and "Expire" not in kinds
    assert h.message("k").status is Status.SCHEDULED
    h.clock.advance(2 * ERROR_MS - 1)  # earliest == expireAt - 1: not provably expired yet
    h.tick(3)
    assert "Expire" not in _kinds(h) and h.message("k").status is Status.SCHEDULED
    h.clock.advance(1)  # earliest == expireAt
    h.tick(2)
    assert h.message("k").status is Status.EXPIRED
    assert "PublishAdmission" not in _kinds(h) and h.sends == []
    h.close()


def test_latest_one_before_expire_at_admits(tmp_path: Path) -> None:
    h = _harness(tmp_path)
    h.schedule("k", delay_ms=0, lifetime_ms=1_000)
    expire_at_ms = h.message("k").expire_at_ms
    h.clock.advance(expire_at_ms - ERROR_MS - 1 - h.clock.now_ms())
    assert h.clock.interval().latest_ms == expire_at_ms - 1
    h.tick(2)
    assert h.message("k").status is Status.DELIVERED
    assert not h.problems
    h.close()


def test_a_closed_lane_gate_holds_its_lane_and_only_its_lane(tmp_path: Path) -> None:
    h = _harness(tmp_path)
    h.run([(LaneGate("default", "q", "CLOSED", "maintenance"), None)])
    h.schedule("held", delay_ms=0)
    h.schedule("free", delay_ms=0, queue="other")
    h.clock.advance(1_000)  # the due backlog is measured at most once a second
    h.tick(3)
    assert [s.prepared.topic for s in h.sends] == ["other"]
    assert h.message("held").status is Status.SCHEDULED
    assert h.runtime.metrics.value("nereus_due_backlog") == 1
    h.run([(LaneGate("default", "q", "OPEN"), None)])
    h.tick(2)
    assert h.message("held").status is Status.DELIVERED
    assert not h.problems
    h.close()


def test_a_paused_shard_fires_and_expires_nothing_but_takes_commands(tmp_path: Path) -> None:
    h = _harness(tmp_path)
    h.schedule("due", delay_ms=0)
    h.schedule("short", delay_ms=0, lifetime_ms=1_000)
    h.schedule("doomed", delay_ms=0)
    assert h.run([(ShardState("PAUSED", "operator"), None)])[0].code is (Code.SHARD_STATE_CHANGED)
    h.clock.advance(5_000)
    h.tick(3)
    kinds = _kinds(h)
    assert "PublishAdmission" not in kinds and "Expire" not in kinds
    assert h.sends == []
    assert h.run([(Cancel("default", "q", "doomed"), None)])[0].code is Code.CANCELED
    h.run([(ShardState("ACTIVE_FOR_COMMANDS"), None)])
    h.tick(3)
    assert h.message("due").status is Status.DELIVERED
    assert h.message("short").status is Status.EXPIRED
    assert h.message("doomed").status is Status.CANCELED
    assert len(h.delivered()) == 1
    h.close()


class StumblingClock(SimulatedClock):
    """A simulated clock whose next readings can be scripted (e.g. a step backwards that
    lands between the Admission's commit and the send)."""

    def __init__(self, true_ms: int, *, error_ms: int) -> None:
        super().__init__(true_ms, error_ms=error_ms)
        self.script: list[TrustedInterval] = []

    def interval(self) -> TrustedInterval:
        return self.script.pop(0) if self.script else super().interval()


def test_an_admitted_attempt_waits_for_a_certain_clock_before_the_send(tmp_path: Path) -> None:
    clock = StumblingClock(T0_MS, error_ms=ERROR_MS)
    h = Harness(tmp_path, clock)
    r = h.schedule("k", delay_ms=100)
    assert r.deliver_at_ms is not None
    clock.advance(100 + ERROR_MS)
    good = clock.interval()
    # Admitted under a good reading; the reading at send time is less certain.
    clock.script = [good, TrustedInterval(r.deliver_at_ms - 50, r.deliver_at_ms + 50)]
    h.tick()
    m = h.message("k")
    assert m.status is Status.PUBLISHING
    (attempt,) = h.attempts(m.message_id)
    assert attempt.status is AttemptStatus.PUBLISHING
    assert h.sends == [], "sent although the clock could not prove deliverAt had come"
    assert h.runtime.metrics.value("nereus_pending_sends") == 1
    h.tick(2)
    assert len(h.sends) == 1 and h.sends[0].attempt_id == attempt.attempt_id
    (record,) = h.delivered()
    assert record.delivered_at_ms >= record.deliver_at_ms
    assert h.message("k").status is Status.DELIVERED
    assert not h.problems
    h.close()


def test_the_send_gate_at_the_exact_edge_of_the_action_time(tmp_path: Path) -> None:
    """Admitted with earliest == actionAt; then the reading at send time steps back by one
    millisecond (its latest end still well past actionAt): the send waits. A reading whose
    earliest end is exactly actionAt again lets it go."""
    clock = StumblingClock(T0_MS, error_ms=ERROR_MS)
    h = Harness(tmp_path, clock)
    r = h.schedule("k", delay_ms=100)
    assert r.deliver_at_ms is not None
    action_at_ms = r.deliver_at_ms
    clock.advance(action_at_ms + ERROR_MS - clock.now_ms())
    exact = clock.interval()
    assert exact.earliest_ms == action_at_ms
    short = TrustedInterval(action_at_ms - 1, action_at_ms - 1 + 2 * ERROR_MS)
    clock.script = [exact, short]
    h.tick()
    assert h.message("k").status is Status.PUBLISHING
    assert h.sends == [], "sent while the earliest reading was 1 ms before the action time"
    clock.script = [exact, exact]
    h.tick()
    assert len(h.sends) == 1
    assert not h.problems
    h.close()


def test_a_clock_stepping_backwards_delays_but_never_sends_early(tmp_path: Path) -> None:
    h = _harness(tmp_path)
    h.schedule("k", delay_ms=1_000)
    h.clock.advance(1_000 + ERROR_MS - 1)
    h.clock.step(-10_000)  # the reported clock jumps back
    h.clock.advance(5_000)  # true time is well past deliverAt, the reading is not
    h.tick(5)
    assert h.sends == []
    h.clock.step(10_000)
    h.tick(2)
    assert len(h.sends) == 1
    h.close()


def _mismatched(key: str) -> Schedule:
    """A schedule whose capability the local destination does not offer: every claim fails
    before any send (CLAIM_RESULT_V1 capability_mismatch)."""
    payload = b"p"
    return Schedule(
        "default",
        "q",
        key,
        "t-1",
        hashlib.sha256(payload).hexdigest(),
        len(payload),
        delay_ms=0,
        capability=Capability("delayed_handoff"),
    )


def test_a_permanent_pre_send_error_spends_the_budget_and_dead_letters(tmp_path: Path) -> None:
    h = _harness(tmp_path)
    assert h.run([(_mismatched("k"), b"p")])[0].code is Code.SCHEDULED
    max_attempts = KernelConfig().max_attempts
    for spent in range(1, max_attempts + 1):
        h.clock.advance(KernelConfig().backoff_max_ms)
        h.tick(2)
        m = h.message("k")
        assert m.attempts_spent == spent and m.last_error == "capability_mismatch"
    assert m.status is Status.DEAD_LETTERED
    assert h.attempts(m.message_id) == [], "a claim failure admitted an attempt"
    assert h.delivered() == []
    (dead,) = h.delivered("q.dlq")
    headers = dict(dead.headers)
    assert dead.payload == b"p" and dead.message_id == m.message_id
    assert headers["nereus-dlq-attempts-spent"] == str(max_attempts)
    assert headers["nereus-dlq-last-error"] == "capability_mismatch"
    assert not h.problems
    h.close()


def test_an_expiry_is_proposed_once(tmp_path: Path) -> None:
    h = _harness(tmp_path)
    h.schedule("k", delay_ms=0, lifetime_ms=1_000)
    h.clock.advance(5_000)
    before = h.store.log_last_position
    h.tick()
    assert h.message("k").status is Status.EXPIRED
    assert [type(e.record) for e in h.store.iter_log(before + 1)] == [Expire]
    h.close()


def test_a_claim_failure_is_proposed_once(tmp_path: Path) -> None:
    h = _harness(tmp_path)
    h.run([(_mismatched("k"), b"p")])
    h.clock.advance(ERROR_MS)
    before = h.store.log_last_position
    h.tick()
    assert h.message("k").attempts_spent == 1
    assert [type(e.record) for e in h.store.iter_log(before + 1)] == [ClaimResult]
    h.close()


def test_admissions_are_proposed_once_per_message(tmp_path: Path) -> None:
    h = _harness(tmp_path)
    for i in range(50):
        h.schedule(f"k{i}", delay_ms=0)
    h.clock.advance(ERROR_MS)
    h.tick()
    admissions = [r for r in records(h.log()) if isinstance(r, PublishAdmission)]
    assert len(admissions) == 50
    assert len({a.message_id for a in admissions}) == 50
    h.tick(2)
    assert len(h.delivered()) == 50
    h.close()
