"""Recovery of admitted attempts after a crash, driven tick by tick on real LMDB stores.

The Publish Admission is the point of no return: once it is durable the attempt may be at the
destination, so a restarted runtime must find out rather than guess. The local destination
holds its directory's lock, so the restarted one fences the dead writer: an attempt whose
send never happened is proven absent (NOT_PUBLISHED with the proof) and delivered once by an
ordinary retry. Through a destination that cannot be fenced (`UnfencedDestination`) the same
attempt is recorded UNKNOWN (never NOT_PUBLISHED from absence, never re-sent under the same
attempt id); its message becomes UNCERTAIN and the armed uncertain retry delivers it once. An
attempt that reached the destination before the crash is resolved PUBLISHED by the
destination's evidence, and nothing is sent again. Every send in these tests is checked, at
the moment of the send and in a read transaction of its own, to find its attempt durably
PUBLISHING in the shard store.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nereus.adapters.clock import SimulatedClock
from nereus.adapters.local.destination import LocalDestination
from nereus.kernel.codes import Code
from nereus.kernel.config import KernelConfig
from nereus.kernel.model import Attempt, AttemptStatus, Status, Table
from nereus.kernel.records import Evidence, NotPublished, Published, PublishOutcome, Unknown
from nereus.runtime.config import RuntimeConfig
from nereus.runtime.destination import Fence, FinishedSearch, Lookup, Search, SearchOutcome
from nereus.storage.store import ShardStore
from tests.support.builders import records
from tests.support.runtime_harness import T0_MS, CrashBeforeWrite, Harness

ERROR_MS = 5
BACKOFF_MS = KernelConfig().backoff_ms(1)  # the first retry after an UNKNOWN


def _clock() -> SimulatedClock:
    return SimulatedClock(T0_MS, error_ms=ERROR_MS)


def _outcomes(h: Harness, attempt_id: str) -> list[PublishOutcome]:
    return [
        r for r in records(h.log()) if isinstance(r, PublishOutcome) and r.attempt_id == attempt_id
    ]


def _admit_and_crash_before_send(h: Harness, keys: list[str]) -> list[str]:
    """Schedule `keys` due in 1 s, let the runtime admit them, and die inside the send,
    before the destination write. Returns the admitted attempt ids, in the order of `keys`."""
    for key in keys:
        assert h.schedule(key, key.encode(), delay_ms=1_000).code is Code.SCHEDULED
    h.clock.advance(1_000 + ERROR_MS)
    h.crash_before_write = True
    with pytest.raises(CrashBeforeWrite):
        h.tick()
    by_message = {s.prepared.message_id: s.attempt_id for s in h.sends}
    assert len(h.sends) == len(by_message) == len(keys)
    attempt_ids = [by_message[h.message(key).message_id] for key in keys]
    h.crash()
    return attempt_ids


class UnfencedDestination(LocalDestination):
    """The local destination as a producer that cannot be fenced would be (Kafka's
    idempotent one): its searches find what is there and prove nothing."""

    def search(self, lookups: Sequence[Lookup], wake: Callable[[], None]) -> Search:
        outcome = super().search(lookups, wake).outcome()
        return FinishedSearch(msgspec.structs.replace(outcome, fence=None))


def test_admitted_but_unsent_attempts_are_proven_absent_at_restart_and_delivered_once(
    tmp_path: Path,
) -> None:
    keys = ["a", "b/with/slashes", "c"]
    h = Harness(tmp_path, _clock())
    first = _admit_and_crash_before_send(h, keys)
    assert not h.problems, h.problems

    # Restart: the new writer of the destination fences the dead one, and recovery's search
    # proves every attempt it does not find absent; nothing is re-sent under its id.
    h.reopen()
    h.crash_before_write = False
    fence_id = h.destination.fence_id
    assert fence_id is not None and fence_id.startswith("local:")
    sent_before = len(h.sends)
    h.tick()
    assert len(h.sends) == sent_before, "recovery re-sent an attempt blindly"
    for key, attempt_id in zip(keys, first, strict=True):
        m = h.message(key)
        assert m.status is Status.SCHEDULED, key  # an ordinary retry, not an uncertain one
        (attempt,) = h.attempts(m.message_id)
        assert attempt.status is AttemptStatus.NOT_PUBLISHED
        assert attempt.fence_id == fence_id  # admitted by the dead writer, same directory
        (outcome,) = _outcomes(h, attempt_id)
        proven = outcome.result
        assert isinstance(proven, NotPublished), proven
        assert proven.error_code == "absent_after_fence"
        assert proven.proof is not None and proven.proof.fence_id == fence_id
    assert h.obligations() == set()

    # The retry is delivered once, under a new attempt id; nothing is ever UNKNOWN.
    for _ in range(10):
        h.clock.advance(BACKOFF_MS)
        h.tick(3)
    delivered = h.delivered()
    assert sorted(r.message_id for r in delivered) == sorted(h.message(k).message_id for k in keys)
    for key, attempt_id in zip(keys, first, strict=True):
        m = h.message(key)
        assert m.status is Status.DELIVERED, key
        old, new = h.attempts(m.message_id)
        assert old.attempt_id == attempt_id and old.status is AttemptStatus.NOT_PUBLISHED
        assert new.status is AttemptStatus.PUBLISHED
        (record,) = [r for r in delivered if r.message_id == m.message_id]
        assert record.attempt_id == new.attempt_id
        assert record.delivered_at_ms >= record.deliver_at_ms == m.deliver_at_ms
    assert not [
        r
        for r in records(h.log())
        if isinstance(r, PublishOutcome) and isinstance(r.result, Unknown)
    ]
    assert h.obligations() == set()
    assert not h.problems, h.problems
    h.close()


def test_admitted_but_unsent_attempts_become_unknown_and_the_uncertain_retry_delivers_once(
    tmp_path: Path,
) -> None:
    """Without a fence, not finding an attempt proves nothing."""
    keys = ["a", "b/with/slashes", "c"]
    h = Harness(tmp_path, _clock(), destination_cls=UnfencedDestination)
    first = _admit_and_crash_before_send(h, keys)
    assert not h.problems, h.problems

    # The Admissions are durable and nothing reached the destination.
    with ShardStore.open(str(tmp_path / "shard")) as store, store.read() as view:
        for key, attempt_id in zip(keys, first, strict=True):
            attempt = view.get(Table.ATTEMPTS, attempt_id.encode())
            assert isinstance(attempt, Attempt), key
            assert attempt.status is AttemptStatus.PUBLISHING, key
    dest = LocalDestination(str(tmp_path / "destination"))
    assert dest.end_offset("q") == 0
    dest.close()

    # Restart: recovery records UNKNOWN for every attempt whose send gate died, sends nothing.
    h.reopen()
    h.crash_before_write = False
    sent_before = len(h.sends)
    h.tick()
    assert len(h.sends) == sent_before, "recovery re-sent an attempt blindly"
    recovered_at = h.store.log_last_persisted_at_ms
    for key, attempt_id in zip(keys, first, strict=True):
        m = h.message(key)
        assert m.status is Status.UNCERTAIN, key
        (attempt,) = h.attempts(m.message_id)
        assert attempt.attempt_id == attempt_id
        assert attempt.status is AttemptStatus.UNKNOWN
        assert attempt.error_code == "send_gate_lost"
        outcomes = _outcomes(h, attempt_id)
        assert [type(o.result) for o in outcomes] == [Unknown], outcomes
        # The uncertain retry is armed after one backoff, not at once.
        assert m.has_work and m.action_at_ms == recovered_at + BACKOFF_MS
    assert h.obligations() == set(first)

    # Before the retry is due nothing is sent, however often the loop turns.
    h.clock.advance(BACKOFF_MS - 2 * ERROR_MS)
    h.tick(5)
    assert len(h.sends) == sent_before
    assert h.delivered() == []

    # The armed retry: a NEW attempt, sent once, PUBLISHED; the UNKNOWN one stays open.
    h.clock.advance(2 * ERROR_MS + 10)
    h.tick(3)
    retries = h.sends[sent_before:]
    assert len(retries) == len(keys)
    assert not {s.attempt_id for s in retries} & set(first)
    delivered = h.delivered()
    assert sorted(r.message_id for r in delivered) == sorted(h.message(k).message_id for k in keys)
    for key, attempt_id in zip(keys, first, strict=True):
        m = h.message(key)
        assert m.status is Status.DELIVERED, key
        old, new = h.attempts(m.message_id)
        assert old.attempt_id == attempt_id and old.status is AttemptStatus.UNKNOWN
        assert new.status is AttemptStatus.PUBLISHED
        assert m.evidence is not None and new.evidence == m.evidence
        (record,) = [r for r in delivered if r.message_id == m.message_id]
        assert record.attempt_id == new.attempt_id
        assert record.payload == key.encode()
        assert record.delivered_at_ms >= record.deliver_at_ms == m.deliver_at_ms
    assert h.obligations() == set(first)  # no evidence for them: they stay obligations

    # Much later: still exactly one record per timer, and nothing was ever NOT_PUBLISHED.
    h.clock.advance(60_000)
    h.tick(5)
    assert len(h.delivered()) == len(keys)
    assert not [
        r
        for r in records(h.log())
        if isinstance(r, PublishOutcome) and isinstance(r.result, NotPublished)
    ]
    assert not h.problems, h.problems
    h.close()


def test_an_attempt_written_before_the_crash_is_resolved_published_by_evidence(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path, _clock())
    assert h.schedule("k", b"hello", delay_ms=500).code is Code.SCHEDULED
    h.clock.advance(500 + ERROR_MS)
    h.tick()  # admitted, committed, sent: the record is at the destination
    (send,) = h.sends
    (record,) = h.delivered()
    assert record.attempt_id == send.attempt_id
    h.crash()  # the outcome never reached the shard log

    with ShardStore.open(str(tmp_path / "shard")) as store:
        assert not _outcomes_in(store, send.attempt_id)

    h.reopen()
    h.tick()
    m = h.message("k")
    assert m.status is Status.DELIVERED
    (attempt,) = h.attempts(m.message_id)
    assert attempt.attempt_id == send.attempt_id
    assert attempt.status is AttemptStatus.PUBLISHED
    assert attempt.evidence == Evidence("q", 0, record.offset, record.delivered_at_ms)
    assert m.evidence == attempt.evidence
    outcomes = _outcomes(h, send.attempt_id)
    assert [type(o.result) for o in outcomes] == [Published]
    assert h.obligations() == set()

    h.clock.advance(60_000)
    h.tick(5)
    assert len(h.sends) == 1, "a published attempt was sent again"
    assert len(h.delivered()) == 1
    assert not h.problems, h.problems
    h.close()


def _outcomes_in(store: ShardStore, attempt_id: str) -> list[PublishOutcome]:
    return [
        r
        for r in records(store.iter_log())
        if isinstance(r, PublishOutcome) and r.attempt_id == attempt_id
    ]


def test_a_restart_in_the_middle_of_the_loop_keeps_the_committed_outcomes(
    tmp_path: Path,
) -> None:
    """Crash after a full tick: outcomes already logged are facts; recovery finds nothing
    open and re-sends nothing."""
    h = Harness(tmp_path, _clock())
    for i in range(5):
        h.schedule(f"k{i}", delay_ms=100 * i)
    h.clock.advance(400 + ERROR_MS)
    h.tick(3)
    assert len(h.delivered()) == 5
    h.crash()
    h.reopen()
    h.tick(3)
    assert len(h.sends) == 5
    assert len(h.delivered()) == 5
    assert h.obligations() == set()
    assert not h.problems
    h.close()


class LaggingDestination(UnfencedDestination):
    """A destination whose evidence lookup lags behind its writes (like a broker whose
    replica has not caught up): `find` answers None until `visible` is set. A destination
    whose index lags cannot be fenced: a miss proves nothing."""

    visible = False

    def find(self, attempt_id: str, topic: str, since_ms: int) -> Evidence | None:
        return super().find(attempt_id, topic, since_ms) if self.visible else None


def test_unknown_attempt_found_later_is_published_by_evidence_and_not_sent_again(
    tmp_path: Path,
) -> None:
    """Written before the crash, invisible at recovery (UNKNOWN, never NOT_PUBLISHED), found
    when the uncertain retry is claimed: the evidence is recorded instead of a second send."""
    config = RuntimeConfig(reconcile_interval_ms=10**9)  # only the claim path looks
    h = Harness(tmp_path, _clock(), config=config, destination_cls=LaggingDestination)
    h.schedule("k", b"once", delay_ms=0)
    h.clock.advance(ERROR_MS)
    h.tick()
    (send,) = h.sends
    h.crash()

    h.reopen()
    h.tick()
    m = h.message("k")
    assert m.status is Status.UNCERTAIN
    (attempt,) = h.attempts(m.message_id)
    assert attempt.status is AttemptStatus.UNKNOWN

    assert isinstance(h.destination, LaggingDestination)
    h.destination.visible = True
    h.clock.advance(BACKOFF_MS + 2 * ERROR_MS)
    h.tick(3)
    m = h.message("k")
    assert m.status is Status.DELIVERED
    (attempt,) = h.attempts(m.message_id)
    assert attempt.attempt_id == send.attempt_id
    assert attempt.status is AttemptStatus.PUBLISHED
    outcomes = [type(o.result) for o in _outcomes(h, send.attempt_id)]
    assert outcomes[:2] == [Unknown, Published]
    assert NotPublished not in outcomes
    assert len(h.sends) == 1 and len(h.delivered()) == 1
    assert h.obligations() == set()
    h.close()


def test_evidence_found_at_claim_time_is_recorded_once(tmp_path: Path) -> None:
    h = Harness(tmp_path, _clock(), destination_cls=LaggingDestination)
    h.schedule("k", b"once", delay_ms=0)
    h.clock.advance(ERROR_MS)
    h.tick()
    (send,) = h.sends
    h.crash()
    h.reopen()
    h.tick()
    assert isinstance(h.destination, LaggingDestination)
    h.destination.visible = True
    h.clock.advance(BACKOFF_MS + 2 * ERROR_MS)
    before = h.store.log_last_position
    h.tick()
    assert h.message("k").status is Status.DELIVERED
    assert [type(o.result) for o in _outcomes(h, send.attempt_id)] == [Unknown, Published]
    assert h.store.log_last_position - before == 1
    h.close()


def test_reconciliation_resolves_an_unknown_attempt_when_evidence_appears(
    tmp_path: Path,
) -> None:
    """Before the uncertain retry is due, the periodic reconciliation finds the record."""
    config = RuntimeConfig(reconcile_interval_ms=100)
    h = Harness(tmp_path, _clock(), config=config, destination_cls=LaggingDestination)
    h.schedule("k", b"once", delay_ms=0)
    h.clock.advance(ERROR_MS)
    h.tick()
    (send,) = h.sends
    h.crash()

    h.reopen()
    h.tick()
    assert h.message("k").status is Status.UNCERTAIN
    assert isinstance(h.destination, LaggingDestination)
    retry_at = h.message("k").action_at_ms
    h.destination.visible = True
    h.clock.advance(120)  # past the reconcile interval, well before the retry
    assert h.clock.interval().latest_ms < retry_at
    h.tick(3)
    m = h.message("k")
    assert m.status is Status.DELIVERED
    assert [type(o.result) for o in _outcomes(h, send.attempt_id)] == [Unknown, Published]
    assert len(h.sends) == 1 and len(h.delivered()) == 1
    assert h.obligations() == set()
    h.close()


def test_claims_of_a_dead_process_are_dropped_on_start(tmp_path: Path) -> None:
    h = Harness(tmp_path, _clock())
    h.schedule("k", delay_ms=0)
    h.clock.advance(ERROR_MS)
    h.crash_before_write = True
    with pytest.raises(CrashBeforeWrite):
        h.tick()
    h.crash()
    h.reopen()
    assert len(h.runtime.claims) == 0
    with h.store.env.env.begin() as txn, txn.cursor(db=h.store.env.claims) as cursor:
        persisted = [k for k in cursor.iternext(values=False) if not k.startswith(b"\x00")]
    assert persisted, "the dead process's claim should still be on disk before the first tick"
    h.crash_before_write = False
    h.tick()
    with h.store.env.env.begin() as txn, txn.cursor(db=h.store.env.claims) as cursor:
        persisted = [k for k in cursor.iternext(values=False) if not k.startswith(b"\x00")]
    assert persisted == []
    h.close()


class FencedDestination(LocalDestination):
    """The local destination as if its producer could be fenced (as Kafka's transactional
    one is): each incarnation fences its predecessors at open, and its searches say so.
    `complete` decides whether a search read everything after the fence; the records it does
    hold are still found either way."""

    complete = False

    def open(self, store_id: str) -> None:
        super().open(store_id)
        self.fence_id = f"fence.{store_id}"

    def search(self, lookups: Sequence[Lookup], wake: Callable[[], None]) -> Search:
        found = super().search(lookups, wake).outcome().found
        assert self.fence_id is not None
        outcome = SearchOutcome(
            found,
            complete=type(self).complete,
            fence=Fence(self.fence_id, T0_MS),
            searched="every partition" if type(self).complete else "partition 1 not read",
        )
        return FinishedSearch(outcome)


def test_an_incomplete_search_after_the_fence_proves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attempts admitted under a fence and never written: while the searches after the fence
    are incomplete, recovery records nothing (the attempts stay open, nothing is re-sent);
    once one is complete, its proof makes them NOT_PUBLISHED and the timers are delivered."""
    monkeypatch.setattr(FencedDestination, "complete", False)
    keys = ["a", "b"]
    h = Harness(tmp_path, _clock(), destination_cls=FencedDestination)
    first = _admit_and_crash_before_send(h, keys)
    h.reopen()
    h.crash_before_write = False
    for _ in range(5):
        h.clock.advance(2_000)  # past the retry of a failed search, every time
        h.tick(3)
    assert len(h.sends) == len(keys), "an attempt was sent again without a proof"
    for key, attempt_id in zip(keys, first, strict=True):
        (attempt,) = h.attempts(h.message(key).message_id)
        assert attempt.attempt_id == attempt_id
        assert attempt.status is not AttemptStatus.NOT_PUBLISHED, attempt
        assert [o for o in _outcomes(h, attempt_id) if isinstance(o.result, NotPublished)] == []

    monkeypatch.setattr(FencedDestination, "complete", True)
    for _ in range(10):
        h.clock.advance(30_000)
        h.tick(3)
    for key, attempt_id in zip(keys, first, strict=True):
        m = h.message(key)
        (proven,) = [o.result for o in _outcomes(h, attempt_id)]
        assert isinstance(proven, NotPublished) and proven.proof is not None, proven
        assert proven.proof.fence_id.startswith("fence.")
        assert m.status is Status.DELIVERED, key
    assert len(h.delivered()) == len(keys)
    assert not h.problems, h.problems
    h.close()


@given(
    attempt_fence=st.sampled_from([None, "f1", "f2"]),
    search_fence=st.sampled_from([None, "f1", "f2"]),
    complete=st.booleans(),
)
def test_a_search_never_proves_absence_unless_complete_and_under_the_attempts_fence(
    attempt_fence: str | None, search_fence: str | None, complete: bool
) -> None:
    fence = Fence(search_fence, T0_MS) if search_fence is not None else None
    proof = SearchOutcome({}, complete=complete, fence=fence).proof_for(attempt_fence, "a")
    proves = complete and attempt_fence is not None and attempt_fence == search_fence
    assert (proof is not None) == proves
    if proof is not None:
        assert proof.fence_id == attempt_fence
