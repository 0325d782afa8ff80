"""What the library's calls answer: `Result` for a command, `Peek` for a timer's row,
`Listing` for a page of a queue's timers."""

from __future__ import annotations

import base64
from typing import Any

import msgspec

from nereus.kernel.codes import Code
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.model import Message
from nereus.kernel.records import Evidence

OK_CODES = frozenset({Code.SCHEDULED, Code.RESCHEDULED, Code.UNCHANGED, Code.CANCELED})


class Result(msgspec.Struct, frozen=True):
    """The answer to one command, after it is durable. `ok` is False for a command the
    kernel refused (`status` is its code, e.g. "deliver_beyond_horizon") and for the
    verdicts `too_late` and `absent`."""

    ok: bool
    status: str
    queue: str
    timer_key: str
    txn: str | None
    message_id: str | None
    deliver_at_ms: int | None
    attempt_id: str | None = None
    evidence: dict[str, Any] | None = None


class Peek(msgspec.Struct, frozen=True):
    found: bool
    queue: str
    timer_key: str
    status: str | None = None
    partition: str | None = None
    deliver_at_ms: int | None = None
    expire_at_ms: int | None = None
    txn: str | None = None
    message_id: str | None = None
    generation: int | None = None
    version: int | None = None
    payload: str | None = None  # base64, as stored (never decrypted); None in a Listing
    encrypted: bool | None = None
    producer_sub: str | None = None
    attempts: int | None = None
    last_error: str | None = None
    claimed: bool | None = None  # None in a Listing
    created_at_ms: int | None = None
    updated_at_ms: int | None = None
    evidence: Evidence | None = None  # where the destination has it, once DELIVERED


class Listing(msgspec.Struct, frozen=True):
    """One page of a queue's live timers in UTF-8 byte order of their keys, without
    payloads. `next_after` is the cursor for the next page when `truncated`."""

    rows: tuple[Peek, ...]
    truncated: bool
    next_after: str | None


def to_result(outcome: EntryOutcome, queue: str, timer_key: str) -> Result:
    evidence = msgspec.to_builtins(outcome.evidence) if outcome.evidence else None
    return Result(
        ok=outcome.code in OK_CODES,
        status=str(outcome.code),
        queue=queue,
        timer_key=timer_key,
        txn=outcome.txn,
        message_id=outcome.message_id,
        deliver_at_ms=outcome.deliver_at_ms,
        attempt_id=outcome.attempt_id,
        evidence=evidence,
    )


def peek_of(m: Message, payload: bytes | None, claimed: bool | None) -> Peek:
    return Peek(
        found=True,
        queue=m.queue,
        timer_key=m.timer_key,
        status=str(m.status),
        partition=m.partition_key,
        deliver_at_ms=m.deliver_at_ms,
        expire_at_ms=m.expire_at_ms,
        txn=m.txn,
        message_id=m.message_id,
        generation=m.generation,
        version=m.version,
        payload=base64.b64encode(payload).decode() if payload is not None else None,
        encrypted=m.encrypted,
        producer_sub=m.producer_sub,
        attempts=m.attempts_admitted,
        last_error=m.last_error,
        claimed=claimed,
        created_at_ms=m.created_at_ms,
        updated_at_ms=m.updated_at_ms,
        evidence=m.evidence,
    )


def listing_of(rows: list[Peek], truncated: bool) -> Listing:
    return Listing(
        rows=tuple(rows),
        truncated=truncated,
        next_after=rows[-1].timer_key if truncated and rows else None,
    )
