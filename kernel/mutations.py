"""System mutations: Publish Admission, publish outcomes, claim results, expiry, gates.

Theory of operation: workers propose these records from what they saw, but the log decides.
When a mutation is applied, only source-replayable facts count: the message's generation,
version and status as of this position, the lane gate, and the entry's own persistence time
`bp`. A worker's wall clock never rewrites history. An Admission that still matches becomes
a PUBLISHING attempt and an open obligation, and only then is a Publish effect emitted; one
that no longer matches gets a deterministic stale verdict, revokes its claim, and publishes
nothing. Outcomes resolve attempts; UNKNOWN stays an obligation until positive evidence.
"""

from __future__ import annotations

import msgspec

from kernel.codes import Code
from kernel.effects import DeadLetter, Publish, RevokeClaim
from kernel.keys import attempt_prefix, lane_id, str_key
from kernel.model import Attempt, AttemptStatus, Lane, Message, Obligation, Status, Table
from kernel.records import (
    ClaimResult,
    Expire,
    LaneGate,
    NotPublished,
    PublishAdmission,
    Published,
    PublishOutcome,
    ShardState,
    Unknown,
)
from kernel.rules import SAME, attempt_rule, rule
from kernel.step import Step
from kernel.timing import Decision, decide
from kernel.validation import check_identity, visible_at


def _status(message: Message | None) -> str:
    return "ABSENT" if message is None else str(message.status)


def _matches(message: Message | None, generation: int, version: int) -> bool:
    return message is not None and message.generation == generation and message.version == version


def _lane_closed(step: Step, message: Message) -> bool:
    lane = step.get(Table.LANES, str_key(lane_id(message.tenant, message.queue)))
    return isinstance(lane, Lane) and lane.gate == "CLOSED"


def admission(step: Step, r: PublishAdmission) -> None:
    # The duplicate check comes first: an enqueue retry of an Admission that already won
    # must not revoke the live claim that is sending it.
    if step.attempt(r.attempt_id) is not None:
        return step.rejected(Code.ADMISSION_DUPLICATE_ATTEMPT, attempt_id=r.attempt_id)
    message = step.message(r.message_id)
    code: Code | None = None
    if step.shard_status != "ACTIVE_FOR_COMMANDS":
        code = Code.SHARD_NOT_ACTIVE
    elif not r.attempt_id.startswith(attempt_prefix(r.message_id, r.generation)):
        code = Code.ADMISSION_BAD_ATTEMPT_ID
    elif not _matches(message, r.generation, r.version):
        code = Code.ADMISSION_STALE
    else:
        assert message is not None
        verdict = rule("admission", _status(message), "-")
        if verdict.code is not Code.ADMITTED:
            code = verdict.code
        elif _lane_closed(step, message):
            code = Code.ADMISSION_LANE_CLOSED
        elif r.capability != message.capability:
            code = Code.ADMISSION_CAPABILITY_MISMATCH
        elif (
            decide(r.interval, message.action_at_ms, message.expire_at_ms) is not Decision.ADMIT
            or not r.capacity.granted
        ):
            code = Code.ADMISSION_EVIDENCE_INVALID
        elif step.bp_ms < message.action_at_ms:
            code = Code.ADMISSION_BEFORE_ACTION_TIME
        elif step.bp_ms >= message.expire_at_ms:
            code = Code.ADMISSION_AFTER_EXPIRE
    if code is not None:
        step.effects.append(RevokeClaim(r.message_id, r.generation, code, r.claim_id))
        return step.rejected(code, message, attempt_id=r.attempt_id)
    assert message is not None

    attempt = Attempt(
        attempt_id=r.attempt_id,
        message_id=message.message_id,
        generation=message.generation,
        status=AttemptStatus.PUBLISHING,
        destination=message.destination,
        descriptor_hash=r.descriptor_hash,
        claim_id=r.claim_id,
        owner=r.owner,
        admitted_position=step.position,
        admitted_at_ms=step.bp_ms,
    )
    step.put_attempt(None, attempt)
    step.put(
        Table.OBLIGATIONS,
        str_key(r.attempt_id),
        Obligation(
            message_id=message.message_id,
            generation=message.generation,
            destination=message.destination,
            admitted_position=step.position,
            admitted_at_ms=step.bp_ms,
        ),
    )
    admitted = msgspec.structs.replace(
        message,
        status=Status.PUBLISHING,
        version=message.version + 1,
        last_attempt_id=r.attempt_id,
        updated_at_ms=step.bp_ms,
        updated_position=step.position,
    )
    step.remove_timeline(message)
    step.put_message(message, admitted)
    step.applied(Code.ADMITTED, admitted, attempt_id=r.attempt_id)
    step.effects.append(
        Publish(
            position=step.position,
            attempt_id=r.attempt_id,
            message_id=message.message_id,
            generation=message.generation,
            claim_id=r.claim_id,
            descriptor_hash=r.descriptor_hash,
            destination=message.destination,
            deliver_at_ms=message.deliver_at_ms,
            visible_at_ms=visible_at(message.deliver_at_ms, message.capability),
        )
    )


