"""The console's reads (`service.inspect`) over a real embedded store, from their rules: a
tenant never reads another tenant's timer, story, attempt, obligation or queue; a story holds
the commands and the fire of its timer in log order; every list stops at its page.
tests/console/test_console_http.py checks the same over HTTP and the login."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nereus import Nereus
from nereus.adapters.clock import SimulatedClock
from nereus.adapters.local.destination import LocalDestination
from nereus.adapters.tenant_topics import local_topic
from nereus.kernel.codes import Code
from nereus.kernel.config import KernelConfig
from nereus.kernel.keys import message_id
from nereus.kernel.records import Capability, Schedule
from nereus.runtime.destination import Send
from nereus.service.inspect import Inspection
from nereus.service.inspect_store import StoreInspection, opened
from tests.support.runtime_harness import T0_MS, CrashBeforeWrite, Harness

TENANTS = ("acme", "globex")
QUEUES = ("q1", "q2", "q3")


@pytest.fixture(scope="module")
def fired(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Nereus, Inspection]]:
    """Both tenants with the same queue and key names: pending timers, and one fired each."""
    n = Nereus.open(str(tmp_path_factory.mktemp("console") / "data"), assume_clock_error_ms=2)
    n.start()
    for tenant in TENANTS:
        for q in QUEUES:
            for i in range(5):
                n.schedule(q, f"k{i}", b"x", delay_ms=3_600_000, tenant=tenant)
        n.schedule("q1", "now", b"y", delay_ms=1, tenant=tenant)
    deadline = time.monotonic() + 30
    while any(n.peek("q1", "now", tenant=t).status != "DELIVERED" for t in TENANTS):
        assert time.monotonic() < deadline, "the two timers were not delivered"
        time.sleep(0.05)
    inspection = n.service.inspection()
    yield n, inspection
    n.close()


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    viewer=st.sampled_from(TENANTS),
    queue=st.sampled_from((*QUEUES,)),
    key=st.sampled_from(("k0", "k3", "now", "never-scheduled")),
)
def test_a_tenant_never_reads_another_tenants_story(
    fired: tuple[Nereus, Inspection], viewer: str, queue: str, key: str
) -> None:
    _, inspection = fired
    other = next(t for t in TENANTS if t != viewer)
    theirs = message_id(other, queue, key)
    assert inspection.story(viewer, theirs) is None
    mine = inspection.story(viewer, message_id(viewer, queue, key))
    if key == "never-scheduled" or (key == "now" and queue != "q1"):
        assert mine is None
    else:
        assert mine is not None and mine.tenant == viewer
        assert (mine.queue, mine.timer_key) == (queue, key)


def test_an_attempt_id_of_another_tenant_names_no_message(
    fired: tuple[Nereus, Inspection],
) -> None:
    _, inspection = fired
    for viewer in TENANTS:
        other = next(t for t in TENANTS if t != viewer)
        theirs = inspection.story(other, message_id(other, "q1", "now"))
        assert theirs is not None and theirs.attempts
        attempt = theirs.attempts[0].attempt_id
        assert inspection.message_of_attempt(viewer, attempt) is None
        assert inspection.message_of_attempt(other, attempt) == message_id(other, "q1", "now")


def test_queues_and_deliveries_are_the_viewers_own(fired: tuple[Nereus, Inspection]) -> None:
    _, inspection = fired
    for viewer in TENANTS:
        rows, more = inspection.queues(viewer, 10)
        assert [r.queue for r in rows] == list(QUEUES) and not more
        assert [r.live for r in rows] == [5, 5, 5]
        (delivery,) = inspection.recent_deliveries(viewer, None, 10)
        assert delivery.message_id == message_id(viewer, "q1", "now")
    rows, more = inspection.queues("nobody", 10)
    assert rows == [] and not more
    rows, more = inspection.queues("acme", 2)
    assert [r.queue for r in rows] == ["q1", "q2"] and more


def test_a_fired_timers_story_is_its_command_admission_and_outcome_in_order(
    fired: tuple[Nereus, Inspection],
) -> None:
    _, inspection = fired
    story = inspection.story("acme", message_id("acme", "q1", "now"))
    assert story is not None and story.status == "DELIVERED"
    kinds = [(e.kind, e.verdict) for e in story.events]
    assert kinds == [
        ("command", "scheduled"),
        ("admission", "PUBLISHING"),
        ("outcome", "PUBLISHED"),
    ]
    positions = [e.position for e in story.events]
    assert positions == sorted(positions)
    admission = story.events[1]
    assert admission.persisted_at_ms is not None and story.deliver_at_ms is not None
    assert admission.persisted_at_ms >= story.deliver_at_ms  # never early, as shown
    (attempt,) = story.attempts
    evidence = dict(attempt.evidence)
    assert attempt.status == "PUBLISHED" and int(str(evidence["offset"])) >= 0


def test_the_shards_figures_count_what_the_store_holds(fired: tuple[Nereus, Inspection]) -> None:
    n, inspection = fired
    (shard,) = inspection.shards()
    assert shard.state == "active" and shard.fold_lag == 0
    assert shard.live_timers == n.store.meta.counters.scheduled
    assert shard.delivered == 2 and shard.open_obligations == 0
    assert shard.applied_position == n.store.meta.position


def test_a_txn_finds_its_tenants_timer_only(fired: tuple[Nereus, Inspection]) -> None:
    n, inspection = fired
    for tenant in TENANTS:
        n.schedule(
            "q2", f"by-txn-{tenant}", b"z", delay_ms=3_600_000, txn="order-42", tenant=tenant
        )
    for viewer in TENANTS:
        found = inspection.message_of_txn(viewer, "order-42")
        assert found == message_id(viewer, "q2", f"by-txn-{viewer}")
    assert inspection.message_of_txn("acme", "order-43") is None


class HoldingDestination(LocalDestination):
    """Never answers the sends of some topics: their attempts stay open obligations."""

    def __init__(self, path: str, held: set[str]) -> None:
        super().__init__(path)
        self.held = held

    def _submit(self, sends: Sequence[Send], now_ms: int) -> None:
        super()._submit([s for s in sends if s.prepared.topic not in self.held], now_ms)


def test_obligations_are_the_oldest_admissions_first_whatever_their_attempt_ids(
    tmp_path: Path,
) -> None:
    """Three waves, a second apart: globex's, then acme's twice. acme's page of one wave's
    size is exactly its first wave (attempt ids are hashes: their order is not the age)."""
    wave = 30
    held = {local_topic("acme", "held"), local_topic("globex", "held")}
    destination = HoldingDestination(str(tmp_path / "destination"), held)
    n = Nereus.open(str(tmp_path / "data"), destination=destination, assume_clock_error_ms=2)
    n.start()
    try:
        waves = [("globex", "g"), ("acme", "a"), ("acme", "b")]
        inspection = n.service.inspection()
        for i, (tenant, prefix) in enumerate(waves):
            for k in range(wave):
                n.schedule("held", f"{prefix}{k}", b"x", delay_ms=1, tenant=tenant)
            count = (i + 1) * wave
            _until(lambda: len(inspection.obligations(None, 1_000)[0]) == count)  # noqa: B023
            time.sleep(1.0)
        rows, more = inspection.obligations("acme", wave)
        assert more
        assert {r.timer_key for r in rows} == {f"a{k}" for k in range(wave)}
        assert [r.admitted_at_ms for r in rows] == sorted(r.admitted_at_ms for r in rows)
        first, _ = inspection.obligations("acme", 5)
        assert {r.timer_key for r in first} <= {f"a{k}" for k in range(wave)}
        everyone, more = inspection.obligations(None, wave)
        assert {r.timer_key for r in everyone} == {f"g{k}" for k in range(wave)}
    finally:
        n.close()


def _until(done: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _doomed(tenant: str, queue: str, key: str) -> tuple[Schedule, bytes]:
    """A schedule whose capability the local destination does not offer: every claim fails
    before a send, so its budget is spent and it is dead-lettered."""
    payload = b"p"
    return (
        Schedule(
            tenant,
            queue,
            key,
            f"t-{key}",
            hashlib.sha256(payload).hexdigest(),
            len(payload),
            delay_ms=0,
            capability=Capability("delayed_handoff"),
        ),
        payload,
    )


def test_dead_letters_are_listed_owed_then_written_and_only_to_their_tenant(
    tmp_path: Path,
) -> None:
    kernel = KernelConfig()
    h = Harness(tmp_path, SimulatedClock(T0_MS, error_ms=5))
    try:
        items = [_doomed("acme", "q", "k"), _doomed("acme", "r", "k"), _doomed("globex", "q", "k")]
        assert all(o.code is Code.SCHEDULED for o in h.run(items))
        inspection = StoreInspection(lambda: {0: opened(h.store, h.runtime)})
        h.crash_before_write = True  # the dead-letter commit lands; the copy is not written
        for _ in range(kernel.max_attempts + 1):
            h.clock.advance(kernel.backoff_max_ms)
            try:
                h.tick(2)
            except CrashBeforeWrite:
                break
        owed = inspection.dead_letters("acme", None, 10)
        assert {(d.queue, d.timer_key, d.copy) for d in owed} == {
            ("q", "k", None),
            ("r", "k", None),
        }
        assert all(d.attempts_spent == kernel.max_attempts for d in owed)
        assert [d.queue for d in inspection.dead_letters("globex", None, 10)] == ["q"]
        assert [d.queue for d in inspection.dead_letters("acme", "r", 10)] == ["r"]
        assert inspection.dead_letters("initech", None, 10) == []
        h.crash()
        h.crash_before_write = False
        h.reopen()
        inspection = StoreInspection(lambda: {0: opened(h.store, h.runtime)})
        for _ in range(5):
            h.tick()
        written = inspection.dead_letters("acme", "q", 10)
        assert len(written) == 1
        evidence = h.message("k", "q", tenant="acme").dead_letter_evidence
        assert evidence is not None and written[0].position is not None
        assert written[0].copy == f"{evidence.destination}[{evidence.partition}]@{evidence.offset}"
        assert evidence.destination.endswith("q.dlq")
        assert written[0].last_error == "capability_mismatch"
    finally:
        h.close()
