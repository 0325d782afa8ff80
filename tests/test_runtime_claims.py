"""Claim deadlines: a claim whose Admission has not come back in time is revoked; a claim
whose Admission won is the attempt's send gate and is never revoked by time."""

from __future__ import annotations

from pathlib import Path

from adapters.clock import SimulatedClock
from adapters.embedded import Nereus
from runtime.claims import Claim
from runtime.destination import PreparedPublish

T0_MS = 1_780_000_000_000


def _claim(nereus: Nereus, claim_id: str, deadline_ms: int) -> Claim:
    peek = nereus.peek("q", "k")
    assert peek.message_id is not None and peek.generation is not None
    prepared = PreparedPublish(
        "local", "q", None, b"x", (), peek.message_id, peek.generation, "t", T0_MS, None, False
    )
    return Claim(
        claim_id=claim_id,
        claim_sequence=1,
        message_id=peek.message_id,
        generation=peek.generation,
        version=peek.version or 1,
        attempt_id=f"{peek.message_id}.{peek.generation}.1",
        tenant="default",
        queue="q",
        owner="test",
        store_id="s",
        fencing_revision=1,
        deadline_ms=deadline_ms,
        action_at_ms=T0_MS,
        size_bytes=1,
        prepared=prepared,
        descriptor_hash=prepared.descriptor_hash(),
    )


def test_a_claim_past_its_deadline_is_revoked_and_its_permits_freed(tmp_path: Path) -> None:
    clock = SimulatedClock(T0_MS)
    with Nereus.open(str(tmp_path), clock=clock) as nereus:
        assert nereus.schedule("q", "k", b"x", delay_ms=60_000).ok
        runtime = nereus.runtime
        runtime.claims.add(_claim(nereus, "c-1", deadline_ms=T0_MS + 1_000))
        runtime.tick()
        assert len(runtime.claims) == 1  # not yet past its deadline
        clock.advance(2_000)
        runtime.tick()
        assert len(runtime.claims) == 0
        assert runtime.claims.permits.total == 0


def test_an_admitted_claim_is_never_revoked_by_time(tmp_path: Path) -> None:
    clock = SimulatedClock(T0_MS)
    with Nereus.open(str(tmp_path), clock=clock) as nereus:
        assert nereus.schedule("q", "k", b"x", delay_ms=60_000).ok
        runtime = nereus.runtime
        runtime.claims.add(_claim(nereus, "c-2", deadline_ms=T0_MS + 1_000))
        runtime._admitted_claims.add("c-2")  # its Publish passed the send gate
        clock.advance(5_000)
        runtime.tick()
        assert runtime.claims.get(nereus.peek("q", "k").message_id or "") is not None
