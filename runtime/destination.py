"""What the runtime needs from a destination, and the values that cross that boundary.

Theory of operation: a claim turns a due message into an immutable `PreparedPublish` (the
exact record to write, minus the attempt id); an Admission assigns the attempt id; after the
Admission is durable the runner hands `Send`s to the destination, which reports one
`SendResult` per send. The result's class must be the truth: PUBLISHED only with evidence,
NOT_PUBLISHED only when the record is definitely absent, otherwise UNKNOWN. Evidence lookup
by attempt id lets recovery resolve attempts whose send gate died with a process.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Protocol

import msgspec

from kernel.keys import attempt_prefix
from kernel.records import Capability, Evidence, NotPublished, Published, Unknown

# Headers Nereus writes on every published record; clients may not send these names.
H_MESSAGE_ID = "nereus-message-id"
H_GENERATION = "nereus-generation"
H_ATTEMPT_ID = "nereus-attempt-id"
H_TXN = "nereus-txn"
H_DELIVER_AT = "nereus-deliver-at"
H_PRODUCER = "nereus-producer"
H_PRODUCER_SUB = "nereus-producer-sub"
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


class PreparedPublish(msgspec.Struct, frozen=True):
    """The immutable descriptor a claim builds; its hash goes into the Admission."""

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

    def descriptor_hash(self) -> str:
        return hashlib.sha256(msgspec.msgpack.encode(self)).hexdigest()

    def size_bytes(self) -> int:
        headers = sum(len(k) + len(v) for k, v in self.headers)
        return len(self.value) + len(self.key or b"") + headers


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


class Destination(Protocol):
    name: str
    capability: Capability

    def max_record_bytes(self, topic: str) -> int:
        """The largest record the topic accepts; checked at claim, before Admission."""
        ...

    def topic_for(self, queue: str) -> str: ...

    def submit(self, sends: Sequence[Send], now_ms: int) -> None:
        """Start sending. Must not block for long; results come from `poll`."""
        ...

    def poll(self, timeout_s: float) -> list[SendResult]: ...

    def find(self, attempt_id: str, topic: str, since_ms: int) -> Evidence | None:
        """Positive evidence that this attempt's record is at the destination, or None
        (which proves nothing)."""
        ...

    def close(self) -> None: ...
