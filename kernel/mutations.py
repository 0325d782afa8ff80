"""System mutations: Publish Admission, publish outcomes, claim results, expiry, gates, and
dead-letter copies written.

Theory of operation: workers propose these records from what they saw, but the log decides.
When a mutation is applied, only source-replayable facts count: the message's generation,
version and status as of this position, the lane gate, and the entry's own persistence time
`bp`. A worker's wall clock never rewrites history. An Admission that still matches becomes
a PUBLISHING attempt and an open obligation, and only then is a Publish effect emitted; one
that no longer matches gets a deterministic stale verdict, revokes its claim, and publishes
nothing. Outcomes resolve attempts; an UNKNOWN attempt stays an obligation until positive
evidence, and its message becomes UNCERTAIN. An UNCERTAIN message may be retried a bounded
number of times (the retry may duplicate the unknown attempt; that is recorded, not hidden).
A generation that spends its budget is DEAD_LETTERED and, in the same step, owes a
dead-letter copy (a dead_letters row); the runtime writes it and DEAD_LETTER_WRITTEN_V1
closes it with its evidence, so a crash between the two is recovered from the state. What a
failed try does to its message (backoff, retry, dead-lettering) is `kernel/failure.py`.
"""

from __future__ import annotations

from typing import Final

import msgspec

from nereus.kernel.codes import Code
from nereus.kernel.effects import Publish, RevokeClaim
from nereus.kernel.failure import after_failure
from nereus.kernel.keys import attempt_prefix, lane_id, str_key
from nereus.kernel.model import (
    Attempt,
    AttemptStatus,
    Lane,
    Message,
    Obligation,
    Status,
    Table,
    UnsupportedRow,
)
from nereus.kernel.records import (
    ClaimResult,
    DeadLetterWritten,
    Expire,
    LaneGate,
    NotPublished,
    PublishAdmission,
    Published,
    PublishOutcome,
    PublishResult,
    ShardState,
    Unknown,
)
from nereus.kernel.rules import OLD_GENERATION, SAME, attempt_rule, new_status, rule
from nereus.kernel.step import Step
from nereus.kernel.timing import Decision, decide
from nereus.kernel.validation import check_identity, visible_at

# Enum members the hot paths compare against, as module globals: an Enum class attribute
# goes through EnumType.__getattr__'s slot on Python 3.11 (~0.1 us a lookup, four times a
# global's), and the reducer makes several such lookups per entry.
_PUBLISHING: Final = Status.PUBLISHING
_UNCERTAIN: Final = Status.UNCERTAIN
_ADMITTED: Final = Code.ADMITTED
_OUTCOME_RECORDED: Final = Code.OUTCOME_RECORDED
_OBLIGATIONS: Final = Table.OBLIGATIONS
_LANES: Final = Table.LANES
_ADMIT: Final = Decision.ADMIT
_ATTEMPT_PUBLISHING: Final = AttemptStatus.PUBLISHING
_ATTEMPT_PUBLISHED: Final = AttemptStatus.PUBLISHED
_ATTEMPT_NOT_PUBLISHED: Final = AttemptStatus.NOT_PUBLISHED


def _status(message: Message | None) -> str:
    # The member itself: a StrEnum hashes and compares as its value, so it finds the same
    # lifecycle row as str(status) without the call to Enum.__str__.
    return "ABSENT" if message is None else message.status


# AttemptStatus by value: a dict lookup, where AttemptStatus(value) is a slow enum call.
_ATTEMPT_STATUS: dict[str, AttemptStatus] = {s.value: s for s in AttemptStatus}


def _armed(message: Message) -> str:
    return "armed" if message.has_work else "unarmed"


def _matches(message: Message | None, generation: int, version: int) -> bool:
    return message is not None and message.generation == generation and message.version == version


def _lane_closed(step: Step, message: Message) -> bool:
    lane = step.get(_LANES, str_key(lane_id(message.tenant, message.queue)))
    return isinstance(lane, Lane) and lane.gate == "CLOSED"


