"""The console's reads (`service.inspect`) over a real embedded store, from their rules: a
tenant never reads another tenant's timer, story, attempt, obligation or queue; a story holds
the commands and the fire of its timer in log order; every list stops at its page.
tests/console/test_console_http.py checks the same over HTTP and the login."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nereus import Nereus
from nereus.kernel.keys import message_id
from nereus.service.inspect import Inspection

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
