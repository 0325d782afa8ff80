"""A cancel whose verdict would change nothing (a key with no row, a finished timer, a
precondition that fails, a frozen shard), with no command for the key in flight, is answered
from committed state without an entry, by the kernel's own verdict (`runtime/absent.py`;
specs/http.md, "DELETE without an entry"); a pending timer's cancel is decided by the log.

The rules, each checked here against answers written from the rule:
* such a cancel never appends, and answers `absent` (`ok` False, no message id) for a key
  with no row or a cancelled one;
* a cancel submitted while a command for its key is queued or being committed is appended
  behind it and decided after it; a record other than a client command in flight (a shard
  state change) sends every cancel through the log;
* commands of one key are answered as if decided one by one in the order they were
  submitted, whatever the interleaving of submits and commits (hypothesis, against a naive
  model of the lifecycle table's rows for schedule and cancel);
* under threads, a cancel racing a schedule of its key answers what the log order says: the
  position its answer holds at is before the schedule's exactly when it says `absent`;
* a finished row answers from the snapshot as the log would: `absent` for a cancelled one,
  `too_late` with the attempt and its evidence for a delivered one
  (tests/runtime/test_cancel_rate.py
  sends the same cancels both ways and compares).
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nereus.adapters import Nereus
from nereus.adapters.clock import SimulatedClock, SystemClock
from nereus.adapters.local.destination import LocalDestination
from nereus.kernel.digest import state_digest
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.records import Appendable, Cancel, ShardState
from nereus.replay.fold import replay
from nereus.runtime.intake import CommandFuture, Intake
from nereus.service.arguments import cancel_record, schedule_record
from tests.support.runtime_harness import T0_MS

CANCELS = int(os.environ.get("NEREUS_ABSENT_CANCELS", "2000"))
RACES = int(os.environ.get("NEREUS_ABSENT_RACES", "200"))
RACE_SEED = int(os.environ.get("NEREUS_ABSENT_RACE_SEED", "31"))
EXAMPLES = int(os.environ.get("NEREUS_ABSENT_EXAMPLES", "40"))
WAIT_S = 20.0


def _clock() -> SimulatedClock:
    return SimulatedClock(T0_MS, error_ms=5)


def _replay_matches(n: Nereus) -> bool:
    _, result = replay(n.store.iter_log(), n.store.config)
    with n.store.state_view() as state:
        return state_digest(state) == result.digest


def _settle(n: Nereus, *futures: CommandFuture) -> None:
    """Tick on this thread (no runtime thread runs) until every future is answered."""
    deadline = time.monotonic() + WAIT_S
    while not all(f.done() for f in futures):
        assert time.monotonic() < deadline, "commands were not committed"
        n.runtime.run_once()


def test_cancels_of_keys_without_a_row_never_append(tmp_path: Path) -> None:
    with Nereus.open(str(tmp_path), clock=_clock()) as n:
        n.start()
        assert n.schedule("q", "real", b"x", delay_ms=60_000).status == "scheduled"
        end = n.store.log_last_position
        for i in range(CANCELS):
            r = n.cancel("q", f"never-{i}", tenant="acme" if i % 2 else "default", txn=f"t{i}")
            assert (r.ok, r.status, r.message_id, r.txn) == (False, "absent", None, f"t{i}")
        # "No row yet" is the one precondition a missing row meets.
        assert n.cancel("q", "never", expected_version=0).status == "absent"
        # Another tenant's key of the same name is another row, which does not exist.
        assert n.cancel("q", "real", tenant="acme").status == "absent"
        assert n.store.log_last_position == end, "a cancel of a missing key was appended"
        # A timer that exists is cancelled, through the log.
        assert n.cancel("q", "real").status == "canceled"
        assert n.store.log_last_position == end + 1
        assert _replay_matches(n)


def test_the_async_calls_take_the_same_answer(tmp_path: Path) -> None:
    with Nereus.open(str(tmp_path), clock=_clock()) as n:
        n.start()
        end = n.store.log_last_position

        async def main() -> list[str]:
            answers = await asyncio.gather(*(n.cancel_async("q", f"k{i}") for i in range(200)))
            return [r.status for r in answers]

        assert asyncio.run(main()) == ["absent"] * 200
        assert n.store.log_last_position == end


def test_a_cancel_behind_a_command_for_its_key_is_decided_after_it(tmp_path: Path) -> None:
    with Nereus.open(str(tmp_path), clock=_clock()) as n:
        scheduled = n.submit([schedule_record("q", "k", b"x", delay_ms=60_000)])
        cancelled = n.submit([cancel_record("q", "k")])
        # Nothing is in flight for another key: its cancel is answered at once.
        elsewhere = n.submit([cancel_record("q", "other")])
        assert elsewhere.done() and elsewhere.result(0)[0].code == "absent"
        assert not scheduled.done() and not cancelled.done()
        _settle(n, scheduled, cancelled)
        (s,), (c,) = scheduled.result(0), cancelled.result(0)
        assert (s.code, c.code) == ("scheduled", "canceled")
        assert c.position > s.position
        assert n.store.log_last_position == 2


def test_a_record_that_is_not_a_command_in_flight_sends_cancels_through_the_log(
    tmp_path: Path,
) -> None:
    with Nereus.open(str(tmp_path), clock=_clock()) as n:
        frozen = n.runtime.submit([(ShardState("FROZEN", "test"), None)])
        cancelled = n.submit([cancel_record("q", "k")])
        assert not cancelled.done(), "answered past a shard state change in flight"
        _settle(n, frozen, cancelled)
        assert cancelled.result(0)[0].code == "shard_not_active"
        # A committed FROZEN state refuses commands; a refusal changes nothing, so the
        # snapshot gives it without an entry.
        end = n.store.log_last_position
        assert n.cancel("q", "k").code == "shard_not_active"
        assert n.store.log_last_position == end
        thawed = n.runtime.submit([(ShardState("ACTIVE_FOR_COMMANDS", "test"), None)])
        _settle(n, thawed)
        end = n.store.log_last_position
        assert n.cancel("q", "k").status == "absent"
        assert n.store.log_last_position == end


def test_finished_rows_answer_without_an_entry_and_pending_ones_through_the_log(
    tmp_path: Path,
) -> None:
    with Nereus.open(str(tmp_path), clock=SystemClock(assumed_error_ms=2)) as n:
        n.start()
        n.schedule("q", "gone", b"x", delay_ms=60_000)
        end = n.store.log_last_position
        assert n.cancel("q", "gone").status == "canceled"  # pending: through the log
        assert n.store.log_last_position == end + 1
        for _ in range(100):
            again = n.cancel("q", "gone")  # a CANCELED row: absent, from the snapshot
            assert (again.ok, again.status, again.message_id) == (False, "absent", None)
        assert n.cancel("q", "missing", expected_version=3).code == "version_mismatch"
        assert n.cancel("q", "gone", expected_version=1).code == "version_mismatch"
        assert n.store.log_last_position == end + 1
        fired = n.schedule("q", "fired", b"x", delay_ms=0)
        dest = n.destination
        assert isinstance(dest, LocalDestination)
        deadline = time.monotonic() + WAIT_S
        while n.peek("q", "fired").status != "DELIVERED":
            assert time.monotonic() < deadline and n.runtime.halted is None
            time.sleep(0.01)
        (record,) = [r for r in dest.iter_all("q") if r.message_id == fired.message_id]
        end = n.store.log_last_position
        late = n.cancel("q", "fired")
        assert (late.ok, late.status, late.attempt_id) == (False, "too_late", record.attempt_id)
        assert late.evidence is not None and late.evidence["offset"] == record.offset
        assert n.store.log_last_position == end
        assert _replay_matches(n)


def test_a_schedule_committed_while_a_cancel_is_checked_is_seen(tmp_path: Path) -> None:
    """The intake is asked before the store is read: a schedule whose commit completes in
    between is no longer counted, but is in the snapshot (read the store first and it would
    be in neither, and the cancel would be ordered before a schedule submitted before it)."""
    with Nereus.open(str(tmp_path), clock=_clock()) as n:
        scheduled = n.submit([schedule_record("q", "k", b"x", delay_ms=60_000)])
        intake = n.runtime.intake
        asked = intake.in_flight

        def committing_meanwhile(timer_keys: Sequence[str]) -> bool:
            _settle(n, scheduled)
            return asked(timer_keys)

        intake.in_flight = committing_meanwhile  # type: ignore[method-assign]
        cancelled = n.submit([cancel_record("q", "k")])
        _settle(n, cancelled)
        (s,), (c,) = scheduled.result(0), cancelled.result(0)
        assert (s.code, c.code) == ("scheduled", "canceled")
        assert c.position > s.position


def test_an_appended_entry_not_yet_folded_is_not_taken_for_absence(tmp_path: Path) -> None:
    with Nereus.open(str(tmp_path), clock=_clock()) as n:
        # An entry in the log that the store has not folded (an import's tail, say).
        n.store.append([schedule_record("q", "k", b"x", delay_ms=60_000)], T0_MS)
        assert n.store.meta.position < n.store.log_last_position
        cancelled = n.submit([cancel_record("q", "k")])
        assert not cancelled.done()
        _settle(n, cancelled)
        assert cancelled.result(0)[0].code == "canceled"


def test_the_intake_counts_a_key_in_flight_until_every_unit_before_it_is_answered() -> None:
    intake = Intake(1_000, lambda: None)
    units = [intake.put([cancel_record("q", key)]) for key in ("a", "b", "c")]
    got: list[Appendable] = []
    intake.take(got, [], 10)
    assert intake.in_flight(["a"]) and intake.in_flight(["b"]) and intake.in_flight(["c"])
    units[1]._set([])  # answered out of order: kept in flight until "a" is answered
    assert intake.in_flight(["b"])
    units[0]._set([])
    assert not intake.in_flight(["a"]) and not intake.in_flight(["b"])
    assert intake.in_flight(["c"]) and intake.in_flight(["x", "c"])
    units[2]._set([])
    assert not intake.in_flight(["a", "b", "c"])
    # A timer key is counted for every tenant and queue: conservative, never wrong.
    unit = intake.put([cancel_record("other-queue", "a", tenant="acme")])
    assert intake.in_flight(["a"])
    unit._fail(RuntimeError("halted"))  # a failed unit is answered too
    assert not intake.in_flight(["a"])


def test_the_intake_forgets_answered_keys() -> None:
    intake = Intake(1_000_000, lambda: None)
    for i in range(20_000):
        future = intake.put([cancel_record("q", f"k{i}")])
        intake.take([], [], 10)
        future._set([])
    assert not intake.in_flight(["k0", "k19999"])
    assert len(intake._in_flight.latest) <= 2_048, "answered keys are kept without bound"


# Submission order, against a model --------------------------------------------------------

KEYS = ("a", "b", "c")
Step = tuple[str, str]
steps = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(("schedule", "cancel")), st.sampled_from(KEYS)),
        st.just(("tick", "")),
    ),
    max_size=30,
)


class _Model:
    """The committed rows of schedule/cancel on fresh txns (lifecycle table: schedule on no
    row or a CANCELED row is `scheduled`, on a SCHEDULED row a change is `rescheduled`;
    cancel of SCHEDULED is `canceled`, of anything else `absent`, at once and without an
    entry when nothing for the key is queued), and what is queued."""

    def __init__(self) -> None:
        self.rows: dict[str, str] = {}
        self.queued: list[tuple[str, str, int]] = []  # (op, key, answer index)
        self.answers: dict[int, str] = {}
        self.appended = 0

    def submit(self, op: str, key: str, index: int) -> bool:
        """Whether the answer is due at once, without an entry."""
        idle = all(k != key for _, k, _ in self.queued)
        if op == "cancel" and self.rows.get(key) != "SCHEDULED" and idle:
            self.answers[index] = "absent"
            return True
        self.queued.append((op, key, index))
        return False

    def commit(self) -> None:
        for op, key, index in self.queued:
            live = self.rows.get(key) == "SCHEDULED"
            if op == "schedule":
                self.answers[index] = "rescheduled" if live else "scheduled"
                self.rows[key] = "SCHEDULED"
            else:
                self.answers[index] = "canceled" if live else "absent"
                if live:
                    self.rows[key] = "CANCELED"
            self.appended += 1
        self.queued = []


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(steps)
def test_one_keys_commands_are_answered_in_the_order_they_were_submitted(
    plan: list[Step],
) -> None:
    model = _Model()
    futures: list[CommandFuture] = []
    with tempfile.TemporaryDirectory() as data, Nereus.open(data, clock=_clock()) as n:
        for op, key in [*plan, ("tick", "")]:
            if op == "tick":
                _settle(n, *futures)
                model.commit()
                continue
            if op == "schedule":
                item = schedule_record("q", key, b"x", delay_ms=60_000)
            else:
                item = cancel_record("q", key)
            future = n.submit([item])
            at_once = model.submit(op, key, len(futures))
            assert future.done() == at_once, (op, key, "answered at once?", future.done())
            futures.append(future)
        codes = [str(f.result(0)[0].code) for f in futures]
        assert codes == [model.answers[i] for i in range(len(futures))]
        assert n.store.log_last_position == model.appended
        assert _replay_matches(n)


# Threads: a cancel racing a schedule of its key ---------------------------------------------


def _lag(seconds: float) -> None:
    # A sleep, not a spin: a spinning thread would keep the interpreter lock from the other.
    if seconds > 0:
        time.sleep(seconds)


def _race(
    n: Nereus, key: str, cancel_lag_s: float
) -> tuple[EntryOutcome, EntryOutcome, dict[str, float]]:
    """Schedule and cancel `key` from two threads released together, the cancel
    `cancel_lag_s` later (negative: the schedule later): their outcomes, and when (monotonic)
    the schedule was submitted and answered and the cancel began."""
    gate = threading.Barrier(2)
    times: dict[str, float] = {}
    out: dict[str, EntryOutcome] = {}
    scheduling = schedule_record("q", key, b"x", delay_ms=60_000)
    cancelling = cancel_record("q", key)

    def schedule() -> None:
        gate.wait()
        _lag(-cancel_lag_s)
        future = n.submit([scheduling])
        times["s_submitted"] = time.monotonic()
        out["s"] = future.result(WAIT_S)[0]
        times["s_end"] = time.monotonic()

    def cancel() -> None:
        gate.wait()
        _lag(cancel_lag_s)
        times["c_start"] = time.monotonic()
        out["c"] = n.submit([cancelling]).result(WAIT_S)[0]

    threads = [threading.Thread(target=schedule), threading.Thread(target=cancel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    return out["s"], out["c"], times


def test_a_cancel_racing_a_schedule_answers_what_the_log_order_says(tmp_path: Path) -> None:
    with Nereus.open(str(tmp_path), clock=_clock()) as n:
        n.start()
        answers = {"canceled": 0, "absent": 0}
        appended_cancels = 0
        rng = random.Random(RACE_SEED)
        for i in range(RACES):
            key = f"race-{i}"
            # Lags around the time a submit takes, so either may reach the intake first.
            s, c, times = _race(n, key, rng.uniform(-0.0005, 0.002))
            assert s.code == "scheduled", "a cancel never creates a row"
            answers[str(c.code)] += 1
            # Position 0 is the empty log: an answer valid before anything was appended.
            entries = list(n.store.iter_log(c.position, c.position)) if c.position else []
            own = any(isinstance(e.record, Cancel) and e.record.timer_key == key for e in entries)
            appended_cancels += own
            if c.code == "canceled":
                assert own and c.position > s.position
                assert n.peek("q", key).status == "CANCELED"
            else:
                assert c.code == "absent"
                # Valid as of a position the schedule is not in yet: ordered before it.
                assert c.position < s.position
                assert n.peek("q", key).status == "SCHEDULED"
                # Real time: a schedule answered before the cancel began is in its snapshot;
                # one submitted before it (one caller's order) is decided before it.
                assert times["s_end"] > times["c_start"]
                assert times["s_submitted"] > times["c_start"]
        assert sum(answers.values()) == RACES
        # Both orders happened, or the race proved nothing (the seed is fixed: a change of
        # speed, not of luck, would make this fail).
        assert answers["canceled"] and answers["absent"], answers
        assert n.store.log_last_position == RACES + appended_cancels
        assert _replay_matches(n)