def _admission_refusal(step: Step, r: PublishAdmission, message: Message | None) -> Code | None:
    """Why an Admission (not a duplicate) is refused, checked in the order of `kernel/codes`;
    None when it qualifies."""
    code: Code | None = None
    if step.shard_status != "ACTIVE_FOR_COMMANDS":
        code = Code.SHARD_NOT_ACTIVE
    elif not r.attempt_id.startswith(attempt_prefix(r.message_id, r.generation)):
        code = Code.ADMISSION_BAD_ATTEMPT_ID
    elif not _matches(message, r.generation, r.version):
        code = Code.ADMISSION_STALE
    else:
        assert message is not None
        verdict = rule("admission", _status(message), _armed(message))
        if verdict.code is not _ADMITTED:
            code = verdict.code
        elif _lane_closed(step, message):
            code = Code.ADMISSION_LANE_CLOSED
        elif r.capability != message.capability:
            code = Code.ADMISSION_CAPABILITY_MISMATCH
        elif (
            decide(r.interval, message.action_at_ms, message.expire_at_ms) is not _ADMIT
            or not r.capacity.granted
        ):
            code = Code.ADMISSION_EVIDENCE_INVALID
        elif step.bp_ms < message.action_at_ms:
            code = Code.ADMISSION_BEFORE_ACTION_TIME
        elif step.bp_ms >= message.expire_at_ms:
            code = Code.ADMISSION_AFTER_EXPIRE
    return code


