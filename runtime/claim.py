"""A claim as a value, and the row the claims table keeps of it.

Theory of operation: a claim reserves one due generation for this worker: it holds permits
(a worker slot, a lane slot, payload bytes), records which (generation, version) it saw, and
carries the immutable prepared publish built from the payload. What happens to a claim is
`runtime.claims`'s; this module only says what one is. The values are msgspec Structs, so
they stay in a module of their own: mypyc compiles `runtime.claims` and cannot compile a
Struct (setup.py).
"""

from __future__ import annotations

import msgspec

from nereus.runtime.destination import PreparedPublish
from nereus.storage.codec import decode_struct


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


def read_claim(raw: bytes, path: str) -> PersistedClaim:
    return decode_struct(PersistedClaim, raw, path, "claim")
