"""Materialize a claimed message into the exact record the destination will receive.

Theory of operation: everything that can be proven wrong before a send is checked here, so a
permanent problem becomes a CLAIM_RESULT_V1 in the log instead of a failed attempt: payload
bytes missing, not matching their digest or size, or a record larger than the destination
accepts. Nereus's own headers carry the identity and evidence keys (message id, generation,
txn, tenant, timer key, producer); the attempt id header is added at send time. The topic is the
destination's for the message's tenant and queue. A message scheduled with
`encrypted` holds an envelope (adapters/crypto.py), delivered unchanged with the
`nereus-encryption` header on it and on its dead-letter copy.

A dead-letter copy is made of the dead-lettered generation as the kernel recorded it when it
owed the copy (`kernel.model.DeadLetterPending`), not of whatever generation the message row
holds by the time the copy is written. It is filed under the synthetic consumer group
`nereus.timers.dlq` and carries the attempt history; a copy that would not fit the
dead-letter topic is written without its payload (and says so) rather than never.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from nereus.kernel.model import DeadLetterPending, Message
from nereus.kernel.native import sha256_hex
from nereus.kernel.records import IMMEDIATE, Capability
from nereus.runtime.destination import (
    DLQ_CONSUMER_GROUP,
    DLQ_SUFFIX,
    H_CONSUMER_GROUP,
    H_DELIVER_AT,
    H_ENCRYPTION,
    H_GENERATION,
    H_MESSAGE_ID,
    H_PRODUCER,
    H_PRODUCER_SUB,
    H_TENANT,
    H_TIMER_KEY,
    H_TXN,
    Destination,
    PreparedPublish,
)
from nereus.runtime.timer_key_header import encode_timer_key

# The envelope format of adapters/crypto.py; named here so the runtime does not import adapters.
ENCRYPTION_ALGORITHM = "aes-256-gcm"


@dataclass(frozen=True)
class PrepareFailure:
    error_code: str
    detail: str


def prepare(
    message: Message, payload: bytes | None, destination: Destination, producer: str
) -> PreparedPublish | PrepareFailure:
    if payload is None:
        return PrepareFailure("payload_missing", f"no bytes for digest {message.payload_digest}")
    if len(payload) != message.payload_size:
        return PrepareFailure(
            "payload_size_mismatch", f"{len(payload)} bytes, expected {message.payload_size}"
        )
    if sha256_hex(payload) != message.payload_digest:
        return PrepareFailure("payload_checksum_mismatch", "payload bytes do not match digest")
    headers: list[tuple[str, bytes]] = [(k, v.encode()) for k, v in message.headers]
    headers += [
        (H_DELIVER_AT, str(message.deliver_at_ms).encode()),
        (H_PRODUCER, producer.encode()),
    ]
    if message.producer_sub is not None:
        headers.append((H_PRODUCER_SUB, message.producer_sub.encode()))
    prepared = _publish(
        message,
        payload,
        destination,
        destination.topic_for(message.queue, tenant=message.tenant),
        headers,
        capability=message.capability,
    )
    topic = prepared.topic
    limit = destination.max_record_bytes(topic)
    # The attempt-id header is added at send time; reserve room for it.
    if prepared.size_bytes() + 128 > limit:
        return PrepareFailure(
            "record_too_large", f"{prepared.size_bytes()} bytes > {limit} accepted by {topic}"
        )
    return prepared


# Headers of a dead-letter copy (beside the identity headers and the consumer group).
H_DLQ_ATTEMPTS_SPENT = "nereus-dlq-attempts-spent"
H_DLQ_FAILURES = "nereus-dlq-failures"
H_DLQ_LAST_ERROR = "nereus-dlq-last-error"
# Set when the copy carries no payload: `payload_missing` (the bytes were never stored) or
# `record_too_large:<bytes>` (the copy with its payload would not fit the topic).
H_DLQ_PAYLOAD_OMITTED = "nereus-dlq-payload-omitted"


def dead_letter_message(message: Message, pending: DeadLetterPending) -> Message:
    """`message` (the row of any later generation of the same timer) restated as the
    dead-lettered generation stood when its copy became owed: what the copy is made of."""
    return msgspec.structs.replace(
        message,
        generation=pending.generation,
        txn=pending.txn,
        payload_digest=pending.payload_digest,
        payload_size=pending.payload_size,
        partition_key=pending.partition_key,
        producer_sub=pending.producer_sub,
        encrypted=pending.encrypted,
        deliver_at_ms=pending.deliver_at_ms,
        attempts_spent=pending.attempts_spent,
        failures=pending.failures,
        last_error=pending.last_error,
    )


def prepare_dead_letter(
    message: Message,
    payload: bytes | None,
    destination: Destination,
    *,
    attempts_spent: int,
    failures: int,
    last_error: str | None,
) -> PreparedPublish:
    """The dead-letter copy: the same record, on `<topic>.dlq`, filed under the consumer
    group `nereus.timers.dlq`, with its attempt history. Without its payload (and a header
    saying why) when the bytes are missing or the copy would not fit the topic."""
    history = [
        (H_CONSUMER_GROUP, DLQ_CONSUMER_GROUP.encode()),
        (H_DLQ_ATTEMPTS_SPENT, str(attempts_spent).encode()),
        (H_DLQ_FAILURES, str(failures).encode()),
        (H_DLQ_LAST_ERROR, (last_error or "").encode()),
    ]
    topic = destination.topic_for(message.queue, tenant=message.tenant) + DLQ_SUFFIX
    if payload is None:
        omitted = [(H_DLQ_PAYLOAD_OMITTED, b"payload_missing")]
        return _publish(message, b"", destination, topic, history + omitted)
    prepared = _publish(message, payload, destination, topic, history)
    # Room for the attempt-id header added at send time, as for an ordinary record.
    if prepared.size_bytes() + 128 > destination.max_record_bytes(topic):
        reason = f"record_too_large:{prepared.size_bytes()}".encode()
        omitted = [(H_DLQ_PAYLOAD_OMITTED, reason)]
        return _publish(message, b"", destination, topic, history + omitted)
    return prepared


def _publish(
    message: Message,
    payload: bytes,
    destination: Destination,
    topic: str,
    extra_headers: list[tuple[str, bytes]],
    *,
    capability: Capability = IMMEDIATE,
) -> PreparedPublish:
    """A descriptor for `message` on `topic`: identity headers first, then `extra_headers`.
    A dead-letter copy is made with the immediate capability: it is written to the
    dead-letter queue when the generation is dead-lettered, not handed off for later."""
    identity = [
        (H_MESSAGE_ID, message.message_id.encode()),
        (H_GENERATION, str(message.generation).encode()),
        (H_TXN, message.txn.encode()),
        # On every record, the dead-letter copy too: a consumer of a topic declared shared
        # tells the tenants apart by it, and any consumer can check the record is its own.
        (H_TENANT, message.tenant.encode()),
        # Which timer the record is, on the dead-letter copy too: a consumer acts on the key
        # it scheduled, not on a message id it would have to map back.
        (H_TIMER_KEY, encode_timer_key(message.timer_key).encode()),
    ]
    if message.encrypted:
        # Here, not in prepare(): the dead-letter copy carries the same envelope, and a
        # consumer of either must know the value is not the clear payload.
        identity.append((H_ENCRYPTION, ENCRYPTION_ALGORITHM.encode()))
    return PreparedPublish(
        destination=destination.name,
        topic=topic,
        key=message.partition_key.encode() if message.partition_key is not None else None,
        value=payload,
        headers=tuple(identity + extra_headers),
        message_id=message.message_id,
        generation=message.generation,
        txn=message.txn,
        deliver_at_ms=message.deliver_at_ms,
        producer_sub=message.producer_sub,
        encrypted=message.encrypted,
        capability=capability,
    )
