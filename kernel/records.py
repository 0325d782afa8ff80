"""The shard log's record catalogue.

Theory of operation: one ordered shard log carries both client commands (schedule,
reschedule, cancel) and system mutations (admissions, outcomes, claim results, expiries,
gate and shard-state changes, dead-letter copies written). Each record is a frozen msgspec
Struct tagged with its versioned wire name (`SCHEDULE_V1`, ...); `Record` is the closed union
of all of them, so a decoder either yields one of these types or raises
`msgspec.ValidationError` — there is no "unknown record" value to mishandle. A record never
carries the time it was written: that is the log's job (`LogEntry.persisted_at_ms`), so
replay sees the same time as the live run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import msgspec

from nereus.kernel.timing import TrustedInterval


class _Tagged(msgspec.Struct, frozen=True, tag_field="type", forbid_unknown_fields=True):
    """Base of every log record: frozen, tagged by its versioned name, strict on input."""


class Capability(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What the destination can do about time. `immediate` (Kafka, the local destination)
    makes a record visible when it is sent, so the send waits for deliverAt. A
    `delayed_handoff` target holds the record itself; the send may start `lead_ms` early
    and asks the target to reveal it at deliverAt + `clock_ahead_bound_ms`, so even a target
    whose clock runs ahead by the bound cannot show it before deliverAt."""

    kind: Literal["immediate", "delayed_handoff"] = "immediate"
    lead_ms: int = 0
    clock_ahead_bound_ms: int = 0


IMMEDIATE = Capability()


class Schedule(_Tagged, tag="SCHEDULE_V1", frozen=True):
    """Upsert a timer under (tenant, queue, timer_key). Exactly one of `deliver_at_ms`
    (absolute) and `delay_ms` (relative to the entry's persistence time) is given; at most
    one of `expire_at_ms` and `lifetime_ms` (relative to persistence time)."""

    tenant: str
    queue: str
    timer_key: str
    txn: str
    payload_digest: str
    payload_size: int
    deliver_at_ms: int | None = None
    delay_ms: int | None = None
    expire_at_ms: int | None = None
    lifetime_ms: int | None = None
    partition_key: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    destination: str = "default"
    capability: Capability = IMMEDIATE
    expected_version: int | None = None
    producer_sub: str | None = None
    encrypted: bool = False


class Reschedule(_Tagged, tag="RESCHEDULE_V1", frozen=True):
    """New timing for a pending timer: a new generation with the same content and a new txn."""

    tenant: str
    queue: str
    timer_key: str
    txn: str
    deliver_at_ms: int | None = None
    delay_ms: int | None = None
    expire_at_ms: int | None = None
    lifetime_ms: int | None = None
    expected_version: int | None = None


class Cancel(_Tagged, tag="CANCEL_V1", frozen=True):
    tenant: str
    queue: str
    timer_key: str
    expected_version: int | None = None
    txn: str | None = None


class Capacity(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The permits the admitting worker held; `granted` False means it should not have
    proposed the Admission at all."""

    granted: bool
    lane_permits: int = 1
    bytes_reserved: int = 0


class PublishAdmission(_Tagged, tag="PUBLISH_ADMISSION_V1", frozen=True):
    """The point of no return: if it wins, the attempt is PUBLISHING and only then may a
    Producer be called. `message_id`, `generation` and `version` are the claim
    precondition; the interval and capacity are the decisions the worker made."""

    message_id: str
    generation: int
    version: int
    attempt_id: str
    claim_id: str
    owner: str
    descriptor_hash: str
    capability: Capability
    interval: TrustedInterval
    capacity: Capacity
    # The fencing identity of the producer that will send this attempt (Kafka: its
    # transactional.id), or None for a producer that cannot be fenced. Whoever fences that
    # identity and then reads the destination's committed records to their end without
    # finding the attempt has proof that it is absent (`AbsenceProof`).
    fence_id: str | None = None


class Evidence(msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True):
    """Where a destination says the record is: enough to find it again. `destination` is the
    topic, `partition` and `offset` its position (Kafka, the local destination).

    `broker_message_id` (store schema 5, snapshot v5, log export v3) is the destination's own
    id of the record where a partition and an offset do not name it: Pulsar's message id as
    `ledger:entry:partition:batch`, with `partition` Pulsar's partition index (-1 for a
    non-partitioned topic) and `offset` -1. It is left out of the encoding when absent, so an
    evidence without it is encoded byte for byte as before and older logs decode unchanged."""

    destination: str
    partition: int
    offset: int
    timestamp_ms: int
    broker_message_id: str | None = None


class _Result(msgspec.Struct, frozen=True, tag_field="result", forbid_unknown_fields=True):
    """Base of the three outcome classes, tagged by `result`."""


class Published(_Result, tag="PUBLISHED", frozen=True):
    evidence: Evidence


class AbsenceProof(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Why a record that was not found is definitely absent: every producer that could have
    written it was fenced under `fence_id` at `fenced_at_ms` (so nothing it left open can
    ever commit), and afterwards the destination's committed records were read from before
    the attempt's admission to the end they had after the fence (`searched`, a description
    of the partitions and end offsets read) without finding the attempt."""

    fence_id: str
    fenced_at_ms: int
    searched: str = ""


