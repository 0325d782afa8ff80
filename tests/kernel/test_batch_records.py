"""Batch records (PUBLISH_ADMISSIONS_V1, PUBLISH_OUTCOMES_V1, COMMANDS_V1) mean exactly
their items.

A batch at one position must decide every item as the single records it stands for would be
decided, one after another at the same persistence time: the same codes, the same effects,
the same rows (apart from the positions written into them). The runtime's grouping of a
tick's records must answer each command with its own item's outcome."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
from hypothesis import event, given
from hypothesis import strategies as st

from nereus import kernel as k
from nereus.adapters.clock import SimulatedClock
from nereus.kernel.codes import POSITION_CODES
from nereus.kernel.effects import Effect, EntryOutcome
from nereus.kernel.keys import attempt_prefix
from nereus.kernel.model import TABLES
from nereus.runtime.batching import MAX_BATCH_ITEMS, batch_runs
from nereus.service.arguments import schedule_record
from tests.support.builders import published, unknown
from tests.support.runtime_harness import T0_MS, Harness
from tests.support.strategies import Action, action_lists, drive, props

OWNER = "node-a"


def _without_positions(value: Any) -> Any:
    """A row or effect as builtins, minus the fields that name a log position."""
    if isinstance(value, dict):
        return {
            key: _without_positions(v)
            for key, v in value.items()
            if "position" not in key and key != "index"
        }
    if isinstance(value, list):
        return [_without_positions(v) for v in value]
    return value


def _rows(state: k.State) -> dict[str, Any]:
    return {
        table.value: [
            (key, _without_positions(msgspec.to_builtins(row))) for key, row in state.items(table)
        ]
        for table in TABLES
    }


def _decided(effects: tuple[Effect, ...]) -> list[Any]:
    return [_without_positions(msgspec.to_builtins(e)) for e in effects]


@st.composite
def admissions(draw: st.DrawFn, state: k.State, now_ms: int) -> tuple[int, list[k.Record]]:
    """Admissions of messages of `state` (mostly ones with work, so that most can win), at a
    persistence time and on a clock reading from just after their action times."""
    messages = [m for _, m in state.items(k.Table.MESSAGES) if isinstance(m, k.Message)]
    if not messages:
        return now_ms, []
    armed = [m for m in messages if m.has_work] or messages
    picked = draw(st.lists(st.sampled_from(armed), min_size=1, max_size=6))
    if draw(st.booleans()):
        picked.append(draw(st.sampled_from(messages)))
    bp_ms = max([now_ms] + [m.action_at_ms for m in picked]) + draw(st.sampled_from((0, 1, 50)))
    error_ms = draw(st.sampled_from((0, 0, 5, 2_000)))
    interval = k.TrustedInterval(bp_ms - error_ms, bp_ms + error_ms)
    found: list[k.Record] = []
    for n, m in enumerate(picked):
        stale = draw(st.integers(0, 5)) == 0
        found.append(
            k.PublishAdmission(
                m.message_id,
                m.generation,
                m.version - 1 if stale else m.version,
                f"{attempt_prefix(m.message_id, m.generation)}b{n}",
                f"claim-b{n}",
                OWNER,
                "d" * 16,
                m.capability,
                interval,
                k.Capacity(True, 1, m.payload_size),
                None,
            )
        )
    return bp_ms, found


@st.composite
def outcomes(draw: st.DrawFn, state: k.State, now_ms: int) -> tuple[int, list[k.Record]]:
    attempts = [a for _, a in state.items(k.Table.ATTEMPTS) if isinstance(a, k.Attempt)]
    bp_ms = now_ms + draw(st.sampled_from((0, 1, 60_000)))
    if not attempts:
        return bp_ms, []
    picked = draw(st.lists(st.sampled_from(attempts), min_size=1, max_size=6))
    results: st.SearchStrategy[k.Published | k.NotPublished | k.Unknown] = st.sampled_from(
        (published(7), unknown(), k.NotPublished("retriable", "down"))
    )
    return bp_ms, [
        k.PublishOutcome(a.attempt_id, a.message_id, a.generation, draw(results)) for a in picked
    ]


IDENTS = [("acme", "q", f"k{i}") for i in range(3)]
DIGEST = "a" * 64


@st.composite
def commands(draw: st.DrawFn, state: k.State, now_ms: int) -> tuple[int, list[k.Record]]:
    """Client commands on the state's timers and a few others, several often on one timer
    (a later item must see what an earlier one did), with retries and stale versions."""
    known = [
        (m.tenant, m.queue, m.timer_key)
        for _, m in state.items(k.Table.MESSAGES)
        if isinstance(m, k.Message)
    ]
    idents = st.sampled_from(known + IDENTS)
    bp_ms = now_ms + draw(st.sampled_from((0, 1, 60_000)))
    found: list[k.Record] = []
    for _ in range(draw(st.integers(1, 6))):
        ident = draw(idents)
        txn = draw(st.sampled_from(("t1", "t2", "t3")))
        version = draw(st.sampled_from((None, None, 0, 1, 2)))
        kind = draw(st.sampled_from(("schedule", "schedule", "reschedule", "cancel")))
        if kind == "schedule":
            delay = draw(st.sampled_from((0, 1_000, 90_000)))
            size = draw(st.sampled_from((3, -1)))  # -1: refused, the batch goes on
            found.append(
                k.Schedule(*ident, txn, DIGEST, size, delay_ms=delay, expected_version=version)
            )
        elif kind == "reschedule":
            delay = draw(st.sampled_from((0, 5_000)))
            found.append(k.Reschedule(*ident, txn, delay_ms=delay, expected_version=version))
        else:
            found.append(k.Cancel(*ident, expected_version=version, txn=txn))
    return bp_ms, found


@props(150)
@given(action_lists(), st.data())
def test_a_batch_decides_each_item_as_the_single_records_would(
    actions: list[Action], data: st.DataObject
) -> None:
    d = drive(actions)
    kind = data.draw(st.sampled_from(("admissions", "outcomes", "commands")))
    drawn = {"admissions": admissions, "outcomes": outcomes, "commands": commands}[kind]
    bp_ms, items = data.draw(drawn(d.state, d.now_ms))
    if not items:
        return
    start = d.state.meta.position + 1

    single = d.state
    single_effects: list[Effect] = []
    for n, item in enumerate(items):
        single, effects = k.reduce(single, k.LogEntry(start + n, bp_ms, item))
        single_effects.extend(effects)
    batch = k.batched(items)
    together, effects = k.reduce(d.state, k.LogEntry(start, bp_ms, batch))
    k.assert_invariants(together)

    assert _decided(effects) == _decided(tuple(single_effects))
    outcomes_seen = [e for e in effects if isinstance(e, EntryOutcome)]
    event(f"{kind}: {sorted({str(o.code) for o in outcomes_seen})}")
    assert [o.index for o in outcomes_seen] == list(range(len(items)))
    assert {o.position for o in outcomes_seen} == {start}
    assert [r for r, _, _ in k.split(batch, effects)] == items
    assert _rows(together) == _rows(single)
    assert together.meta.counters == single.meta.counters
    assert together.meta.position == start


def test_an_empty_batch_is_consumed_and_changes_nothing() -> None:
    d = drive([])
    for record in (k.PublishOutcomes(()), k.PublishAdmissions(OWNER, k.TrustedInterval(0, 1), ())):
        before = d.state
        step = d.append(record)
        assert step.outcome.code is k.Code.UNCHANGED and step.outcome.applied
        assert _rows(step.after) == _rows(before)
        assert k.split(record, step.effects) == [(record, step.outcome, ())]


def test_a_batch_refused_by_its_position_is_one_outcome_for_the_whole() -> None:
    d = drive([])
    batch = k.PublishOutcomes(tuple(k.OutcomeItem(f"a{i}", "m", 1, unknown()) for i in range(3)))
    state, effects = k.reduce(d.state, k.LogEntry(5, 0, batch))
    assert state is d.state
    (outcome,) = effects
    assert isinstance(outcome, EntryOutcome) and outcome.code in POSITION_CODES
    assert outcome.record_type == "PUBLISH_OUTCOMES_V1"
    assert k.split(batch, effects) == [(batch, outcome, ())]
    # Each item it stands for is answered with that one verdict.
    assert k.outcomes_of(batch, effects) == (outcome,) * 3


def test_batched_refuses_mixed_kinds_and_differing_clock_readings() -> None:
    a = k.PublishAdmission(
        "m",
        1,
        1,
        "m.1.1",
        "c",
        OWNER,
        "d",
        k.Capability(),
        k.TrustedInterval(0, 1),
        k.Capacity(True),
    )
    b = msgspec.structs.replace(a, interval=k.TrustedInterval(0, 2))
    o = k.PublishOutcome("m.1.1", "m", 1, unknown())
    refused: list[list[k.Record]] = [[a, o], [a, b], [k.Cancel("t", "q", "k"), o]]
    for records in refused:
        try:
            k.batched(records)
        except ValueError:
            continue
        raise AssertionError(f"batched {records}")
    assert k.batched([a]) is a


def _admission(n: int, interval: k.TrustedInterval) -> k.PublishAdmission:
    return k.PublishAdmission(
        f"m{n}", 1, 1, f"m{n}.1.1", f"c{n}", OWNER, "d", k.Capability(), interval, k.Capacity(True)
    )


def test_runs_are_batched_and_commands_keep_their_own_entries() -> None:
    one, two = k.TrustedInterval(0, 1), k.TrustedInterval(0, 2)
    cancel = k.Cancel("t", "q", "k")
    outcome = k.PublishOutcome("m0.1.1", "m0", 1, unknown())
    items: list[tuple[k.Record, bytes | None]] = [
        (cancel, None),
        (outcome, None),
        (outcome, None),
        (_admission(0, one), None),
        (_admission(1, one), None),
        (_admission(2, two), None),
        (cancel, None),
        (_admission(3, one), None),
    ]
    out, where = batch_runs(items)
    kinds = [type(r).__name__ for r, _ in out]
    assert kinds == [
        "Cancel",
        "PublishOutcomes",
        "PublishAdmissions",
        "PublishAdmission",
        "Cancel",
        "PublishAdmission",
    ]
    assert where == [(0, 0), (1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (4, 0), (5, 0)]
    flat = [m for r, _ in out for m in k.members(r)]
    assert flat == [r for r, _ in items]


def test_a_long_run_is_cut_into_records_of_at_most_the_bound() -> None:
    interval = k.TrustedInterval(0, 1)
    items: list[tuple[k.Record, bytes | None]] = [
        (_admission(n, interval), None) for n in range(2 * MAX_BATCH_ITEMS + 3)
    ]
    out, where = batch_runs(items)
    assert [len(k.members(r)) for r, _ in out] == [MAX_BATCH_ITEMS, MAX_BATCH_ITEMS, 3]
    assert where[MAX_BATCH_ITEMS - 1] == (0, MAX_BATCH_ITEMS - 1)
    assert where[MAX_BATCH_ITEMS] == (1, 0)


def test_a_submission_of_commands_is_one_record_whose_items_answer_each() -> None:
    sched = [schedule_record("q", f"k{n}", b"p%d" % n, delay_ms=1_000) for n in range(3)]
    gate = (k.LaneGate("acme", "q", "CLOSED"), None)
    items = [*sched, (k.Cancel("acme", "q", "k9"), None), gate, sched[0]]
    units = [(0, 4), (4, 1), (5, 1)]
    out, where = batch_runs(items, units)
    assert [type(r).__name__ for r, _ in out] == ["CommandBatch", "LaneGate", "Schedule"]
    batch, payloads = out[0]
    assert isinstance(batch, k.CommandBatch) and list(k.members(batch)) == [r for r, _ in items[:4]]
    assert payloads == (b"p0", b"p1", b"p2", None)
    assert where == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (2, 0)]
    # A submission holding anything but client commands stays as it was sent.
    mixed, mixed_where = batch_runs([sched[1], gate], [(0, 2)])
    assert [r for r, _ in mixed] == [sched[1][0], gate[0]]
    assert mixed_where == [(0, 0), (1, 0)]


def test_a_long_submission_is_cut_into_records_of_at_most_the_bound() -> None:
    items = [(k.Cancel("acme", "q", f"k{n}"), None) for n in range(MAX_BATCH_ITEMS + 2)]
    out, where = batch_runs(items, [(0, len(items))])
    assert [len(k.members(r)) for r, _ in out] == [MAX_BATCH_ITEMS, 2]
    assert where[-1] == (1, 1) and all(p is None for _, p in out)


def test_the_runtime_logs_a_client_batch_as_one_record_and_answers_each_command(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path, SimulatedClock(T0_MS, error_ms=5))
    try:
        items = [
            schedule_record("q", "a", b"first", delay_ms=0),
            schedule_record("q", "b", b"second", delay_ms=60_000),
            schedule_record("q", "a", b"again", delay_ms=0, txn="other"),
            (k.Cancel("default", "q", "nobody"), None),
            (k.Cancel("default", "q", "b"), None),
        ]
        answers = h.run(items)
        (entry,) = [e for e in h.log() if isinstance(e.record, k.CommandBatch)]
        assert [(o.position, o.index) for o in answers] == [(entry.position, n) for n in range(5)]
        assert [o.code for o in answers] == [
            k.Code.SCHEDULED,
            k.Code.SCHEDULED,
            k.Code.RESCHEDULED,  # the upsert of "a", seeing the first item's generation
            k.Code.ABSENT,
            k.Code.CANCELED,
        ]
        assert [o.record_type for o in answers][3:] == ["CANCEL_V1", "CANCEL_V1"]
        # Each schedule's bytes were stored beside the one record; the live one is sent.
        h.clock.advance(1_000)
        h.tick(3)
        (delivered,) = h.delivered()
        assert delivered.payload == b"again" and not h.problems
    finally:
        h.close()
