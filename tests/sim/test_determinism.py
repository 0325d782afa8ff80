"""Replay properties: the shard state is a pure, deterministic fold over the log.

The log under test comes from `tests.support.strategies.Driver`, which builds each record from the
state folded so far; here those entries are folded again, from scratch, in pieces, across
rebases onto a materialized base, and after a wire round trip, and every way must agree.
"""

from __future__ import annotations

from collections.abc import Iterable

from hypothesis import given
from hypothesis import strategies as st

from nereus import kernel as k
from nereus.kernel.effects import Effect
from nereus.kernel.model import TABLES, Table, Value
from nereus.kernel.records import entry_from_json, entry_to_json
from tests.support.strategies import CONFIG, Action, action_lists, drive, props

Effects = list[tuple[Effect, ...]]


def fold(entries: Iterable[k.LogEntry], state: k.State | None = None) -> tuple[k.State, Effects]:
    return k.fold(state or k.State.initial(CONFIG), entries)


@props(100)
@given(action_lists())
def test_folding_twice_gives_the_same_state_and_effects(actions: list[Action]) -> None:
    driver = drive(actions)
    first, first_effects = fold(driver.entries)
    second, second_effects = fold(driver.entries)
    assert k.state_digest(first) == k.state_digest(second) == k.state_digest(driver.state)
    assert first.meta == second.meta
    assert first_effects == second_effects == [s.effects for s in driver.steps]


@props(100)
@given(action_lists(), st.data())
def test_prefix_then_rest_equals_the_whole(actions: list[Action], data: st.DataObject) -> None:
    entries = drive(actions).entries
    cut = data.draw(st.integers(0, len(entries)), label="cut")
    whole, whole_effects = fold(entries)
    prefix, prefix_effects = fold(entries[:cut])
    prefix_digest = k.state_digest(prefix)
    rest, rest_effects = fold(entries[cut:], prefix)
    assert k.state_digest(rest) == k.state_digest(whole)
    assert prefix_effects + rest_effects == whole_effects
    # Folding on from a state never changes that state: the same prefix folds the same way
    # again, which is what lets a batch be retried after a failed commit.
    assert k.state_digest(prefix) == prefix_digest
    again, again_effects = fold(entries[cut:], prefix)
    assert k.state_digest(again) == k.state_digest(whole)
    assert again_effects == rest_effects


def materialize(
    tables: dict[Table, dict[bytes, Value]], state: k.State
) -> dict[Table, dict[bytes, Value]]:
    """What storage does at a commit: a new base with this batch's changes applied. The old
    base is left untouched (a State built on it may still be in use)."""
    merged = {table: dict(rows) for table, rows in tables.items()}
    for table, key, value in state.changes():
        rows = merged.setdefault(table, {})
        if value is None:
            rows.pop(key, None)
        else:
            rows[key] = value
    return merged


@props(100)
@given(action_lists(), st.data())
def test_rebasing_at_any_batch_boundary_changes_nothing(
    actions: list[Action], data: st.DataObject
) -> None:
    entries = drive(actions).entries
    cuts = data.draw(st.sets(st.integers(0, len(entries))), label="batch boundaries")
    plain = k.State.initial(CONFIG)
    batched = k.State.initial(CONFIG)
    tables: dict[Table, dict[bytes, Value]] = {}
    for i, entry in enumerate(entries):
        if i in cuts:
            tables = materialize(tables, batched)
            batched = batched.rebase(k.MappingBase(tables))
            assert len(batched.overlay) == 0
            assert k.state_digest(batched) == k.state_digest(plain)
        plain, plain_effects = k.reduce(plain, entry)
        batched, batched_effects = k.reduce(batched, entry)
        assert batched_effects == plain_effects
        assert k.state_digest(batched) == k.state_digest(plain)
    tables = materialize(tables, batched)
    final = batched.rebase(k.MappingBase(tables))
    assert k.state_digest(final) == k.state_digest(plain)
    k.assert_invariants(final)


@props(100)
@given(action_lists())
def test_invariants_hold_after_every_step(actions: list[Action]) -> None:
    """The invariants hold after every step, and the digest moves exactly when the state
    does (so equal digests above mean equal states, not a digest that ignores something)."""
    entries = drive(actions, check_invariants=False).entries
    state = k.State.initial(CONFIG)
    k.assert_invariants(state)
    for entry in entries:
        before = state
        state, effects = k.reduce(state, entry)
        assert isinstance(effects[0], k.EntryOutcome)
        assert effects[0].position == entry.position
        k.assert_invariants(state)
        changed = before.meta != state.meta or any(
            list(before.items(table)) != list(state.items(table)) for table in TABLES
        )
        assert (k.state_digest(before) != k.state_digest(state)) == changed


@props(100)
@given(action_lists())
def test_replay_from_the_wire_decides_the_same(actions: list[Action]) -> None:
    """The log is stored encoded; replaying the decoded entries must reproduce every
    decision, so nothing a decision depends on may be lost in encoding."""
    driver = drive(actions)
    msgpack = [k.decode_entry(k.encode_entry(e)) for e in driver.entries]
    json = [entry_from_json(entry_to_json(e)) for e in driver.entries]
    assert msgpack == driver.entries == json
    for replayed in (msgpack, json):
        state, effects = fold(replayed)
        assert k.state_digest(state) == k.state_digest(driver.state)
        assert effects == [s.effects for s in driver.steps]
