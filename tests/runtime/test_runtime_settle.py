"""What a finished evidence search may settle, at the runtime, with no broker.

Two rules of `runtime.settle` and `runtime.recovery`, each with a destination whose searches
the test plans (complete or not, under which fence), on real LMDB stores driven tick by tick:

* **The look before an uncertain retry is a complete search.** A retry of a generation whose
  attempt is UNKNOWN is claimed only after a search that read everything it meant to, and
  that started once the retry was due, missed every UNKNOWN attempt of the generation. An
  incomplete search (a bound, an unreachable partition) says nothing about what it did not
  read: while searches are incomplete the retry waits, and a record that is at the
  destination is found by the first complete one instead of being written twice.
* **A proof of absence is keyed to the attempt's own fence.** A search proves absent only
  attempts sent under the fence it was made after, never every attempt because the
  destination fences its producer *now*: an attempt admitted unfenced (before a change to
  the transactional capability) or under another fence (another transactional id, as a
  library instance may be given) is UNKNOWN after a restart, never NOT_PUBLISHED, and never
  written to the log with a proof the kernel must refuse.

The same rules against the real broker are in tests/adapters/kafka/test_kafka_settle.py.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.adapters.clock import SimulatedClock
from nereus.adapters.local.destination import LocalDestination
from nereus.kernel.codes import Code
from nereus.kernel.config import KernelConfig
from nereus.kernel.model import AttemptStatus, Status
from nereus.kernel.records import Evidence, NotPublished, PublishOutcome, Unknown
from nereus.runtime.destination import Fence, FinishedSearch, Lookup, Search, SearchOutcome
from nereus.runtime.settle import Settler, Want
from tests.support.builders import records
from tests.support.runtime_harness import T0_MS, CrashBeforeWrite, Harness

ERROR_MS = 5
BACKOFF_MS = KernelConfig().backoff_ms(1)  # the first retry after an UNKNOWN
# Past the longest wait between two failed searches (RuntimeConfig.evidence_retry_max_ms).
SEARCH_RETRY_MAX_MS = 30_000
EXAMPLES = int(os.environ.get("NEREUS_SETTLE_EXAMPLES", "25"))


class SearchPlan:
    """Whether each search the destination makes is complete, in order (`default` once the
    list is used up), and the clock time and completeness of every search made."""

    def __init__(self, clock: SimulatedClock, planned: Sequence[bool] = (), default: bool = True):
        self.clock = clock
        self.planned = list(planned)
        self.default = default
        self.made: list[tuple[int, bool]] = []

    def take(self) -> bool:
        complete = self.planned.pop(0) if self.planned else self.default
        self.made.append((self.clock.now_ms(), complete))
        return complete


def planned(plan: SearchPlan, fence_id: str | None = None) -> type[LocalDestination]:
    """The local destination with searches as `plan` says: a complete one finds every record
    it holds, an incomplete one finds nothing (the part it did not read held them). With
    `fence_id`, its producer is fenced at open and its searches are made after that fence."""

    class Planned(LocalDestination):
        def open(self, store_id: str) -> None:
            super().open(store_id)
            self.fence_id = fence_id

        def search(self, lookups: Sequence[Lookup], wake: Callable[[], None]) -> Search:
            complete = plan.take()
            found = super().search(lookups, wake).outcome().found if complete else {}
            outcome = SearchOutcome(
                found,
                complete=complete,
                fence=Fence(fence_id, T0_MS) if fence_id is not None else None,
                searched="everything" if complete else "one partition of two",
            )
            return FinishedSearch(outcome)

    return Planned


def _outcomes(h: Harness, attempt_id: str) -> list[PublishOutcome]:
    return [
        r for r in records(h.log()) if isinstance(r, PublishOutcome) and r.attempt_id == attempt_id
    ]


def _send_then_crash(h: Harness, *, written: bool) -> str:
    """Schedule "k" due now, let it be admitted and sent, and die before its outcome is on the
    record: after the destination wrote it (`written`) or before. Returns the attempt id."""
    assert h.schedule("k", b"once", delay_ms=0).code is Code.SCHEDULED
    h.clock.advance(2 * ERROR_MS)
    h.crash_before_write = not written
    if written:
        h.tick()
    else:
        with pytest.raises(CrashBeforeWrite):
            h.tick()
    (send,) = h.sends
    h.crash()
    h.crash_before_write = False
    return send.attempt_id


# The look before an uncertain retry ---------------------------------------------------------


def test_an_incomplete_search_is_not_the_look_before_an_uncertain_retry(tmp_path: Path) -> None:
    clock = SimulatedClock(T0_MS, error_ms=ERROR_MS)
    plan = SearchPlan(clock, default=False)
    h = Harness(tmp_path, clock, destination_cls=planned(plan))
    first = _send_then_crash(h, written=True)

    h.reopen()
    h.tick()
    m = h.message("k")
    assert m.status is Status.UNCERTAIN  # nothing proved either way: UNKNOWN, retry armed
    retry_at_ms = m.action_at_ms
    for _ in range(6):
        h.clock.advance(SEARCH_RETRY_MAX_MS)
        h.tick(3)
        assert len(h.sends) == 1, "the retry went out after incomplete searches only"
        assert h.message("k").status is Status.UNCERTAIN
    looks = [complete for at_ms, complete in plan.made if at_ms >= retry_at_ms]
    assert looks and not any(looks), "the retry was never looked for"

    plan.default = True
    h.clock.advance(SEARCH_RETRY_MAX_MS)
    h.tick(3)
    m = h.message("k")
    assert m.status is Status.DELIVERED
    (attempt,) = h.attempts(m.message_id)
    assert attempt.attempt_id == first and attempt.status is AttemptStatus.PUBLISHED
    assert len(h.sends) == 1 and len(h.delivered()) == 1
    assert not h.problems, h.problems
    h.close()


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    written=st.booleans(),
    plan_=st.lists(st.booleans(), max_size=8),
    gaps_ms=st.lists(st.sampled_from([1, 100, 1_000, BACKOFF_MS, 5_000, 30_000]), max_size=10),
)
def test_an_uncertain_retry_follows_only_a_complete_search_made_after_it_came_due(
    written: bool, plan_: list[bool], gaps_ms: list[int]
) -> None:
    """Whatever the searches do: a record at the destination is never written again, and a
    retry is sent only after a complete search made at or after its action time."""
    with tempfile.TemporaryDirectory() as tmp:
        clock = SimulatedClock(T0_MS, error_ms=ERROR_MS)
        plan = SearchPlan(clock, plan_, default=False)
        h = Harness(Path(tmp), clock, destination_cls=planned(plan))
        try:
            first = _send_then_crash(h, written=written)
            h.reopen()
            h.tick()
            retry_at_ms = h.message("k").action_at_ms
            retried_at_ms: int | None = None
            ends = len(gaps_ms)
            for step, gap_ms in enumerate([*gaps_ms, *[SEARCH_RETRY_MAX_MS] * 3]):
                if step == ends:
                    # The plan is over (whatever of it is left): every search completes.
                    plan.planned, plan.default = [], True
                h.clock.advance(gap_ms)
                h.tick(2)
                if retried_at_ms is None and len(h.sends) > 1:
                    retried_at_ms = h.clock.now_ms()
            h.tick(2)  # the last send's outcome
            assert h.message("k").status is Status.DELIVERED
            assert len(h.delivered()) == 1, "a record at the destination was written again"
            if written:
                assert retried_at_ms is None
                (attempt,) = h.attempts(h.message("k").message_id)
                assert attempt.attempt_id == first and attempt.status is AttemptStatus.PUBLISHED
            else:
                assert retried_at_ms is not None
                looks = [
                    at_ms
                    for at_ms, complete in plan.made
                    if complete and retry_at_ms <= at_ms <= retried_at_ms
                ]
                assert looks, (retry_at_ms, retried_at_ms, plan.made)
            assert not h.problems, h.problems
        finally:
            h.close()


# Proofs keyed to the attempt's own fence ----------------------------------------------------


@pytest.mark.parametrize(
    ("admitted_under", "restarted_under"),
    [(None, "fence.B"), ("fence.A", "fence.B")],
    ids=["unfenced-then-transactional", "another-transactional-id"],
)
def test_a_search_after_another_fence_leaves_the_attempt_unknown(
    tmp_path: Path, admitted_under: str | None, restarted_under: str
) -> None:
    """The attempt was admitted under one producer and never written; after the restart the
    destination fences another one and its complete search misses the attempt. That fence
    says nothing about the producer the attempt was sent under (it may still write): the
    attempt is UNKNOWN, the uncertain retry delivers the timer once."""
    clock = SimulatedClock(T0_MS, error_ms=ERROR_MS)
    h = Harness(tmp_path, clock, destination_cls=planned(SearchPlan(clock), admitted_under))
    first = _send_then_crash(h, written=False)

    h.destination_cls = planned(SearchPlan(clock), restarted_under)
    h.reopen()
    h.tick()
    m = h.message("k")
    (attempt,) = h.attempts(m.message_id)
    assert attempt.attempt_id == first and attempt.fence_id == admitted_under
    assert attempt.status is AttemptStatus.UNKNOWN, attempt
    assert attempt.error_code == "send_gate_lost"
    assert [type(o.result) for o in _outcomes(h, first)] == [Unknown]
    assert m.status is Status.UNCERTAIN

    h.clock.advance(BACKOFF_MS + 2 * ERROR_MS)
    h.tick(3)
    m = h.message("k")
    assert m.status is Status.DELIVERED
    old, new = h.attempts(m.message_id)
    assert old.status is AttemptStatus.UNKNOWN and new.status is AttemptStatus.PUBLISHED
    assert new.fence_id == restarted_under
    assert len(h.delivered()) == 1
    assert not [o for o in _outcomes(h, first) if isinstance(o.result, NotPublished)]
    assert not h.problems, h.problems
    h.close()


def test_a_search_after_the_attempts_own_fence_proves_it_absent(tmp_path: Path) -> None:
    """The same restart under the same fence: the complete miss is a proof of absence."""
    clock = SimulatedClock(T0_MS, error_ms=ERROR_MS)
    h = Harness(tmp_path, clock, destination_cls=planned(SearchPlan(clock), "fence.A"))
    first = _send_then_crash(h, written=False)
    h.reopen()
    h.tick()
    (proven,) = [o.result for o in _outcomes(h, first)]
    assert isinstance(proven, NotPublished) and proven.proof is not None, proven
    assert proven.proof.fence_id == "fence.A"
    h.clock.advance(60_000)
    h.tick(3)
    assert h.message("k").status is Status.DELIVERED and len(h.delivered()) == 1
    h.close()


FENCES = st.sampled_from([None, "f1", "f2"])


class Answering(LocalDestination):
    """A destination whose every search answers `outcome`."""

    outcome = SearchOutcome({}, complete=False)

    def search(self, lookups: Sequence[Lookup], wake: Callable[[], None]) -> Search:
        return FinishedSearch(self.outcome)


def test_the_settler_keys_every_proof_to_the_attempts_fence(tmp_path: Path) -> None:
    """Whatever fence the destination holds now, a settled lookup carries a proof exactly
    when the search was complete, missed it, and was made after the attempt's own fence."""
    dest = Answering(str(tmp_path / "destination"))
    evidence = Evidence("q", 0, 7, T0_MS)

    @settings(max_examples=EXAMPLES * 4, deadline=None)
    @given(
        attempt_fence=FENCES,
        destination_fence=FENCES,
        search_fence=FENCES,
        complete=st.booleans(),
        found=st.booleans(),
    )
    def check(
        attempt_fence: str | None,
        destination_fence: str | None,
        search_fence: str | None,
        complete: bool,
        found: bool,
    ) -> None:
        outcome = SearchOutcome(
            {"a1": evidence} if found else {},
            complete=complete,
            fence=Fence(search_fence, T0_MS) if search_fence is not None else None,
        )
        dest.fence_id = destination_fence
        dest.outcome = outcome
        settler = Settler(dest, lambda: None)
        settler.want([Want(Lookup("a1", "q", T0_MS), "attempt", attempt_fence)])
        (settled,) = settler.step(T0_MS)
        proves = (
            not found and complete and attempt_fence is not None and search_fence == attempt_fence
        )
        assert (settled.proof is not None) == proves
        assert settled.evidence == (evidence if found else None)
        if settled.proof is not None:
            assert settled.proof.fence_id == attempt_fence

    try:
        check()
    finally:
        dest.close()