def admission(step: Step, r: PublishAdmission) -> None:
    # The duplicate check comes first: an enqueue retry of an Admission that already won
    # must not revoke the live claim that is sending it.
    if step.attempt(r.attempt_id) is not None:
        return step.rejected(Code.ADMISSION_DUPLICATE_ATTEMPT, attempt_id=r.attempt_id)
    message = step.message(r.message_id)
    code = _admission_refusal(step, r, message)
    if code is not None:
        step.effects.append(RevokeClaim(r.message_id, r.generation, code, r.claim_id))
        return step.rejected(code, message, attempt_id=r.attempt_id)
    assert message is not None

    attempt = Attempt(
        attempt_id=r.attempt_id,
        message_id=message.message_id,
        generation=message.generation,
        status=_ATTEMPT_PUBLISHING,
        destination=message.destination,
        descriptor_hash=r.descriptor_hash,
        claim_id=r.claim_id,
        owner=r.owner,
        admitted_position=step.position,
        admitted_at_ms=step.bp_ms,
        fence_id=r.fence_id,
    )
    step.put_attempt(None, attempt)
    step.put(
        _OBLIGATIONS,
        str_key(r.attempt_id),
        Obligation(
            message_id=message.message_id,
            generation=message.generation,
            destination=message.destination,
            admitted_position=step.position,
            admitted_at_ms=step.bp_ms,
        ),
    )
    step.remove_timeline(message)
    # `_touch` and the admission's fields in one replace (no field is set twice): the same
    # value as replacing twice, for one copy of the 33-field row instead of two.
    admitted = msgspec.structs.replace(
        message,
        version=message.version + 1,
        updated_at_ms=step.bp_ms,
        updated_position=step.position,
        status=_PUBLISHING,
        has_work=False,
        last_attempt_id=r.attempt_id,
        attempts_admitted=message.attempts_admitted + 1,
        open_attempts=message.open_attempts + 1,
        uncertain_retries=message.uncertain_retries + (1 if message.status is _UNCERTAIN else 0),
    )
    step.put_message(message, admitted)
    step.applied(_ADMITTED, admitted, attempt_id=r.attempt_id)
    step.effects.append(
        Publish(
            position=step.position,
            attempt_id=r.attempt_id,
            message_id=message.message_id,
            generation=message.generation,
            claim_id=r.claim_id,
            descriptor_hash=r.descriptor_hash,
            destination=message.destination,
            action_at_ms=message.action_at_ms,
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
    arule = attempt_rule(attempt.status, result_name)  # the member finds the same row
    message = step.message(attempt.message_id)
    assert message is not None, f"attempt {attempt.attempt_id} without its message"
    if arule.to_status == SAME:
        return step.rejected(arule.code, message, attempt_id=r.attempt_id)
    if (
        isinstance(result, NotPublished)
        and result.proof is not None
        and (attempt.fence_id is None or result.proof.fence_id != attempt.fence_id)
    ):
        # Absence found after the fact proves something only about a producer that was
        # fenced; any other producer may still write the record.
        return step.rejected(Code.OUTCOME_PROOF_INVALID, message, attempt_id=r.attempt_id)

    # The attempt's fate is on the record: the claim it was sent under (if its owner still
    # holds it) has done its work, whatever the result and whichever generation.
    step.effects.append(
        RevokeClaim(attempt.message_id, attempt.generation, _OUTCOME_RECORDED, attempt.claim_id)
    )
    resolved, op = _resolve_attempt(step, attempt, result, _ATTEMPT_STATUS[arule.to_status])
    closes = resolved.status in (_ATTEMPT_PUBLISHED, _ATTEMPT_NOT_PUBLISHED)
    if attempt.generation != message.generation:
        verdict = rule(op, OLD_GENERATION, "-")
        if verdict.to_status != SAME:
            # The rows say a superseded generation's outcome is the ledger's alone; a table
            # that says otherwise has no code here to carry it out.
            raise UnsupportedRow(f"rule ({op}, {OLD_GENERATION}) moves the message")
        return step.applied(verdict.code, message, attempt_id=r.attempt_id)
    updated = _message_after_outcome(step, message, attempt, result, op=op, closes=closes)
    step.applied(_OUTCOME_RECORDED, updated, attempt_id=r.attempt_id, evidence=resolved.evidence)


def _resolve_attempt(
    step: Step, attempt: Attempt, result: PublishResult, status: AttemptStatus
) -> tuple[Attempt, str]:
    """The attempt ledger's part of an outcome: the attempt's new row (one replace per
    result kind) and, once it is settled, its obligation closed. Returns the row and the
    operation name the message rules are keyed by."""
    match result:
        case Published(evidence=evidence):
            resolved = msgspec.structs.replace(
                attempt,
                status=status,
                resolved_position=step.position,
                resolved_at_ms=step.bp_ms,
                evidence=evidence,
                error_code=None,
            )
            op = "outcome_published"
        case NotPublished(disposition=disposition, error_code=error_code):
            resolved = msgspec.structs.replace(
                attempt,
                status=status,
                resolved_position=step.position,
                resolved_at_ms=step.bp_ms,
                disposition=disposition,
                error_code=error_code,
            )
            op = f"outcome_{disposition}"
        case Unknown(reason=reason):
            # Still open: no resolution position yet.
            resolved = msgspec.structs.replace(
                attempt,
                status=status,
                error_code=reason,
                resolved_position=None,
                resolved_at_ms=None,
            )
            op = "outcome_unknown"
    step.put_attempt(attempt, resolved)
    if resolved.status in (_ATTEMPT_PUBLISHED, _ATTEMPT_NOT_PUBLISHED):
        step.delete(_OBLIGATIONS, str_key(attempt.attempt_id))
    return resolved, op


def _message_after_outcome(
    step: Step,
    message: Message,
    attempt: Attempt,
    result: PublishResult,
    *,
    op: str,
    closes: bool,
) -> Message:
    """The message's part of an outcome of its current generation."""
    open_attempts = message.open_attempts - (1 if closes else 0)
    if message.status not in (_PUBLISHING, _UNCERTAIN):
        # Delivered or dead-lettered already: the status stays. A dead-lettered message whose
        # unknown attempt is proven published keeps that evidence, so a later cancel can say
        # where it went.
        verdict = rule(op, _status(message), "-")
        if verdict.to_status != SAME:
            raise UnsupportedRow(f"rule ({op}, {message.status}) moves a settled message")
        base = msgspec.structs.replace(_touch(step, message), open_attempts=open_attempts)
        if (
            isinstance(result, Published)
            and message.status is Status.DEAD_LETTERED
            and message.evidence is None
        ):
            base = msgspec.structs.replace(
                base, evidence=result.evidence, delivered_attempt_id=attempt.attempt_id
            )
        step.put_message(message, base)
        return base
    if isinstance(result, Published):
        # Delivered: `_touch`, the open count and the delivery in one replace.
        verdict = rule(op, _status(message), "-")
        updated = msgspec.structs.replace(
            message,
            version=message.version + 1,
            updated_at_ms=step.bp_ms,
            updated_position=step.position,
            open_attempts=open_attempts,
            status=new_status(verdict.to_status),
            evidence=result.evidence,
            delivered_attempt_id=attempt.attempt_id,
            has_work=False,
        )
        if message.has_work:
            step.remove_timeline(message)
        step.put_message(message, updated)
        return updated
    base = msgspec.structs.replace(_touch(step, message), open_attempts=open_attempts)
    if isinstance(result, NotPublished):
        return after_failure(
            step, message, base, op, result.error_code, spends=result.disposition == "permanent"
        )
    return after_failure(step, message, base, op, f"unknown: {result.reason}", spends=False)


def _touch(step: Step, message: Message) -> Message:
    return msgspec.structs.replace(
        message,
        version=message.version + 1,
        updated_at_ms=step.bp_ms,
        updated_position=step.position,
    )


def claim_result(step: Step, r: ClaimResult) -> None:
    message = step.message(r.message_id)
    if not _matches(message, r.generation, r.version):
        return step.rejected(Code.CLAIM_RESULT_STALE, message)
    assert message is not None
    # Only work a claim could have taken: a pending generation, or an armed UNCERTAIN one.
    if not message.has_work:
        condition = "unarmed"
    else:
        condition = "budget_left_behind_unknown" if message.open_attempts else "budget_left"
    if rule("claim_result", _status(message), condition).code is Code.CLAIM_RESULT_STALE:
        return step.rejected(Code.CLAIM_RESULT_STALE, message)
    step.revoke(message, Code.CLAIM_RESULT_RECORDED, r.claim_id)
    updated = after_failure(
        step, message, _touch(step, message), "claim_result", r.error_code, spends=True
    )
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
        verdict = rule("expire", _status(message), _armed(message))
        if verdict.code not in (Code.EXPIRED, Code.RETRY_WINDOW_CLOSED):
            code = verdict.code
        elif r.interval.earliest_ms < message.expire_at_ms:
            code = Code.EXPIRE_EVIDENCE_INVALID
        elif step.bp_ms < message.expire_at_ms:
            code = Code.EXPIRE_PREMATURE
    if code is not None:
        return step.rejected(code, message)
    assert message is not None
    step.remove_timeline(message)
    step.revoke(message, verdict.code)
    status = Status.EXPIRED if verdict.code is Code.EXPIRED else message.status
    updated = msgspec.structs.replace(_touch(step, message), status=status, has_work=False)
    step.put_message(message, updated)
    step.applied(verdict.code, updated)


def dead_letter_written(step: Step, r: DeadLetterWritten) -> None:
    """Recorded in every shard state: it reports a write that already happened."""
    message = step.message(r.message_id)
    pending = step.dead_letter(r.message_id, r.generation)
    if message is None:
        where = "ABSENT"
    elif r.generation < message.generation:
        where = OLD_GENERATION
    else:
        where = _status(message)
    verdict = rule("dead_letter_written", where, "pending" if pending else "not_pending")
    if verdict.code is not Code.DEAD_LETTER_RECORDED:
        assert pending is None, f"a copy of {r.message_id}.{r.generation} owed but refused"
        return step.rejected(verdict.code, message, evidence=r.evidence)
    assert message is not None and pending is not None
    step.close_dead_letter(pending)
    if where == OLD_GENERATION:
        # Superseded before its copy was written: the copy was still owed; the message row
        # belongs to a later generation and is not touched.
        return step.applied(Code.DEAD_LETTER_RECORDED, message, evidence=r.evidence)
    assert message.status is Status.DEAD_LETTERED and message.dead_letter_evidence is None
    updated = msgspec.structs.replace(_touch(step, message), dead_letter_evidence=r.evidence)
    step.put_message(message, updated)
    step.applied(Code.DEAD_LETTER_RECORDED, updated, evidence=r.evidence)


def lane_gate(step: Step, r: LaneGate) -> None:
    if check_identity(r.tenant, r.queue, "-", step.config) is not None:
        return step.rejected(Code.INVALID_IDENTITY)
    key = str_key(lane_id(r.tenant, r.queue))
    step.put(_LANES, key, Lane(r.tenant, r.queue, r.gate, step.position))
    step.applied(Code.GATE_CHANGED)


def shard_state(step: Step, r: ShardState) -> None:
    step.shard_status = r.state
    step.applied(Code.SHARD_STATE_CHANGED)
