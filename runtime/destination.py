"""What the runtime needs from a destination, and the values that cross that boundary.

Theory of operation: a claim turns a due message into an immutable `PreparedPublish` (the
exact record to write, minus the attempt id); an Admission assigns the attempt id; after the
Admission is durable the runner hands `Send`s to the destination, which reports one
`SendResult` per send. The result's class must be the truth: PUBLISHED only with evidence,
NOT_PUBLISHED only when the record is definitely absent, otherwise UNKNOWN.

Evidence is searched in bulk (`search`): recovery, reconciliation of UNKNOWN attempts, the
look before an uncertain retry and the look for dead-letter copies hand the destination one
set of `Lookup`s, and it reads each partition once for all of them, in the background, while
the runtime goes on. A destination whose producer can be fenced (`fence_id`: Kafka's
transactional producer; the local destination's writer, by its directory's lock) fences it
before the search takes its end offsets; then an attempt admitted under that fence id and
not found by a complete search is definitely absent, and the outcome says why
(`AbsenceProof`), unless the search lists it `unfenced` (the fencing writer may still send
it itself). Without a fence, not finding a record proves nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Protocol, cast, runtime_checkable

import msgspec

from nereus.kernel.keys import attempt_prefix
from nereus.kernel.native import sha256_hex
from nereus.kernel.records import (
    IMMEDIATE,
    AbsenceProof,
    Capability,
    Evidence,
    NotPublished,
    Published,
    Unknown,
)

# Headers Nereus writes on every published record; clients may not send these names.
H_MESSAGE_ID = "nereus-message-id"
H_GENERATION = "nereus-generation"
H_ATTEMPT_ID = "nereus-attempt-id"
H_TXN = "nereus-txn"
H_DELIVER_AT = "nereus-deliver-at"
H_PRODUCER = "nereus-producer"
H_PRODUCER_SUB = "nereus-producer-sub"
# The tenant whose timer the record is: its topic is the tenant's, or one declared shared.
H_TENANT = "nereus-tenant"
# The timer's key, so a consumer knows which timer a record is without a table of message
# ids; written by `runtime.timer_key_header.encode_timer_key` (printable, or marked base64).
H_TIMER_KEY = "nereus-timer-key"
# On records whose value is an encryption envelope (adapters/crypto.py); value: the algorithm.
H_ENCRYPTION = "nereus-encryption"
# On dead-letter copies: the synthetic consumer group the copy is filed under.
H_CONSUMER_GROUP = "nereus-consumer-group"
DLQ_CONSUMER_GROUP = "nereus.timers.dlq"
# A queue's dead-letter copies go to its topic plus this suffix.
DLQ_SUFFIX = ".dlq"


def dead_letter_attempt_id(message_id: str, generation: int) -> str:
    """The attempt id a generation's dead-letter copy is written under. Every write of that
    copy (a retry, a rewrite after a restart) carries the same one, so an evidence lookup
    finds any of them and a consumer of the dead-letter queue can drop duplicates by it."""
    return f"{attempt_prefix(message_id, generation)}dlq"


def is_dead_letter_attempt(attempt_id: str) -> bool:
    """Publish attempt ids end in a claim sequence (digits, or namespace-digits), never in
    `.dlq`."""
    return attempt_id.endswith(".dlq")


class PreparedPublish(msgspec.Struct, frozen=True, omit_defaults=True):
    """The immutable descriptor a claim builds; its hash goes into the Admission.

    `capability` is the one the timer is pinned to: a delayed-handoff target asks its broker
    to reveal the record at `kernel.validation.visible_at(deliver_at_ms, capability)`. It is
    left out of the encoding when immediate, so the hash of every other descriptor is what
    it was before the field existed."""

    destination: str
    topic: str
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]
    message_id: str
    generation: int
    txn: str
    deliver_at_ms: int
    producer_sub: str | None
    encrypted: bool
    capability: Capability = IMMEDIATE

    def descriptor_hash(self) -> str:
        return sha256_hex(msgspec.msgpack.encode(self))

    def size_bytes(self) -> int:
        # A loop, not sum() over a generator: this module is not compiled (a Struct lives
        # here), and a fire asks three times.
        size = len(self.value) + len(self.key or b"")
        for name, value in self.headers:
            size += len(name) + len(value)
        return size


class Send(msgspec.Struct, frozen=True):
    attempt_id: str
    prepared: PreparedPublish

    def headers(self) -> tuple[tuple[str, bytes], ...]:
        return (*self.prepared.headers, (H_ATTEMPT_ID, self.attempt_id.encode()))


PublishResult = Published | NotPublished | Unknown


class SendResult(msgspec.Struct, frozen=True):
    attempt_id: str
    message_id: str
    generation: int
    result: PublishResult

    @classmethod
    def of(cls, send: Send, result: PublishResult) -> SendResult:
        p = send.prepared
        return cls(send.attempt_id, p.message_id, p.generation, result)


class Lookup(msgspec.Struct, frozen=True):
    """An attempt to look for: a record whose attempt-id header is `attempt_id`, in `topic`,
    written no earlier than `since_ms` (its admission's persistence time) less the search's
    slack for clocks."""

    attempt_id: str
    topic: str
    since_ms: int


class Fence(msgspec.Struct, frozen=True):
    """The destination fenced every earlier producer under `fence_id` at `fenced_at_ms`
    (wall clock): whatever they left open can never become visible."""

    fence_id: str
    fenced_at_ms: int


class SearchOutcome(msgspec.Struct, frozen=True):
    """What one search found. `complete`: every partition of every topic looked at was read
    to the end offset it had when the search started (after `fence`, if any); an incomplete
    search (a bound, an unreachable broker) proves nothing by what it did not find.

    `unfenced`: attempts looked for that the fence does not cover, because the producer
    that fenced may itself still send them (the local destination's own attempts: see
    `adapters.local.destination`); never proven absent. `parts`: a search made of several
    targets' searches (`adapters.routed`), each with the attempts it looked for: an
    attempt's proof is its own target's, under that target's fence."""

    found: dict[str, Evidence]
    complete: bool
    fence: Fence | None = None
    searched: str = ""  # which partitions were read up to which offsets, for proofs and logs
    error: str | None = None
    unfenced: frozenset[str] = frozenset()
    parts: tuple[SearchPart, ...] = ()

    def proof_for(self, fence_id: str | None, attempt_id: str) -> AbsenceProof | None:
        """A proof that the attempt `attempt_id`, sent under `fence_id` and not in `found`,
        is absent, or None where this search proves nothing about it."""
        if self.parts:
            for part in self.parts:
                if attempt_id in part.attempt_ids:
                    return part.outcome.proof_for(fence_id, attempt_id)
            return None  # no target looked for it
        fence = self.fence
        if fence_id is None or fence is None or fence.fence_id != fence_id or not self.complete:
            return None
        if attempt_id in self.unfenced:
            return None
        return AbsenceProof(fence_id, fence.fenced_at_ms, self.searched)


class SearchPart(msgspec.Struct, frozen=True):
    """One target's share of a combined search: the attempts it looked for, what it found."""

    attempt_ids: frozenset[str]
    outcome: SearchOutcome


def proven_absent(proof: AbsenceProof, why: str) -> NotPublished:
    """The outcome of an attempt its fence proves absent: definitely not at the destination,
    so retriable, with the proof on the record."""
    return NotPublished("retriable", "absent_after_fence", why, proof=proof)


class Search(Protocol):
    def done(self) -> bool: ...

    def outcome(self) -> SearchOutcome:
        """The result; only once `done()`."""
        ...

    def cancel(self) -> None: ...


def find_one(
    destination: Destination, attempt_id: str, topic: str, since_ms: int, timeout_s: float
) -> Evidence | None:
    """One lookup, waiting up to `timeout_s` for its search: for tools and tests, not the
    runtime (which never waits on a search)."""
    finished = threading.Event()
    handle = destination.search([Lookup(attempt_id, topic, since_ms)], finished.set)
    if not handle.done():
        finished.wait(timeout_s)
    if not handle.done():
        handle.cancel()
        return None
    return handle.outcome().found.get(attempt_id)


class FinishedSearch:
    """A search that was over when it was made: for destinations whose lookup is an index
    read rather than a scan (the local destination, the simulator)."""

    def __init__(self, outcome: SearchOutcome) -> None:
        self._outcome = outcome

    def done(self) -> bool:
        return True

    def outcome(self) -> SearchOutcome:
        return self._outcome

    def cancel(self) -> None:
        pass


class Destination(Protocol):
    name: str
    # The capability of every queue, for a destination that offers one; one whose queues
    # differ (a routed set of targets, a Pulsar target whose handoff may be withdrawn) also
    # has the methods of `QueueCapabilities`, which `capability_for` and `accepts` prefer.
    capability: Capability
    # The fencing identity of the producer that sends (recorded in every Admission), or None
    # when the producer cannot be fenced and absence is never proven after the fact.
    fence_id: str | None

    def open(self, store_id: str) -> None:
        """Called once by the runtime before recovery, with the shard store's id: a
        destination that derives its fencing identity from the store sets `fence_id` here
        and fences its predecessors."""
        ...

    def max_record_bytes(self, topic: str) -> int:
        """The largest record the topic accepts; checked at claim, before Admission."""
        ...

    def topic_for(self, queue: str, *, tenant: str) -> str:
        """The topic a tenant's queue is delivered to (`adapters.tenant_topics`): never one
        another tenant's queue reaches, unless the operator declared it shared."""
        ...

    def submit(self, sends: Sequence[Send], now_ms: int) -> None:
        """Start sending. Must not block for long; results come from `poll`."""
        ...

    def poll(self, timeout_s: float) -> list[SendResult]: ...

    def search(self, lookups: Sequence[Lookup], wake: Callable[[], None]) -> Search:
        """Look for every lookup's record in one pass per partition; `wake` is called when
        the search is done (from any thread). Must not block for long."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class QueueCapabilities(Protocol):
    """A destination whose capability depends on the queue, or on what its target allows
    right now (a Pulsar target withdraws its delayed handoff when the broker's settings stop
    certifying it)."""

    def capability_for(self, queue: str, *, tenant: str) -> Capability:
        """The capability a new schedule on the tenant's `queue` is pinned to."""
        ...

    def accepts(self, queue: str, capability: Capability, *, tenant: str) -> bool:
        """Whether a timer pinned to `capability` may be claimed and sent on `queue` now:
        False keeps it from being sent (its claim fails as capability_mismatch)."""
        ...


# Destination class -> whether it has QueueCapabilities' methods. An isinstance check against
# a runtime-checkable protocol looks each method up anew (~20 us), and these run for every
# schedule and every due timer; destinations define the methods on the class.
_PER_QUEUE: dict[type, bool] = {}


def _per_queue(destination: Destination) -> QueueCapabilities | None:
    cls = type(destination)
    known = _PER_QUEUE.get(cls)
    if known is None:
        known = _PER_QUEUE[cls] = isinstance(destination, QueueCapabilities)
    return cast(QueueCapabilities, destination) if known else None


@runtime_checkable
class TopicFences(Protocol):
    """A destination made of targets fenced apart (a routed set): the fence an attempt is
    sent under is its topic's target's."""

    def fence_id_for(self, topic: str) -> str | None:
        """The fence id of the producer that sends to `topic` (None: it cannot be fenced)."""
        ...


_PER_TOPIC_FENCE: dict[type, bool] = {}


def fence_id_for(destination: Destination, topic: str) -> str | None:
    """The fence id an attempt sent to `topic` is admitted under (its Admission's
    `fence_id`): the destination's own, or its target's where its targets are fenced
    apart."""
    cls = type(destination)
    known = _PER_TOPIC_FENCE.get(cls)
    if known is None:
        known = _PER_TOPIC_FENCE[cls] = isinstance(destination, TopicFences)
    if known:
        return cast(TopicFences, destination).fence_id_for(topic)
    return destination.fence_id


def capability_for(destination: Destination, queue: str, *, tenant: str) -> Capability:
    """The capability a schedule on the tenant's `queue` is pinned to (the edges stamp it on
    SCHEDULE_V1)."""
    per_queue = _per_queue(destination)
    if per_queue is not None:
        return per_queue.capability_for(queue, tenant=tenant)
    return destination.capability


def accepts(destination: Destination, queue: str, capability: Capability, *, tenant: str) -> bool:
    """Whether the destination may send a timer of the tenant's `queue` pinned to
    `capability` now."""
    per_queue = _per_queue(destination)
    if per_queue is not None:
        return per_queue.accepts(queue, capability, tenant=tenant)
    return destination.capability == capability
