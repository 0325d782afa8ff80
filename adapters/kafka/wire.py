"""The Kafka shard log's wire format and the rules every process shares.

Theory of operation: a record of the commands topic is an `Envelope` (msgpack): the request
id, the process to reply to, the kernel `Record`, and for a schedule its payload bytes (for
a batch of commands, `COMMANDS_V1`, one per item). A record of the replies topic is a
`Reply`: the request id and the command's `EntryOutcome` (for a batch, every item's, in
item order, the first also as `outcome`).
An identity's shard is its message id (a stable BLAKE2b hash) mod N, so every process sends
a timer's commands to the same partition. Decoders refuse anything else
(`msgspec.DecodeError`), and a record that does not decode gets no shard log position.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import msgspec
from confluent_kafka import KafkaException

from nereus.kernel.effects import EntryOutcome
from nereus.kernel.keys import message_id
from nereus.kernel.records import Cancel, CommandBatch, Payload, Record, Reschedule, Schedule
from nereus.kernel.validation import payload_matches


class Envelope(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The value of every record of the commands topic."""

    request_id: str
    reply_to: str | None
    record: Record
    payload: bytes | tuple[bytes | None, ...] | None = None


# omit_defaults: a reply to a single command is encoded as before batches existed.
class Reply(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """The value of a record of the replies topic (keyed by the process it is for)."""

    request_id: str
    outcome: EntryOutcome
    # A batch's outcomes, one per item in item order (empty for a single command).
    outcomes: tuple[EntryOutcome, ...] = ()

    def answers(self) -> tuple[EntryOutcome, ...]:
        return self.outcomes or (self.outcome,)


_envelope_decoder = msgspec.msgpack.Decoder(Envelope)
_reply_decoder = msgspec.msgpack.Decoder(Reply)
_encoder = msgspec.msgpack.Encoder()


def encode_envelope(envelope: Envelope) -> bytes:
    return _encoder.encode(envelope)


def decode_envelope(data: bytes) -> Envelope:
    return _envelope_decoder.decode(data)


def encode_reply(reply: Reply) -> bytes:
    return _encoder.encode(reply)


def decode_reply(data: bytes) -> Reply:
    return _reply_decoder.decode(data)


def shard_for(tenant: str, queue: str, timer_key: str, shards: int) -> int:
    """The shard (partition) of an identity: its message id (a stable BLAKE2b hash) mod N."""
    return int(message_id(tenant, queue, timer_key)[:16], 16) % shards


def command_shard(record: Record, shards: int) -> int:
    if isinstance(record, CommandBatch) and record.items:
        return command_shard(record.items[0], shards)
    if not isinstance(record, Schedule | Reschedule | Cancel):
        raise TypeError(f"{type(record).__name__} is not a client command")
    return shard_for(record.tenant, record.queue, record.timer_key, shards)


def checked_payloads(record: Record, payload: object) -> tuple[Payload, bool]:
    """The payload bytes an envelope's record may store, and whether any bytes were
    dropped: a schedule's bytes if they match its digest and size, for a batch each item's
    that match. Dropped bytes leave the schedule without its bytes, as if sent without them
    (the kernel then proves them missing)."""
    if isinstance(record, CommandBatch):
        if not isinstance(payload, tuple) or len(payload) != len(record.items):
            return None, payload is not None
        found = tuple(_checked(item, p) for item, p in zip(record.items, payload, strict=True))
        dropped = any(p is not None and f is None for p, f in zip(payload, found, strict=True))
        return (found if any(f is not None for f in found) else None), dropped
    checked = _checked(record, payload)
    return checked, payload is not None and checked is None


def _checked(record: Record, payload: object) -> bytes | None:
    if isinstance(record, Schedule) and isinstance(payload, bytes):
        return payload if payload_matches(record, payload) else None
    return None


def default_process_id() -> str:
    return f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def watermarks(consumer: Any, tp: Any, timeout_s: float) -> tuple[int, int]:
    """The partition's (low, high) offsets, retried while a new topic's leader settles."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=5, cached=False)
            return int(low), int(high)
        except KafkaException:
            # A new topic's leader may still be settling (NOT_LEADER_FOR_PARTITION, which
            # the client does not mark retriable).
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)