def outcome(step: Step, r: PublishOutcome) -> None:
    attempt = step.attempt(r.attempt_id)
    if attempt is None:
        return step.rejected(Code.OUTCOME_UNKNOWN_ATTEMPT, attempt_id=r.attempt_id)
    if attempt.message_id != r.message_id or attempt.generation != r.generation:
        return step.rejected(Code.OUTCOME_MISMATCH, attempt_id=r.attempt_id)
    result = r.result
    result_name = type(result).__struct_config__.tag
    assert isinstance(result_name, str)
    arule = attempt_rule(str(attempt.status), result_name)
    message = step.message(attempt.message_id)
    if arule.to_status == SAME:
        return step.rejected(arule.code, message, attempt_id=r.attempt_id)
    # An attempt that is still open always belongs to the message's current generation:
    # nothing supersedes a generation after its Admission.
    assert message is not None and message.generation == attempt.generation, (
        f"open attempt {attempt.attempt_id} detached from its message"
    )

    resolved = msgspec.structs.replace(
        attempt,
        status=AttemptStatus(arule.to_status),
        resolved_position=step.position,
        resolved_at_ms=step.bp_ms,
    )
    match result:
        case Published(evidence=evidence):
            resolved = msgspec.structs.replace(resolved, evidence=evidence, error_code=None)
            verdict = rule("outcome_published", _status(message), "-")
            updated = msgspec.structs.replace(
                _touch(step, message), status=Status(verdict.to_status), evidence=evidence
            )
        case NotPublished(disposition=disposition, error_code=error_code):
            resolved = msgspec.structs.replace(
                resolved, disposition=disposition, error_code=error_code
            )
            updated = _failed(
                step,
                message,
                f"outcome_{disposition}",
                error_code,
                spends=disposition == "permanent",
            )
        case Unknown(reason=reason):
            resolved = msgspec.structs.replace(
                resolved, error_code=reason, resolved_position=None, resolved_at_ms=None
            )
            verdict = rule("outcome_unknown", _status(message), "-")
            updated = msgspec.structs.replace(
                _touch(step, message),
                status=Status(verdict.to_status),
                last_error=f"unknown: {reason}",
            )
    step.put_attempt(attempt, resolved)
    if resolved.status not in (AttemptStatus.PUBLISHING, AttemptStatus.UNKNOWN):
        step.delete(Table.OBLIGATIONS, str_key(attempt.attempt_id))
    _settle(step, message, updated)
    step.applied(
        Code.OUTCOME_RECORDED, updated, attempt_id=r.attempt_id, evidence=resolved.evidence
    )


