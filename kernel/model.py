"""The values the shard state is made of.

Theory of operation: state is a set of tables (`Table`) mapping encoded keys to frozen
msgspec values, plus one small `ShardMeta` value that changes on every entry. Storage keeps
the tables in LMDB sub-databases with the same keys, so these types are also the on-disk
schema (see `specs/records.md` for the field meanings). Message status describes the
*current generation*; attempts are kept per attempt id and outlive generations.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Final, Literal

import msgspec

from nereus.kernel.records import Capability, Evidence, ShardStatus


class Table(StrEnum):
    MESSAGES = "messages"  # message_id -> Message
    ATTEMPTS = "attempts"  # attempt_id -> Attempt (the ledger)
    OBLIGATIONS = "obligations"  # attempt_id -> Obligation (PUBLISHING and UNKNOWN only)
    TIMELINE = "timeline"  # actionAt|message_id|generation -> TimelineWork
    LANES = "lanes"  # tenant\0queue -> Lane (absent means OPEN)
    PAYLOADS = "payloads"  # payload digest -> PayloadRef
    USAGE = "usage"  # tenant -> TenantUsage (absent means no live messages)
    DEAD_LETTERS = "dead_letters"  # message_id.generation -> DeadLetterPending (copy owed)


TABLES: tuple[Table, ...] = tuple(Table)


class Status(StrEnum):
    SCHEDULED = "SCHEDULED"  # pending: waiting for actionAt, or in retry backoff
    PUBLISHING = "PUBLISHING"  # an admitted attempt is open
    UNCERTAIN = "UNCERTAIN"  # an attempt is UNKNOWN: it may or may not be at the destination
    DELIVERED = "DELIVERED"
    CANCELED = "CANCELED"
    EXPIRED = "EXPIRED"
    DEAD_LETTERED = "DEAD_LETTERED"


# Statuses whose generation may still reach the destination or already has.
LIVE_STATUSES = frozenset({Status.SCHEDULED, Status.PUBLISHING, Status.UNCERTAIN})
# Statuses that hold a reference to the payload bytes. A dead-lettered generation's bytes are
# held by its pending dead-letter copy (`DeadLetterPending`) until the copy is recorded.
PAYLOAD_HOLDING = LIVE_STATUSES


class AttemptStatus(StrEnum):
    PUBLISHING = "PUBLISHING"
    PUBLISHED = "PUBLISHED"
    NOT_PUBLISHED = "NOT_PUBLISHED"
    UNKNOWN = "UNKNOWN"


OPEN_ATTEMPT_STATUSES = frozenset({AttemptStatus.PUBLISHING, AttemptStatus.UNKNOWN})


# Every value type below is declared `gc=False`: frozen, holding only strings, numbers, enum
# members, tuples and other frozen values, an instance can never be part of a reference
# cycle, so the cycle collector has nothing to find in it. A fold or an in-memory store
# holds millions of these rows; tracked, each full collection walked every one of them (a
# third of the apply time at 1M live timers, bench/kernel_apply.py). Equality, hashing and
# encoding are unaffected.
class Message(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    message_id: str
    tenant: str
    queue: str
    timer_key: str
    generation: int
    version: int
    status: Status
    txn: str
    payload_digest: str
    payload_size: int
    partition_key: str | None
    headers: tuple[tuple[str, str], ...]
    destination: str
    capability: Capability
    producer_sub: str | None
    encrypted: bool
    deliver_at_ms: int
    expire_at_ms: int
    action_at_ms: int  # the timeline key's time while has_work
    has_work: bool  # a timeline row (action_at_ms, id, generation) exists
    request_digest: str  # identical-retry detection for SCHEDULE_V1 / RESCHEDULE_V1
    attempts_admitted: int  # Admissions won this generation
    attempts_spent: int  # budget spent this generation (permanent failures only)
    failures: int  # all failures this generation, UNKNOWN included; the backoff exponent
    open_attempts: int  # this generation's attempts that are PUBLISHING or UNKNOWN
    uncertain_retries: int  # Admissions won while UNCERTAIN this generation
    last_error: str | None
    last_attempt_id: str | None
    delivered_attempt_id: str | None  # the attempt whose evidence made it DELIVERED
    evidence: Evidence | None  # set when DELIVERED
    created_at_ms: int
    updated_at_ms: int
    created_position: int
    updated_position: int
    # DEAD_LETTERED only: where the dead-letter copy of this generation was written (set by
    # DEAD_LETTER_WRITTEN_V1; None while the copy is pending).
    dead_letter_evidence: Evidence | None = None


# What every generation starts from, the first (SCHEDULE_V1) and each later one
# (RESCHEDULE_V1): no Admissions, the whole budget, no failures, nothing delivered. One
# list, so a field added to the budget cannot be reset by one command and kept by the other.
FRESH_GENERATION: Final[dict[str, Any]] = {
    "attempts_admitted": 0,
    "attempts_spent": 0,
    "failures": 0,
    "open_attempts": 0,
    "uncertain_retries": 0,
    "last_error": None,
    "last_attempt_id": None,
    "delivered_attempt_id": None,
    "evidence": None,
    "dead_letter_evidence": None,
}


class Attempt(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    attempt_id: str
    message_id: str
    generation: int
    status: AttemptStatus
    destination: str
    descriptor_hash: str
    claim_id: str
    owner: str
    admitted_position: int
    admitted_at_ms: int
    resolved_position: int | None = None
    resolved_at_ms: int | None = None
    disposition: str | None = None
    error_code: str | None = None
    evidence: Evidence | None = None
    # The fencing identity of the producer that sends this attempt (from its Admission).
    fence_id: str | None = None


class Obligation(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """An open producer obligation: the attempt may exist at the destination."""

    message_id: str
    generation: int
    destination: str
    admitted_position: int
    admitted_at_ms: int


class TimelineWork(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    kind: Literal["deliver", "retry"]
    tenant: str
    queue: str
    message_id: str
    generation: int
    version: int
    deliver_at_ms: int
    expire_at_ms: int
    payload_size: int


class Lane(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    tenant: str
    queue: str
    gate: Literal["OPEN", "CLOSED"]
    changed_position: int


class PayloadRef(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    count: int
    size: int


class TenantUsage(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """What a tenant holds in this shard, for quotas: its live messages (SCHEDULED,
    PUBLISHING, UNCERTAIN) and the sum of their payload sizes. The row is deleted when both
    reach zero, so every stored row has `live > 0`."""

    live: int
    bytes: int


class DeadLetterPending(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """A dead-letter copy owed, put in the step that dead-letters a generation and deleted
    when DEAD_LETTER_WRITTEN_V1 records the copy. It restates what the copy is made of as it
    stood then (content, attempt budget, last error), so a later generation of the same timer
    can neither change nor drop it, and it holds a reference to the payload bytes until the
    copy is recorded. The copy's attempt history is the ATTEMPTS key range
    `attempt_prefix(message_id, generation)`."""

    message_id: str
    generation: int
    attempts_spent: int
    failures: int
    last_error: str | None
    txn: str
    payload_digest: str
    payload_size: int
    partition_key: str | None
    producer_sub: str | None
    encrypted: bool
    deliver_at_ms: int
    dead_lettered_position: int
    dead_lettered_at_ms: int


class Counters(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """Aggregates the ledger and the message table imply; invariants recompute them."""

    scheduled: int = 0
    publishing: int = 0
    uncertain: int = 0
    delivered: int = 0
    canceled: int = 0
    expired: int = 0
    dead_lettered: int = 0
    attempts_publishing: int = 0
    attempts_published: int = 0
    attempts_not_published: int = 0
    attempts_unknown: int = 0
    dead_letters_pending: int = 0


class ShardMeta(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    position: int = 0  # the applied shard log position; 0 = nothing applied
    last_persisted_at_ms: int = 0
    shard_status: ShardStatus = "ACTIVE_FOR_COMMANDS"
    counters: Counters = Counters()


Value = (
    Message | Attempt | Obligation | TimelineWork | Lane | PayloadRef | TenantUsage
    | DeadLetterPending
)  # fmt: skip

VALUE_TYPES: dict[Table, type[Value]] = {
    Table.MESSAGES: Message,
    Table.ATTEMPTS: Attempt,
    Table.OBLIGATIONS: Obligation,
    Table.TIMELINE: TimelineWork,
    Table.LANES: Lane,
    Table.PAYLOADS: PayloadRef,
    Table.USAGE: TenantUsage,
    Table.DEAD_LETTERS: DeadLetterPending,
}

STATUS_COUNTER: dict[Status, str] = {
    Status.SCHEDULED: "scheduled",
    Status.PUBLISHING: "publishing",
    Status.UNCERTAIN: "uncertain",
    Status.DELIVERED: "delivered",
    Status.CANCELED: "canceled",
    Status.EXPIRED: "expired",
    Status.DEAD_LETTERED: "dead_lettered",
}

ATTEMPT_COUNTER: dict[AttemptStatus, str] = {
    AttemptStatus.PUBLISHING: "attempts_publishing",
    AttemptStatus.PUBLISHED: "attempts_published",
    AttemptStatus.NOT_PUBLISHED: "attempts_not_published",
    AttemptStatus.UNKNOWN: "attempts_unknown",
}


# Here rather than in rules.py: mypyc compiles rules.py and cannot compile a subclass of a
# builtin exception.
class UnsupportedRow(AssertionError):
    """A row names a transition the code has no branch for: the table and the code disagree,
    which is a bug, never bad input. Raised rather than asserted so it holds under -O."""
