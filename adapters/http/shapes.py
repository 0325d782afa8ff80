"""The JSON shapes of the answers: a command's result, a peek, a list row.

Theory of operation: a result element is the library's `Result` (`service.results`)
in the API's names: exactly one status from the closed list (`service.codes.STATUSES`),
`rejected` for a kernel refusal the edge could not foresee (such as `txn_reused`), the code
from the one list on every element and a human `message` on every refusal. A peek's payload
is bytes in the library and base64 here.
"""

from __future__ import annotations

import base64
from typing import Any

import msgspec

from nereus.kernel.model import Message
from nereus.kernel.records import Evidence
from nereus.service.results import Peek, Result


def result_json(result: Result, kind: str) -> dict[str, Any]:
    """A result element: the library's `Result` in the API's names. `code` is on every
    element (the status itself but for `rejected`); `message` on every one not `ok`."""
    out: dict[str, Any] = {
        "ok": result.ok,
        "status": result.status,
        "code": result.code,
        "queue": result.queue,
        "timerKey": result.timer_key,
        "txn": result.txn,
    }
    if result.message is not None:
        out["message"] = result.message
    if result.message_id is not None and result.status != "absent":
        out["messageId"] = result.message_id
    if kind in ("schedule", "reschedule") and result.ok:
        out["deliverAt"] = result.deliver_at_ms
    if result.status == "too_late":
        out["attemptId"] = result.attempt_id
        if result.evidence is not None:
            out["evidence"] = evidence_json(msgspec.convert(result.evidence, Evidence))
    return out


def evidence_json(ev: Evidence) -> dict[str, Any]:
    """Where the destination has the record. `brokerMessageId` (the destination's own id,
    Pulsar's `ledger:entry:partition:batch`) only where it has one, so every other answer
    is what it was before the field existed."""
    out: dict[str, Any] = {
        "destination": ev.destination,
        "partition": ev.partition,
        "offset": ev.offset,
        "timestamp": ev.timestamp_ms,
    }
    if ev.broker_message_id is not None:
        out["brokerMessageId"] = ev.broker_message_id
    return out


def peek_json(p: Peek) -> dict[str, Any]:
    if not p.found:
        return {"found": False}
    return {
        "found": True,
        "queue": p.queue,
        "timerKey": p.timer_key,
        "status": p.status,
        "partition": p.partition,
        "deliverAt": p.deliver_at_ms,
        "expireAt": p.expire_at_ms,
        "txn": p.txn,
        "messageId": p.message_id,
        "generation": p.generation,
        "payload": base64.b64encode(p.payload).decode() if p.payload is not None else None,
        "encrypted": p.encrypted,
        "producerSub": p.producer_sub,
        "attempts": p.attempts,
        "lastError": p.last_error,
        "claimed": p.claimed,
        "createdAt": p.created_at_ms,
        "updatedAt": p.updated_at_ms,
        "evidence": evidence_json(p.evidence) if p.evidence is not None else None,
    }


def row_json(m: Message) -> dict[str, Any]:
    return {
        "queue": m.queue,
        "timerKey": m.timer_key,
        "status": str(m.status),
        "partition": m.partition_key,
        "deliverAt": m.deliver_at_ms,
        "expireAt": m.expire_at_ms,
        "txn": m.txn,
        "messageId": m.message_id,
        "generation": m.generation,
        "encrypted": m.encrypted,
        "producerSub": m.producer_sub,
        "attempts": m.attempts_admitted,
        "lastError": m.last_error,
        "createdAt": m.created_at_ms,
        "updatedAt": m.updated_at_ms,
        "evidence": evidence_json(m.evidence) if m.evidence is not None else None,
    }
