"""The local destination's proof of absence inside a running shard runtime, on real LMDB.

The rule (`specs/library.md`, "The local destination's proof of absence"): a writer proves
absent only attempts admitted before it took its directory's lock, and never while a send
of its own is half done, because what it admitted itself it may still send. Here the
runtime's clock is set apart from the host's on purpose: ahead (every Admission comes after
the lock: nothing is ever proven, and after a restart such an attempt is UNKNOWN, not looked
for in a loop), or behind (the runtime's own attempt looks admitted before the lock: only the
exclusion of searches and sends protects it). `tests/runtime/test_runtime_recovery.py` has the
ordinary restart, where the dead writer's attempts are proven absent.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from nereus.adapters.clock import SimulatedClock
from nereus.adapters.local.destination import LocalDestination
from nereus.kernel.codes import Code
from nereus.kernel.model import AttemptStatus, Status
from nereus.kernel.records import PublishOutcome, Unknown
from nereus.runtime.destination import Lookup, SearchOutcome, Send
from nereus.runtime.settle import Want
from tests.support.builders import records
from tests.support.runtime_harness import T0_MS, CrashBeforeWrite, Harness

ERROR_MS = 5


def _outcomes(h: Harness, attempt_id: str) -> list[PublishOutcome]:
    return [
        r for r in records(h.log()) if isinstance(r, PublishOutcome) and r.attempt_id == attempt_id
    ]


def test_a_runtime_never_proves_absent_an_attempt_admitted_since_its_destination_took_the_lock(
    tmp_path: Path,
) -> None:
    """The runtime's clock runs 10 s ahead of the host's wall clock, so every Admission comes
    after its destination took the directory's lock: it may be this writer's own, still to be
    sent. Its send dies before the write; a complete search by the same writer, and the
    runtime's settling of it, prove nothing. After a restart (the lock taken again, still
    before that Admission's time) it is UNKNOWN, never proven absent and never looked for in
    a loop."""
    clock = SimulatedClock(int(time.time() * 1000) + 10_000, error_ms=ERROR_MS)
    h = Harness(tmp_path, clock)
    assert h.schedule("k", b"once", delay_ms=0).code is Code.SCHEDULED
    h.clock.advance(ERROR_MS)
    h.crash_before_write = True
    with pytest.raises(CrashBeforeWrite):
        h.tick()
    (send,) = h.sends
    (attempt,) = h.attempts(h.message("k").message_id)
    assert attempt.status is AttemptStatus.PUBLISHING
    assert attempt.fence_id is not None and attempt.fence_id == h.destination.fence_id
    lookup = Lookup(send.attempt_id, "q", attempt.admitted_at_ms)
    outcome = h.destination.search([lookup], lambda: None).outcome()
    assert outcome.complete and outcome.fence is not None and outcome.found == {}
    assert outcome.proof_for(attempt.fence_id, send.attempt_id) is None
    recovery = h.runtime.recovery
    recovery.settler.want([Want(lookup, "attempt", attempt.fence_id)])
    assert recovery.settle(h.clock.now_ms()) == [], "a live attempt was settled by absence"
    h.crash()

    h.reopen()
    h.crash_before_write = False
    h.tick(3)
    (attempt,) = h.attempts(h.message("k").message_id)
    assert attempt.status is AttemptStatus.UNKNOWN
    assert [type(o.result) for o in _outcomes(h, send.attempt_id)] == [Unknown]
    assert h.message("k").status is Status.UNCERTAIN
    assert not h.runtime.settler.busy(), "an unprovable attempt is looked for again and again"
    assert len(h.sends) == 1
    h.close()


class HeldDestination(LocalDestination):
    """Holds every send inside `submit`, before its write, until `release` is set."""

    entered = threading.Event()
    release = threading.Event()
    held: list[Send] = []

    def _submit(self, sends: Sequence[Send], now_ms: int) -> None:
        type(self).held.extend(sends)
        type(self).entered.set()
        assert type(self).release.wait(30), "the test never released the send"
        super()._submit(sends, now_ms)


def test_a_search_during_the_runtimes_own_send_waits_for_it_and_finds_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The harness's clock is far behind the host's, so this runtime's own attempt looks
    admitted before its destination took the lock (as after a clock stepped back): only
    the exclusion of searches and sends keeps a search made while that attempt's send is
    half done from missing it and proving it absent. The search waits, then finds it."""
    monkeypatch.setattr(HeldDestination, "entered", threading.Event())
    monkeypatch.setattr(HeldDestination, "release", threading.Event())
    monkeypatch.setattr(HeldDestination, "held", [])
    h = Harness(tmp_path, SimulatedClock(T0_MS, error_ms=ERROR_MS), destination_cls=HeldDestination)
    assert h.schedule("k", b"once", delay_ms=0).code is Code.SCHEDULED
    h.clock.advance(ERROR_MS)
    ticker = threading.Thread(target=h.tick)
    ticker.start()
    outcomes: list[SearchOutcome] = []
    try:
        assert HeldDestination.entered.wait(30)
        (send,) = HeldDestination.held
        (attempt,) = h.attempts(h.message("k").message_id)
        fence = h.destination.fence
        assert fence is not None and attempt.admitted_at_ms < fence.fenced_at_ms
        lookup = Lookup(send.attempt_id, "q", attempt.admitted_at_ms)
        searcher = threading.Thread(
            target=lambda: outcomes.append(h.destination.search([lookup], lambda: None).outcome())
        )
        searcher.start()
        searcher.join(0.3)
        held = searcher.is_alive()
    finally:
        HeldDestination.release.set()
    ticker.join(30)
    searcher.join(30)
    (outcome,) = outcomes
    assert held, "the search read the index while the runtime's send was half done"
    assert send.attempt_id in outcome.found
    h.tick(3)
    assert h.message("k").status is Status.DELIVERED
    assert len(h.delivered()) == 1
    h.close()
