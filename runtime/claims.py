"""Local, reversible claims and the permits they hold.

Theory of operation: a claim reserves one due generation for this worker: it holds permits
(a worker slot, a lane slot, payload bytes), records which (generation, version) it saw, and
carries the immutable prepared publish built from the payload. Claims are persisted in the
shard store's `claims` table no later than the transaction of the Admission they lead to (a
claim made ahead of its action time may be written by an earlier commit), with a claim
sequence that never repeats (attempt ids are built from it), so a restarted process
knows which claims died with its predecessor. Nothing here is a fact of the log: a claim may
be dropped at any time, and the log's verdict on the Admission decides what happened.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec

from runtime.config import RuntimeConfig
from runtime.destination import PreparedPublish
from storage.codec import decode_struct, encode_value

_SEQ_KEY = b"\x00claim_sequence"
_CLAIM_PREFIX = b"c"


def _claim_key(sequence: int) -> bytes:
    # By claim sequence, not message id: a commit's new claims land side by side in one or
    # two B-tree pages (message ids are spread over all of them), so the sync writes less.
    return _CLAIM_PREFIX + sequence.to_bytes(8, "big")


class Claim(msgspec.Struct, frozen=True):
    claim_id: str
    claim_sequence: int
    message_id: str
    generation: int
    version: int
    attempt_id: str
    tenant: str
    queue: str
    owner: str
    store_id: str
    fencing_revision: int
    deadline_ms: int
    action_at_ms: int
    size_bytes: int
    prepared: PreparedPublish
    descriptor_hash: str  # of `prepared`: what the Admission names


class PersistedClaim(msgspec.Struct, frozen=True):
    """What the claims table keeps of a claim: who held which generation and what it was
    going to send (by descriptor hash). The prepared record itself is not copied there: it
    can be as large as the payload, and a restart drops claims rather than resuming them."""

    claim_id: str
    claim_sequence: int
    message_id: str
    generation: int
    version: int
    attempt_id: str
    owner: str
    store_id: str
    fencing_revision: int
    deadline_ms: int
    action_at_ms: int
    descriptor_hash: str

    @classmethod
    def of(cls, claim: Claim) -> PersistedClaim:
        # By name: the field list above is the only place that says what is kept.
        return cls(*[getattr(claim, name) for name in cls.__struct_fields__])


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


class ClaimTable:
    """Claims by message id, with writes staged for the next store commit."""

    def __init__(self, config: RuntimeConfig, store_id: str, fencing_revision: int) -> None:
        self.config = config
        self.store_id = store_id
        self.fencing_revision = fencing_revision
        self.permits = Permits(config)
        self._by_message: dict[str, Claim] = {}
        self._staged_puts: dict[bytes, Claim] = {}
        self._staged_deletes: set[bytes] = set()
        self._wipe_persisted = False
        self.sequence = 0

    def load(self, txn: Any, claims_db: Any, path: str) -> int:
        """On start: read the sequence and schedule every persisted claim for deletion;
        they belonged to a process that is gone. Returns how many there were."""
        raw = txn.get(_SEQ_KEY, db=claims_db)
        self.sequence = 0 if raw is None else int.from_bytes(raw, "big")
        stale = 0
        with txn.cursor(db=claims_db) as cursor:
            for key in cursor.iternext(values=False):
                if key != _SEQ_KEY:
                    stale += 1
        self._wipe_persisted = stale > 0
        return stale

    def __len__(self) -> int:
        return len(self._by_message)

    def __contains__(self, message_id: str) -> bool:
        return message_id in self._by_message

    def get(self, message_id: str) -> Claim | None:
        return self._by_message.get(message_id)

    def __iter__(self) -> Iterator[Claim]:
        return iter(list(self._by_message.values()))

    def next_sequence(self) -> int:
        self.sequence += 1
        return self.sequence

    def add(self, claim: Claim) -> None:
        assert claim.message_id not in self._by_message, "one claim per message"
        self._by_message[claim.message_id] = claim
        self.permits.acquire((claim.tenant, claim.queue), claim.size_bytes)
        self._staged_puts[_claim_key(claim.claim_sequence)] = claim

    def drop(self, message_id: str, claim_id: str | None = None) -> Claim | None:
        """Drop the claim on a message (only if it is `claim_id`, when given)."""
        claim = self._by_message.get(message_id)
        if claim is None or (claim_id is not None and claim.claim_id != claim_id):
            return None
        del self._by_message[message_id]
        self.permits.release((claim.tenant, claim.queue), claim.size_bytes)
        key = _claim_key(claim.claim_sequence)
        if self._staged_puts.pop(key, None) is None:
            self._staged_deletes.add(key)  # written by an earlier commit
        return claim

    def flush(self, txn: Any, claims_db: Any) -> None:
        """Write staged changes into the store's commit transaction."""
        if self._wipe_persisted:
            with txn.cursor(db=claims_db) as cursor:
                doomed = [k for k in cursor.iternext(values=False) if k != _SEQ_KEY]
            for key in doomed:
                txn.delete(key, db=claims_db)
            self._wipe_persisted = False
        for key in self._staged_deletes:
            txn.delete(key, db=claims_db)
        for key, claim in self._staged_puts.items():
            txn.put(key, encode_value(PersistedClaim.of(claim)), db=claims_db)
        txn.put(_SEQ_KEY, self.sequence.to_bytes(8, "big"), db=claims_db)
        self._staged_puts.clear()
        self._staged_deletes.clear()


def read_claim(raw: bytes, path: str) -> PersistedClaim:
    return decode_struct(PersistedClaim, raw, path, "claim")
