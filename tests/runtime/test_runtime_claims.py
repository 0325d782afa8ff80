"""The claim state machine (`runtime.claims`): ahead -> claimed -> admitted -> sending ->
released, moved by one module only.

A table of transitions, one row each; a property over random sequences of everything that
can happen to claims (the never-rules: an admitted or sending claim is never released by
time, nothing is sent that was not admitted and whose send gate is shut, permits never
leak); and the runtime's own use of it: a claim past its deadline is revoked, a claim whose
Admission won is never revoked by time.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nereus import kernel as k
from nereus.adapters.clock import SimulatedClock
from nereus.adapters.local.embedded import Nereus
from nereus.kernel.effects import Publish, RevokeClaim
from nereus.runtime.claim import Claim
from nereus.runtime.claims import ClaimTable, send_gate_open
from nereus.runtime.config import RuntimeConfig
from nereus.runtime.destination import PreparedPublish
from nereus.storage.store import ShardStore
from tests.support.builders import T0_MS, Shard, interval_at, schedule
from tests.support.strategies import props

KEYS = [f"k{i}" for i in range(4)]


def _messages() -> dict[str, k.Message]:
    shard = Shard()
    for key in KEYS:
        assert shard.apply(schedule(key, txn=key)).applied
    found = {key: shard.message(key) for key in KEYS}
    return {key: m for key, m in found.items() if m is not None}


MESSAGES = _messages()


def _prepared(m: k.Message, size: int = 1) -> PreparedPublish:
    return PreparedPublish(
        "local", m.queue, None, b"x" * size, (), m.message_id, m.generation, m.txn,
        m.deliver_at_ms, None, False,
    )  # fmt: skip


def _publish(claim: Claim, *, claim_id: str | None = None) -> Publish:
    return Publish(
        position=1,
        attempt_id=claim.attempt_id,
        message_id=claim.message_id,
        generation=claim.generation,
        claim_id=claim_id or claim.claim_id,
        descriptor_hash=claim.descriptor_hash,
        destination="local",
        action_at_ms=claim.action_at_ms,
        deliver_at_ms=claim.action_at_ms,
        visible_at_ms=claim.action_at_ms,
    )


def _table() -> ClaimTable:
    return ClaimTable(RuntimeConfig(owner="w", claim_deadline_ms=1_000), "store", 1)


# The transitions, one row each ------------------------------------------------------------

DUE = interval_at(MESSAGES["k0"].action_at_ms + 10)
EARLY = interval_at(MESSAGES["k0"].action_at_ms - 10)


def _to(table: ClaimTable, state: str) -> Claim:
    m = MESSAGES["k0"]
    if state == "ahead":
        return table.claim_ahead(m, _prepared(m), T0_MS)
    claim = table.claim(m, _prepared(m), T0_MS)
    if state in ("admitted", "sending"):
        assert table.admit(_publish(claim))
    if state == "sending":
        table.sending(table.ready_to_send(DUE))
    return claim


ROWS = [
    # (from, event, to)
    ("ahead", "propose", "claimed"),
    ("ahead", "deadline", None),
    ("ahead", "revoke", None),
    ("claimed", "admit", "admitted"),
    ("claimed", "deadline", None),
    ("claimed", "revoke", None),
    ("claimed", "publish_of_another_claim", "claimed"),
    ("admitted", "gate_shut", "admitted"),
    ("admitted", "gate_open", "sending"),
    ("admitted", "deadline", "admitted"),
    ("admitted", "revoke", None),
    ("sending", "deadline", "sending"),
    ("sending", "revoke_other_generation", "sending"),
    ("sending", "revoke", None),
]


@pytest.mark.parametrize(("start", "event", "end"), ROWS)
def test_claim_transition(start: str, event: str, end: str | None) -> None:
    table = _table()
    claim = _to(table, start)
    mid = claim.message_id
    if event == "propose":
        table.propose(claim)
    elif event == "admit":
        assert table.admit(_publish(claim))
    elif event == "publish_of_another_claim":
        assert not table.admit(_publish(claim, claim_id="w:99"))
    elif event == "gate_shut":
        assert table.ready_to_send(EARLY) == []
    elif event == "gate_open":
        (send,) = table.sending(table.ready_to_send(DUE))
        assert send.attempt_id == claim.attempt_id and send.prepared is claim.prepared
    elif event == "deadline":
        table.expire(claim.deadline_ms + 1)
    elif event == "revoke":
        table.revoke(RevokeClaim(mid, claim.generation, k.Code.OUTCOME_RECORDED, claim.claim_id))
    elif event == "revoke_other_generation":
        table.revoke(RevokeClaim(mid, claim.generation + 1, k.Code.CANCELED))
    assert table.state_of(mid) == end
    assert table.permits.total == len(table) == (0 if end is None else 1)
    assert (table.ahead() == [claim]) is (end == "ahead")
    assert table.waiting_to_send() == (1 if end == "admitted" else 0)


def test_the_send_gate_is_the_earliest_end_against_the_action_time() -> None:
    assert send_gate_open(k.TrustedInterval(100, 120), 100)
    assert not send_gate_open(k.TrustedInterval(99, 101), 100)


# Every sequence ---------------------------------------------------------------------------

OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["claim", "ahead", "propose", "admit", "stray", "send", "revoke", "expire", "drop"]
        ),
        st.sampled_from(KEYS),
        st.integers(-20, 20),  # the clock, ms from the action time
    ),
    max_size=40,
)


@props(200)
@given(OPS)
def test_claims_never_leak_permits_nor_send_what_was_not_admitted(
    ops: list[tuple[str, str, int]],
) -> None:
    table = _table()
    now_ms = T0_MS
    for op, key, offset_ms in ops:
        m = MESSAGES[key]
        mid = m.message_id
        state = table.state_of(mid)
        claim = table.get(mid)
        now_ms += abs(offset_ms) * 100
        if op in ("claim", "ahead") and claim is None:
            made = (table.claim if op == "claim" else table.claim_ahead)(m, _prepared(m), now_ms)
            assert table.state_of(mid) == ("claimed" if op == "claim" else "ahead")
            assert made.deadline_ms == now_ms + 1_000
        elif op == "propose" and state == "ahead":
            assert claim is not None
            table.propose(claim)
        elif op == "admit" and state == "claimed":
            assert claim is not None and table.admit(_publish(claim))
        elif op == "stray" and claim is not None:
            # A Publish naming a claim not held here (released, or another owner's).
            assert not table.admit(_publish(claim, claim_id="w:stray"))
            assert table.state_of(mid) == state
        elif op == "send":
            interval = interval_at(m.action_at_ms + offset_ms, error_ms=0)
            states = {c.message_id: table.state_of(c.message_id) for c in table}
            for send in table.sending(table.ready_to_send(interval)):
                sender = next(c for c in table if c.attempt_id == send.attempt_id)
                assert states[sender.message_id] == "admitted"
                assert send_gate_open(interval, sender.action_at_ms)
                assert table.state_of(sender.message_id) == "sending"
        elif op == "revoke" and claim is not None:
            table.revoke(RevokeClaim(mid, claim.generation, k.Code.CANCELED))
            assert mid not in table
        elif op == "expire":
            was_in = {c.message_id: (table.state_of(c.message_id), c) for c in table}
            for c in table.expire(now_ms):
                assert was_in[c.message_id][0] in ("ahead", "claimed")
                assert c.deadline_ms < now_ms
            for gone, (was, c) in was_in.items():
                if was in ("admitted", "sending"):
                    assert table.state_of(gone) == was, "an admitted claim released by time"
                elif c.deadline_ms < now_ms:
                    assert gone not in table
        elif op == "drop" and claim is not None:
            assert table.release(mid, "w:not-this-one") is None
            assert table.release(mid, claim.claim_id) is claim
        held = list(table)
        assert table.permits.total == len(held)
        assert table.permits.bytes == sum(c.size_bytes for c in held)
        assert [c for c in held if table.state_of(c.message_id) == "ahead"] == table.ahead()
        admitted = [c for c in held if table.state_of(c.message_id) == "admitted"]
        assert table.waiting_to_send() == len(admitted)
    table.release_all()
    assert (table.permits.total, table.permits.bytes, table.permits.per_lane) == (0, 0, {})


# In the runtime ---------------------------------------------------------------------------


def _held(nereus: Nereus) -> Claim:
    peek = nereus.peek("q", "k")
    with nereus.store.read() as view:
        m = view.get(k.Table.MESSAGES, (peek.message_id or "").encode())
    assert isinstance(m, k.Message)
    return nereus.runtime.claims.claim(m, _prepared(m), T0_MS)


def test_a_claim_past_its_deadline_is_revoked_and_its_permits_freed(tmp_path: Path) -> None:
    clock = SimulatedClock(T0_MS)
    config = RuntimeConfig(claim_deadline_ms=1_000)
    with Nereus.open(str(tmp_path), clock=clock, runtime_config=config) as nereus:
        assert nereus.schedule("q", "k", b"x", delay_ms=60_000).ok
        runtime = nereus.runtime
        _held(nereus)
        runtime.run_once()
        assert len(runtime.claims) == 1  # not yet past its deadline
        clock.advance(2_000)
        runtime.run_once()
        assert len(runtime.claims) == 0
        assert runtime.claims.permits.total == 0


def test_an_admitted_claim_is_never_revoked_by_time(tmp_path: Path) -> None:
    clock = SimulatedClock(T0_MS)
    config = RuntimeConfig(claim_deadline_ms=1_000)
    with Nereus.open(str(tmp_path), clock=clock, runtime_config=config) as nereus:
        assert nereus.schedule("q", "k", b"x", delay_ms=60_000).ok
        runtime = nereus.runtime
        claim = _held(nereus)
        assert runtime.claims.admit(_publish(claim))  # its Publish passed the send gate
        clock.advance(5_000)
        runtime.run_once()
        assert runtime.claims.get(claim.message_id) is claim
        assert runtime.claims.state_of(claim.message_id) in ("admitted", "sending")


# Persisting, through the store's claims port ----------------------------------------------


def test_claims_persist_through_the_store_port_and_a_restart_drops_them(tmp_path: Path) -> None:
    """The claim rows a commit writes are the claims held at that commit; a table started
    on the same store continues the sequence (attempt ids never repeat) and its first
    commit deletes the rows its predecessor left."""
    with ShardStore.open(str(tmp_path / "shard")) as store:
        table = _table()
        assert table.load(*store.read_claims()) == 0
        held = [table.claim(MESSAGES[key], _prepared(MESSAGES[key]), T0_MS) for key in KEYS[:3]]
        store.commit([], T0_MS, table.flush)
        assert store.read_claims() == (3, 3)
        table.release(held[0].message_id)  # written by the commit before: deleted by the next
        store.commit([], T0_MS, table.flush)
        assert store.read_claims() == (3, 2)

        successor = _table()
        assert successor.load(*store.read_claims()) == 2  # two stale claims
        again = successor.claim(MESSAGES["k3"], _prepared(MESSAGES["k3"]), T0_MS)
        assert again.claim_sequence == 4
        store.commit([], T0_MS, successor.flush)
        assert store.read_claims() == (4, 1)  # the stale two gone, the new one kept
