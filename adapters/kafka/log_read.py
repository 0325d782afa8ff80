"""Reading the commands partition into shard log entries.

Theory of operation (the decisions are in `specs/kafka.md`): offsets are not dense
(transaction markers take offsets), so an entry's position is the count of committed data
records before it: the next position after the store's applied one, for each record read in
order. Its `persisted_at_ms` is the record's broker timestamp, which must be LogAppendTime
(the broker's persistence time is the only time the shard log may carry; anything else stops
the shard). A record this owner wrote is taken from memory (`LogWriter.take_written`), any
other is decoded; a record that is not an envelope gets no position, and every owner skips
it the same way. A schedule's payload bytes are kept only where they match its digest and
size (`wire.checked_payloads`), so the fold need not hash them again.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

from nereus.adapters.kafka.log_writer import LogWriter
from nereus.adapters.kafka.wire import Envelope, checked_payloads, decode_envelope
from nereus.kernel.records import LogEntry, Payload
from nereus.runtime.log import Logger
from nereus.runtime.metrics import Metrics

# Records this owner wrote and folded without decoding them (`LogWriter.written`).
FROM_MEMORY = "nereus_shard_log_folded_from_memory_total"
UNDECODABLE = "nereus_shard_log_undecodable_total"


class Decoded(NamedTuple):
    """A batch of records as entries, with what the fold and the replies need beside them."""

    entries: list[LogEntry]
    payloads: dict[int, Payload]  # matching payload bytes, by position
    origin: dict[int, Envelope]  # each entry's envelope, by position


def decode_records(
    batch: list[Any],
    applied_position: int,
    *,
    config: Any,  # a KafkaLogConfig
    writer: LogWriter,
    metrics: Metrics,
    log: Logger,
) -> Decoded:
    """The records of `batch` (consumer messages, in offset order) as entries at the
    positions after `applied_position`. See the module docstring."""
    c = config
    decoded = Decoded([], {}, {})
    position = applied_position
    for m in batch:
        ts_type, ts = m.timestamp()
        if ts_type != TIMESTAMP_LOG_APPEND_TIME:
            raise RuntimeError(
                f"{c.topic}[{c.partition}] offset {m.offset()} has no LogAppendTime "
                "timestamp: the broker's persistence time is the only time the shard "
                "log may carry (message.timestamp.type=LogAppendTime)"
            )
        # A record this owner wrote is folded from memory; any other is decoded.
        envelope = writer.take_written(m.offset())
        if envelope is not None:
            metrics.inc(FROM_MEMORY)
        try:
            if envelope is None:
                envelope = decode_envelope(m.value() or b"")
        except msgspec.DecodeError as exc:
            metrics.inc(UNDECODABLE)
            log.warning("shard_log_record_skipped", offset=m.offset(), error=str(exc)[:200])
            continue
        position += 1
        decoded.entries.append(LogEntry(position, ts, envelope.record))
        decoded.origin[position] = envelope
        if envelope.payload is not None:
            checked, dropped = checked_payloads(envelope.record, envelope.payload)
            if checked is not None:
                decoded.payloads[position] = checked
            if dropped:
                log.warning("payload_mismatch", position=position, offset=m.offset())
    return decoded