class NotPublished(_Result, tag="NOT_PUBLISHED", frozen=True):
    disposition: Literal["retriable", "permanent", "lane_unavailable"]
    error_code: str
    detail: str = ""
    # Set when absence was proven after the fact (recovery), not reported by the producer
    # that made the attempt: the attempt's fence and what was read after it.
    proof: AbsenceProof | None = None


class Unknown(_Result, tag="UNKNOWN", frozen=True):
    reason: str
    detail: str = ""


PublishResult = Published | NotPublished | Unknown


class PublishOutcome(_Tagged, tag="PUBLISH_OUTCOME_V1", frozen=True):
    attempt_id: str
    message_id: str
    generation: int
    result: PublishResult


class AdmissionItem(msgspec.Struct, frozen=True, forbid_unknown_fields=True, array_like=True):
    """One Admission of a batch: the fields of `PublishAdmission` that differ per attempt."""

    message_id: str
    generation: int
    version: int
    attempt_id: str
    claim_id: str
    descriptor_hash: str
    capability: Capability
    capacity: Capacity


class PublishAdmissions(_Tagged, tag="PUBLISH_ADMISSIONS_V1", frozen=True):
    """The Admissions one worker proposes in one tick, as one record. It means exactly what
    its `items` would mean as consecutive PUBLISH_ADMISSION_V1 records at this entry's
    position and persistence time, each with the batch's `owner`, `interval` and `fence_id`
    (`members` expands it so): the reducer decides per item, and each item gets its own
    outcome, indexed by its place in the batch."""

    owner: str
    interval: TrustedInterval
    items: tuple[AdmissionItem, ...]
    fence_id: str | None = None


class OutcomeItem(msgspec.Struct, frozen=True, forbid_unknown_fields=True, array_like=True):
    """One outcome of a batch: the fields of `PublishOutcome`."""

    attempt_id: str
    message_id: str
    generation: int
    result: PublishResult


class PublishOutcomes(_Tagged, tag="PUBLISH_OUTCOMES_V1", frozen=True):
    """Several publish outcomes as one record: the same as its `items` as consecutive
    PUBLISH_OUTCOME_V1 records at this entry's position (`members`)."""

    items: tuple[OutcomeItem, ...]


class ClaimResult(_Tagged, tag="CLAIM_RESULT_V1", frozen=True):
    """A permanent error proven before any send (payload missing, too large for the target):
    it spends one attempt like a permanent NOT_PUBLISHED, but no attempt was admitted."""

    message_id: str
    generation: int
    version: int
    claim_id: str
    error_code: str
    detail: str = ""


class DeadLetterWritten(_Tagged, tag="DEAD_LETTER_WRITTEN_V1", frozen=True):
    """The dead-letter copy of a DEAD_LETTERED generation is in the destination's
    dead-letter queue, at `evidence`. It closes the copy the reducer recorded as owed when the
    generation was dead-lettered; a copy that is not owed (never dead-lettered, or already
    recorded: copies are written at least once) changes nothing."""

    message_id: str
    generation: int
    evidence: Evidence


class Expire(_Tagged, tag="EXPIRE_V1", frozen=True):
    message_id: str
    generation: int
    version: int
    interval: TrustedInterval


class LaneGate(_Tagged, tag="LANE_GATE_V1", frozen=True):
    tenant: str
    queue: str
    gate: Literal["OPEN", "CLOSED"]
    reason: str = ""


ShardStatus = Literal["ACTIVE_FOR_COMMANDS", "PAUSED", "FROZEN"]


class CommandBatch(_Tagged, tag="COMMANDS_V1", frozen=True):
    """Client commands sent together (one client batch's commands for this shard) as one
    record. It means exactly its `items` as consecutive records at this entry's position and
    persistence time (`members`): each decided in turn, seeing the items before it, each
    with its own outcome, indexed by its place in the batch. Payload bytes travel beside
    the record, one per item, as they do beside a single schedule."""

    items: tuple[Schedule | Reschedule | Cancel, ...]


class ShardState(_Tagged, tag="SHARD_STATE_V1", frozen=True):
    """ACTIVE_FOR_COMMANDS: normal. PAUSED: an operator stopped the fire (Admissions and
    expiries are refused); commands, cancels included, still apply. FROZEN: commands are
    refused too. Outcomes are recorded in every state because they report facts."""

    state: ShardStatus
    reason: str = ""


