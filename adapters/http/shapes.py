"""The JSON shapes of the answers: a command's result, a peek, a list row.

Theory of operation: a result carries exactly one status from `contract.STATUSES`; a kernel
code outside that list (a verdict the edge could not foresee, such as `txn_reused`) is
answered as `rejected` with the kernel's code in `code`, so the status list stays closed.
"""

from __future__ import annotations

from typing import Any

from adapters.embedded import Peek, Result
from adapters.http.contract import STATUSES
from kernel.model import Message


def result_json(result: Result, kind: str) -> dict[str, Any]:
    known = result.status in STATUSES and result.status != "rejected"
    out: dict[str, Any] = {
        "ok": result.ok,
        "status": result.status if known else "rejected",
        "queue": result.queue,
        "timerKey": result.timer_key,
        "txn": result.txn,
    }
    if not known:
        out["code"] = result.status
    if result.message_id is not None and result.status != "absent":
        out["messageId"] = result.message_id
    if kind in ("schedule", "reschedule") and result.ok:
        out["deliverAt"] = result.deliver_at_ms
    if result.status == "too_late":
        out["attemptId"] = result.attempt_id
        if result.evidence is not None:
            ev = result.evidence
            out["evidence"] = {
                "destination": ev["destination"],
                "partition": ev["partition"],
                "offset": ev["offset"],
                "timestamp": ev["timestamp_ms"],
            }
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
        "payload": p.payload,
        "encrypted": p.encrypted,
        "producerSub": p.producer_sub,
        "attempts": p.attempts,
        "lastError": p.last_error,
        "claimed": p.claimed,
        "createdAt": p.created_at_ms,
        "updatedAt": p.updated_at_ms,
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
    }
