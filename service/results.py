"""What the library's calls answer: `Result` for a command, `Peek` for a timer's row,
`Listing` for a page of a queue's timers, and `NereusRefused`, which
`Result.raise_for_status()` raises for a command that was not `ok`.

A `Result` has the shape of an HTTP API result element: `status` from the same closed list
(`service.codes.STATUSES`), `code` from the one list of codes every surface answers
(`service.codes.CODES`, documented in `specs/codes.md`), and on every refusal a human
`message`, the text the HTTP API gives for the same refusal.
"""

from __future__ import annotations

from typing import Any

import msgspec

from nereus.kernel.config import KernelConfig
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.model import Message
from nereus.kernel.records import Evidence
from nereus.service.codes import NAMES_PYTHON, OK_CODES, explain, status_of


class NereusRefused(Exception):
    """A command was not `ok`: `code` is its code (e.g. "payload_too_large", "too_late",
    "absent"), `message` says why, and `result` is the whole answer (a `too_late` one names
    the attempt that crossed Admission and, once known, its evidence)."""

    def __init__(self, result: Result) -> None:
        super().__init__(f"{result.code}: {result.message}")
        self.code = result.code
        self.message = result.message or result.code
        self.result = result


class Result(msgspec.Struct, frozen=True):
    """The answer to one command, after it is durable (or, for a refusal, once refused).

    `ok` is True for `scheduled`, `rescheduled`, `unchanged` and `canceled`. `status` is
    one of those, `too_late`, `absent`, or `rejected` for a refusal by one of the rules;
    `code` is the precise code (the status itself, except for `rejected`: e.g.
    "payload_too_large", "horizon_exceeded", "txn_reused"). `message` is set on every
    answer that is not `ok`: "1125000 bytes > ceiling 1048576"."""

    ok: bool
    status: str
    code: str
    queue: str
    timer_key: str
    txn: str | None
    message_id: str | None
    deliver_at_ms: int | None
    attempt_id: str | None = None
    evidence: dict[str, Any] | None = None
    message: str | None = None

    def raise_for_status(self) -> Result:
        """This result if it is `ok`, else raise `NereusRefused` with its code and message:
        `nereus.schedule(...).raise_for_status()`."""
        if not self.ok:
            raise NereusRefused(self)
        return self


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
    payload: bytes | None = None  # as stored (never decrypted); None in a Listing
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


def to_result(
    outcome: EntryOutcome,
    record: Any,
    config: KernelConfig,
    names: dict[str, str] = NAMES_PYTHON,
) -> Result:
    """The answer to the command `record` (a Schedule, Reschedule or Cancel), from its
    outcome; the message of a refusal calls the command's fields by `names`."""
    evidence = msgspec.to_builtins(outcome.evidence) if outcome.evidence else None
    code = str(outcome.code)
    return Result(
        ok=outcome.code in OK_CODES,
        status=status_of(code),
        code=code,
        queue=record.queue,
        timer_key=record.timer_key,
        txn=outcome.txn,
        message_id=outcome.message_id,
        deliver_at_ms=outcome.deliver_at_ms,
        attempt_id=outcome.attempt_id,
        evidence=evidence,
        message=explain(outcome, record, config, names),
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
        payload=payload,
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
