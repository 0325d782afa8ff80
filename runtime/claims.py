"""Claims: the one place that says what state each local claim is in, and the send gate.

Theory of operation: a claim (`runtime.claim.Claim`) reserves one generation for this worker
and holds its permits. It moves through one small state machine, and only this module moves
it:

    ahead ──propose──▶ claimed ──admit──▶ admitted ──sending──▶ sending
      │                  │                   │                     │
      └──────────────────┴─── release ───────┴─────────────────────┘──▶ (released)

* **ahead** — made before its action time (`claim_ahead_ms`), its publish prepared; no
  Admission yet. Discovery proposes its Admission once the clock proves the action time.
* **claimed** — its Admission is proposed (made at once for work already due).
* **admitted** — the Admission won: the fold's `Publish` named this claim. The attempt now
  waits only for the send gate (`send_gate_open`) and for the log's proof of ownership.
* **sending** — handed to the destination; its outcome is on its way.
* **released** — gone, with its permits: by a kernel `RevokeClaim` (a command took the work
  away, the Admission lost, or the attempt's outcome is recorded), by its deadline while
  ahead or claimed (an admitted claim is the attempt's send gate and is never released by
  time), by discovery when the row it was made from changed, or when the runtime lets go of
  the shard. A `Publish` for a claim not held here is never sent.

Claims are persisted in the shard store's `claims` table, through the store's port
(`storage.claims.ClaimRows`), no later than the transaction of the Admission they lead to (a
claim made ahead may be written by an earlier commit), with a claim sequence that never
repeats (attempt ids are built from it), so a restarted process knows which claims died
with its predecessor. Nothing here is a fact of the log: a claim may
be released at any time, and the log's verdict on the Admission decides what happened.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final, Literal

from nereus.kernel.effects import Publish, RevokeClaim
from nereus.kernel.keys import attempt_prefix
from nereus.kernel.model import Message
from nereus.kernel.timing import TrustedInterval
from nereus.runtime.claim import Claim, PersistedClaim
from nereus.runtime.config import RuntimeConfig
from nereus.runtime.destination import PreparedPublish, Send
from nereus.storage.claims import ClaimRows

ClaimState = Literal["ahead", "claimed", "admitted", "sending"]
AHEAD: Final = "ahead"
CLAIMED: Final = "claimed"
ADMITTED: Final = "admitted"
SENDING: Final = "sending"


def send_gate_open(interval: TrustedInterval, action_at_ms: int) -> bool:
    """The send gate (promise P1 at the send): an admitted attempt is handed to the
    destination only while the trusted clock proves that its action time has come. A
    reading less certain than the one that admitted it keeps it waiting: late, never
    early."""
    return interval.earliest_ms >= action_at_ms


class Permits:
    """Bounded counters; a claim is made only if all of its permits are free."""

    def __init__(self, config: RuntimeConfig) -> None:
        self.config = config
        self.total = 0
        self.bytes = 0
        self.per_lane: dict[tuple[str, str], int] = {}

    def available(self, lane: tuple[str, str], size: int) -> bool:
        c = self.config
        return (
            self.total < c.max_inflight_claims
            and self.per_lane.get(lane, 0) < c.max_inflight_per_lane
            and (self.bytes + size <= c.max_inflight_bytes or self.total == 0)
        )

    def acquire(self, lane: tuple[str, str], size: int) -> None:
        self.total += 1
        self.bytes += size
        self.per_lane[lane] = self.per_lane.get(lane, 0) + 1

    def release(self, lane: tuple[str, str], size: int) -> None:
        self.total -= 1
        self.bytes -= size
        left = self.per_lane[lane] - 1
        if left:
            self.per_lane[lane] = left
        else:
            del self.per_lane[lane]


class _Held:
    """A claim and where it is in the state machine (and, once admitted, its Publish)."""

    def __init__(self, claim: Claim, state: ClaimState) -> None:
        self.claim = claim
        self.state: ClaimState = state
        self.publish: Publish | None = None


class ClaimTable:
    """Claims by message id (one per message), with writes staged for the next commit."""

    def __init__(self, config: RuntimeConfig, store_id: str, fencing_revision: int) -> None:
        self.config = config
        self.store_id = store_id
        self.fencing_revision = fencing_revision
        self.permits = Permits(config)
        self._held: dict[str, _Held] = {}
        # The same claims by state, in the order they entered it: ahead ones for discovery,
        # admitted ones in the order their Publish arrived (the order they are sent in).
        self._ahead: dict[str, Claim] = {}
        self._admitted: dict[str, _Held] = {}
        # Rows to write by claim sequence: a claim made since the last commit, as its row;
        # a claim that commit already wrote, to delete.
        self._staged_puts: dict[int, PersistedClaim] = {}
        self._staged_deletes: set[int] = set()
        self._wipe_persisted = False
        self.sequence = 0

    def load(self, sequence: int, stored_rows: int) -> int:
        """On start, with what the store holds (`ShardStore.read_claims`): continue the
        sequence and schedule every persisted claim for deletion; they belonged to a
        process that is gone. Returns how many there were."""
        self.sequence = sequence
        self._wipe_persisted = stored_rows > 0
        return stored_rows

    # Reading ------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, message_id: str) -> bool:
        return message_id in self._held

    def __iter__(self) -> Iterator[Claim]:
        return iter([held.claim for held in self._held.values()])

    def get(self, message_id: str) -> Claim | None:
        held = self._held.get(message_id)
        return None if held is None else held.claim

    def state_of(self, message_id: str) -> ClaimState | None:
        held = self._held.get(message_id)
        return None if held is None else held.state

    def ahead(self) -> list[Claim]:
        """The claims made ahead, in the order they were made."""
        return list(self._ahead.values())

    def ahead_count(self) -> int:
        return len(self._ahead)

    def earliest_ahead_ms(self) -> int | None:
        """The earliest action time among the claims made ahead."""
        if not self._ahead:
            return None
        return min(claim.action_at_ms for claim in self._ahead.values())

    def waiting_to_send(self) -> int:
        """Admitted claims not yet handed to the destination."""
        return len(self._admitted)

    # Ids ----------------------------------------------------------------------------------

    def _tag(self, sequence: int) -> str:
        # A claim namespace keeps attempt ids unique across owners that each keep their own
        # claim sequence (a Kafka-partitioned shard moves between processes).
        namespace = self.config.claim_namespace
        return f"{namespace}-{sequence}" if namespace else str(sequence)

    def next_claim_id(self) -> str:
        """A claim id of its own, for a proposal that is not a claim (a claim result)."""
        return f"{self.config.owner}:{self._tag(self._next_sequence())}"

    def issued_here(self, claim_id: str) -> bool:
        """Whether this runtime made the claim. An embedded log has one writer, this store,
        so every Admission in it is ours; a Kafka shard owner names its claims with the
        tenure's namespace."""
        namespace = self.config.claim_namespace
        return not namespace or claim_id.startswith(f"{self.config.owner}:{namespace}-")

    def _next_sequence(self) -> int:
        self.sequence += 1
        return self.sequence

    # Transitions --------------------------------------------------------------------------

    def claim(self, message: Message, prepared: PreparedPublish, now_ms: int) -> Claim:
        """Claim the message's current generation, its Admission to be proposed now."""
        return self._add(message, prepared, now_ms, CLAIMED)

    def claim_ahead(self, message: Message, prepared: PreparedPublish, now_ms: int) -> Claim:
        """Claim the message's current generation before its action time."""
        claim = self._add(message, prepared, now_ms, AHEAD)
        self._ahead[claim.message_id] = claim
        return claim

    def propose(self, claim: Claim) -> None:
        """ahead -> claimed: the clock proves its action time and its Admission is proposed."""
        held = self._held[claim.message_id]
        assert held.claim is claim and held.state == AHEAD, (claim.claim_id, held.state)
        held.state = CLAIMED
        del self._ahead[claim.message_id]

    def admit(self, publish: Publish) -> bool:
        """claimed -> admitted, when the fold's Publish names the claim held here. False when
        it names none held here (released since): the producer is then never called."""
        held = self._held.get(publish.message_id)
        if (
            held is None
            or held.claim.claim_id != publish.claim_id
            or held.claim.attempt_id != publish.attempt_id
        ):
            return False
        assert held.state == CLAIMED, (publish.claim_id, held.state)
        assert held.claim.descriptor_hash == publish.descriptor_hash
        held.state = ADMITTED
        held.publish = publish
        self._admitted[publish.message_id] = held
        return True

    def ready_to_send(self, interval: TrustedInterval) -> list[Claim]:
        """The admitted claims whose send gate `interval` opens, in the order admitted."""
        ready: list[Claim] = []
        for held in self._admitted.values():
            publish = held.publish
            assert publish is not None
            if send_gate_open(interval, publish.action_at_ms):
                ready.append(held.claim)
        return ready

    def sending(self, claims: list[Claim]) -> list[Send]:
        """admitted -> sending: the sends of these claims, to hand to the destination."""
        sends: list[Send] = []
        for claim in claims:
            held = self._admitted.pop(claim.message_id)
            assert held.claim is claim and held.publish is not None
            held.state = SENDING
            sends.append(Send(held.publish.attempt_id, claim.prepared))
        return sends

    def revoke(self, revoke: RevokeClaim) -> None:
        """The kernel's word: release the claim on that generation (only `claim_id`, if
        named), whatever state it is in."""
        held = self._held.get(revoke.message_id)
        if held is not None and held.claim.generation == revoke.generation:
            self.release(revoke.message_id, revoke.claim_id)

    def expire(self, now_ms: int) -> list[Claim]:
        """Release the claims past their deadline whose Admission has not won (ahead or
        claimed); returns them. An admitted or sending claim is never released by time."""
        expired = [
            held.claim
            for held in self._held.values()
            if held.claim.deadline_ms < now_ms and held.state in (AHEAD, CLAIMED)
        ]
        for claim in expired:
            self.release(claim.message_id, claim.claim_id)
        return expired

    def release(self, message_id: str, claim_id: str | None = None) -> Claim | None:
        """Release the claim on a message (only if it is `claim_id`, when given)."""
        held = self._held.get(message_id)
        if held is None or (claim_id is not None and held.claim.claim_id != claim_id):
            return None
        claim = held.claim
        del self._held[message_id]
        self._ahead.pop(message_id, None)
        self._admitted.pop(message_id, None)
        self.permits.release((claim.tenant, claim.queue), claim.size_bytes)
        sequence = claim.claim_sequence
        if self._staged_puts.pop(sequence, None) is None:
            self._staged_deletes.add(sequence)  # written by an earlier commit
        return claim

    def release_all(self) -> None:
        for message_id in list(self._held):
            self.release(message_id)

    def _add(
        self, message: Message, prepared: PreparedPublish, now_ms: int, state: ClaimState
    ) -> Claim:
        assert message.message_id not in self._held, "one claim per message"
        sequence = self._next_sequence()
        tag = self._tag(sequence)
        claim = Claim(
            claim_id=f"{self.config.owner}:{tag}",
            claim_sequence=sequence,
            message_id=message.message_id,
            generation=message.generation,
            version=message.version,
            attempt_id=f"{attempt_prefix(message.message_id, message.generation)}{tag}",
            tenant=message.tenant,
            queue=message.queue,
            owner=self.config.owner,
            store_id=self.store_id,
            fencing_revision=self.fencing_revision,
            deadline_ms=now_ms + self.config.claim_deadline_ms,
            action_at_ms=message.action_at_ms,
            size_bytes=prepared.size_bytes(),
            prepared=prepared,
            descriptor_hash=prepared.descriptor_hash(),
        )
        self._held[claim.message_id] = _Held(claim, state)
        self.permits.acquire((claim.tenant, claim.queue), claim.size_bytes)
        self._staged_puts[sequence] = PersistedClaim.of(claim)
        return claim

    # Persisting ---------------------------------------------------------------------------

    def flush(self, rows: ClaimRows) -> None:
        """Write staged changes into the store's commit transaction (`rows`)."""
        rows.write(
            self._staged_puts, self._staged_deletes, self.sequence, wipe=self._wipe_persisted
        )
        self._wipe_persisted = False
        self._staged_puts.clear()
        self._staged_deletes.clear()
