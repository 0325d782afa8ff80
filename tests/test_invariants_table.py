"""The invariant checks are a table keyed by invariant id: every documented invariant has a
check, every check keeps a documented invariant, and the report walks each id once."""

from __future__ import annotations

from nereus.kernel import invariants

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
