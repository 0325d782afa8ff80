"""The invariant checks are a table keyed by invariant id: every documented invariant has a
check, every check keeps a documented invariant, and the report walks each id once."""

from __future__ import annotations

import msgspec

from nereus import kernel as k
from nereus.kernel import invariants
from tests.support.builders import T0_MS, Shard, mid, schedule

IDS = [f"INV-{n:02d}" for n in range(1, 14)]


def test_every_invariant_has_a_check_and_every_check_an_invariant() -> None:
    checked = invariants.STATE_CHECKS.keys() | invariants.MESSAGE_CHECKS.keys()
    assert sorted(checked) == IDS
    assert sorted(invariants.INVARIANTS) == IDS


def test_the_report_order_names_each_invariant_once() -> None:
    flat = [inv for stage in invariants.ORDER for inv in stage]
    assert sorted(flat) == IDS
    # The order of the report before the checks became a table, kept so that a broken state
    # reads the same: a message's attempt checks, then the timeline, the counters and
    # payloads, usage, then a message's evidence, budget and timing, then dead letters.
    assert flat == [
        "INV-01", "INV-02", "INV-03", "INV-04", "INV-11", "INV-05", "INV-06", "INV-07",
        "INV-12", "INV-08", "INV-09", "INV-10", "INV-13",
    ]  # fmt: skip
    # Only a stage walked message by message may hold several ids.
    for stage in invariants.ORDER:
        if len(stage) > 1:
            assert all(inv in invariants.MESSAGE_CHECKS for inv in stage[1:])


def test_a_state_broken_in_several_ways_reports_message_by_message_where_checks_share_a_walk() -> (
    None
):
    shard = Shard()
    shard.apply(schedule("a"), at_ms=T0_MS)
    shard.apply(schedule("b", txn="txn-2"), at_ms=T0_MS)
    state = shard.state
    overlay = state.overlay
    for key in ("a", "b"):
        m = shard.message(key)
        assert m is not None
        broken = msgspec.structs.replace(
            m, open_attempts=1, attempts_spent=99, expire_at_ms=m.deliver_at_ms
        )
        overlay = overlay.set((k.Table.MESSAGES, m.message_id.encode()), broken)
    first, second = sorted([mid("a"), mid("b")])
    found = [tuple(v) for v in k.invariants.check(state.with_changes(state.meta, overlay))]
    assert found == [
        ("INV-11", f"message {first} open_attempts=1"),
        ("INV-11", f"message {second} open_attempts=1"),
        ("INV-09", f"message {first} spent 99"),
        ("INV-10", f"message {first} timing"),
        ("INV-09", f"message {second} spent 99"),
        ("INV-10", f"message {second} timing"),
    ]