Record = (
    Schedule
    | Reschedule
    | Cancel
    | PublishAdmission
    | PublishOutcome
    | PublishAdmissions
    | PublishOutcomes
    | ClaimResult
    | Expire
    | LaneGate
    | ShardState
    | DeadLetterWritten
    | CommandBatch
)

Command = Schedule | Reschedule | Cancel
COMMAND_TYPES = (Schedule, Reschedule, Cancel)

# A batch record stands for several records of one kind (`members`).
BatchRecord = PublishAdmissions | PublishOutcomes | CommandBatch
BATCH_TYPES = (PublishAdmissions, PublishOutcomes, CommandBatch)


def members(record: Record) -> tuple[Record, ...]:
    """The records `record` stands for: itself, or the items of a batch expanded into the
    single records they mean (what the reducer folds, one after another)."""
    if isinstance(record, PublishAdmissions):
        owner, interval, fence_id = record.owner, record.interval, record.fence_id
        return tuple(
            PublishAdmission(
                i.message_id,
                i.generation,
                i.version,
                i.attempt_id,
                i.claim_id,
                owner,
                i.descriptor_hash,
                i.capability,
                interval,
                i.capacity,
                fence_id,
            )
            for i in record.items
        )
    if isinstance(record, PublishOutcomes):
        return tuple(
            PublishOutcome(i.attempt_id, i.message_id, i.generation, i.result) for i in record.items
        )
    if isinstance(record, CommandBatch):
        return record.items
    return (record,)


def batched(records: Sequence[Record]) -> Record:
    """One record for several Admissions of one owner, clock reading and fence (or several
    outcomes, or several client commands); a single record stays itself. `ValueError` for
    anything else."""
    if len(records) == 1:
        return records[0]
    commands = [r for r in records if isinstance(r, COMMAND_TYPES)]
    if commands and len(commands) == len(records):
        return CommandBatch(tuple(commands))
    if all(isinstance(r, PublishOutcome) for r in records):
        return PublishOutcomes(
            tuple(
                OutcomeItem(r.attempt_id, r.message_id, r.generation, r.result)
                for r in records
                if isinstance(r, PublishOutcome)
            )
        )
    admissions = [r for r in records if isinstance(r, PublishAdmission)]
    if len(admissions) != len(records) or not admissions:
        raise ValueError("only Admissions, outcomes or commands are batched, each kind alone")
    first = admissions[0]
    if any(
        (a.owner, a.interval, a.fence_id) != (first.owner, first.interval, first.fence_id)
        for a in admissions
    ):
        raise ValueError("a batch of Admissions shares one owner, clock reading and fence")
    return PublishAdmissions(
        first.owner,
        first.interval,
        tuple(
            AdmissionItem(
                a.message_id,
                a.generation,
                a.version,
                a.attempt_id,
                a.claim_id,
                a.descriptor_hash,
                a.capability,
                a.capacity,
            )
            for a in admissions
        ),
        first.fence_id,
    )


class LogEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A record at its place in the shard log. `persisted_at_ms` is the log's own
    persistence time (the broker's LogAppendTime, or the embedded log's clamped clock)."""

    position: int
    persisted_at_ms: int
    record: Record


# What a shard log takes: a record and the payload bytes that travel beside it (the log
# itself holds only their digest): a schedule's bytes (None when they are not here), or, for
# a batch of commands, one such value per item.
Payload = bytes | tuple[bytes | None, ...] | None
Appendable = tuple[Record, Payload]


def record_type(record: Record) -> str:
    """The versioned wire tag of a record, e.g. "SCHEDULE_V1"."""
    return record_type_of(type(record))


def record_type_of(cls: type[Record]) -> str:
    """The versioned wire tag of a record class."""
    tag = cls.__struct_config__.tag
    assert isinstance(tag, str)
    return tag


_json_encoder = msgspec.json.Encoder()
_json_decoder = msgspec.json.Decoder(LogEntry)
_mp_encoder = msgspec.msgpack.Encoder()
_mp_decoder = msgspec.msgpack.Decoder(LogEntry)
_record_mp_decoder = msgspec.msgpack.Decoder(Record)


def encode_entry(entry: LogEntry) -> bytes:
    return _mp_encoder.encode(entry)


def decode_entry(data: bytes) -> LogEntry:
    """Raises msgspec.DecodeError / ValidationError on anything that is not an entry."""
    return _mp_decoder.decode(data)


def encode_record(record: Record) -> bytes:
    return _mp_encoder.encode(record)


def decode_record(data: bytes) -> Record:
    return _record_mp_decoder.decode(data)


def entry_to_json(entry: LogEntry) -> bytes:
    return _json_encoder.encode(entry)


def entry_from_json(data: bytes | str) -> LogEntry:
    return _json_decoder.decode(data)
