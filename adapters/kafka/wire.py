"""The Kafka shard log's wire format and the rules every process shares.

Theory of operation: a record of the commands topic is an `Envelope` (msgpack): the request
id, the process to reply to, the kernel `Record`, and for a schedule its payload bytes. A
record of the replies topic is a `Reply`: the request id and the command's `EntryOutcome`.
An identity's shard is its message id (a stable BLAKE2b hash) mod N, so every process sends
a timer's commands to the same partition. Decoders refuse anything else
(`msgspec.DecodeError`), and a record that does not decode gets no shard log position.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from typing import Any

import msgspec
from confluent_kafka import KafkaException

from nereus.kernel.effects import EntryOutcome
from nereus.kernel.keys import message_id
from nereus.kernel.records import Cancel, Record, Reschedule, Schedule


class Envelope(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The value of every record of the commands topic."""

    request_id: str
    reply_to: str | None
    record: Record
    payload: bytes | None = None


class Reply(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The value of a record of the replies topic (keyed by the process it is for)."""

    request_id: str
    outcome: EntryOutcome


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
    if not isinstance(record, Schedule | Reschedule | Cancel):
        raise TypeError(f"{type(record).__name__} is not a client command")
    return shard_for(record.tenant, record.queue, record.timer_key, shards)


def payload_matches(record: Schedule, payload: bytes) -> bool:
    return (
        len(payload) == record.payload_size
        and hashlib.sha256(payload).hexdigest() == record.payload_digest
    )


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