def _touch(step: Step, message: Message) -> Message:
    return msgspec.structs.replace(
        message,
        version=message.version + 1,
        updated_at_ms=step.bp_ms,
        updated_position=step.position,
    )


def _failed(step: Step, message: Message, op: str, error: str, *, spends: bool) -> Message:
    """A failed try: back off and retry, or dead-letter once the budget is spent. Transient
    failures cost no attempt; each failure still doubles the next backoff."""
    spent = message.attempts_spent + (1 if spends else 0)
    condition = "budget_spent" if spent >= step.config.max_attempts else "budget_left"
    verdict = rule(op, _status(message), condition)
    failures = message.failures + 1
    retry_at = min(step.bp_ms + step.config.backoff_ms(failures), message.expire_at_ms)
    return msgspec.structs.replace(
        _touch(step, message),
        status=Status(verdict.to_status),
        attempts_spent=spent,
        failures=failures,
        last_error=error,
        # Retry work is keyed no later than expireAt so expiry is discovered on time.
        action_at_ms=retry_at if verdict.to_status == Status.SCHEDULED else message.action_at_ms,
    )


def _settle(step: Step, before: Message, after: Message) -> None:
    """Store `after` and emit what its new status implies for the timeline and the DLQ."""
    step.put_message(before, after)
    if after.status is Status.SCHEDULED:
        step.put_timeline(after, "retry")
    elif after.status is Status.DEAD_LETTERED:
        step.effects.append(
            DeadLetter(
                message_id=after.message_id,
                generation=after.generation,
                attempts_spent=after.attempts_spent,
                failures=after.failures,
                last_error=after.last_error,
            )
        )


def claim_result(step: Step, r: ClaimResult) -> None:
    message = step.message(r.message_id)
    if not _matches(message, r.generation, r.version):
        return step.rejected(Code.CLAIM_RESULT_STALE, message)
    assert message is not None
    if rule("claim_result", _status(message), "budget_left").code is Code.CLAIM_RESULT_STALE:
        return step.rejected(Code.CLAIM_RESULT_STALE, message)
    updated = _failed(step, message, "claim_result", r.error_code, spends=True)
    step.remove_timeline(message)
    step.revoke(message, Code.CLAIM_RESULT_RECORDED, r.claim_id)
    _settle(step, message, updated)
    step.applied(Code.CLAIM_RESULT_RECORDED, updated)


def expire(step: Step, r: Expire) -> None:
    message = step.message(r.message_id)
    code: Code | None = None
    if step.shard_status != "ACTIVE_FOR_COMMANDS":
        code = Code.SHARD_NOT_ACTIVE
    elif not _matches(message, r.generation, r.version):
        code = Code.EXPIRE_STALE
    else:
        assert message is not None
        verdict = rule("expire", _status(message), "-")
        if verdict.code is not Code.EXPIRED:
            code = verdict.code
        elif r.interval.earliest_ms < message.expire_at_ms:
            code = Code.EXPIRE_EVIDENCE_INVALID
        elif step.bp_ms < message.expire_at_ms:
            code = Code.EXPIRE_PREMATURE
    if code is not None:
        return step.rejected(code, message)
    assert message is not None
    expired = msgspec.structs.replace(_touch(step, message), status=Status.EXPIRED)
    step.remove_timeline(message)
    step.revoke(message, Code.EXPIRED)
    step.put_message(message, expired)
    step.applied(Code.EXPIRED, expired)


def lane_gate(step: Step, r: LaneGate) -> None:
    if check_identity(r.tenant, r.queue, "-", step.config) is not None:
        return step.rejected(Code.INVALID_IDENTITY)
    key = str_key(lane_id(r.tenant, r.queue))
    step.put(Table.LANES, key, Lane(r.tenant, r.queue, r.gate, step.position))
    step.applied(Code.GATE_CHANGED)


def shard_state(step: Step, r: ShardState) -> None:
    step.shard_status = r.state
    step.applied(Code.SHARD_STATE_CHANGED)
