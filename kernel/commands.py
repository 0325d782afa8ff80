"""Client commands: schedule (an upsert), reschedule (timing only) and cancel.

Theory of operation: a command is validated field by field, then its verdict comes from the
lifecycle table (`kernel.rules`) given the message's current status. A command that wins
before Publish Admission supersedes or ends the pending generation and revokes any local
claim on it; after Admission it answers too_late with the attempt that crossed, because the
log cannot pretend that no destination action happened.
"""

from __future__ import annotations

from typing import Final

import msgspec

from nereus.kernel.codes import Code
from nereus.kernel.config import KernelConfig
from nereus.kernel.keys import message_id
from nereus.kernel.model import FRESH_GENERATION, Message, Status
from nereus.kernel.native import blake2b_hex
from nereus.kernel.records import Cancel, Reschedule, Schedule
from nereus.kernel.rules import SAME, Rule, rule
from nereus.kernel.step import Step
from nereus.kernel.timing import validate_timing
from nereus.kernel.validation import (
    action_at,
    check_capability,
    check_headers,
    check_identity,
    check_payload,
    check_txn,
    resolve_timing,
)

# Enum members the hot paths compare against, as module globals: an Enum class attribute
# goes through EnumType.__getattr__'s slot on Python 3.11 (~0.1 us a lookup, four times a
# global's), and the reducer makes several such lookups per entry.
_UNCHANGED: Final = Code.UNCHANGED
_TOO_LATE: Final = Code.TOO_LATE
_ABSENT: Final = Code.ABSENT
_TXN_REUSED: Final = Code.TXN_REUSED
_SCHEDULED: Final = Status.SCHEDULED


def request_digest(kind: bytes, record: Schedule | Reschedule) -> str:
    """What "an identical retry" compares: the request as sent (relative times stay
    relative), minus its precondition."""
    # Without a precondition the record is already its own body (the same encoding).
    body = (
        record
        if record.expected_version is None
        else msgspec.structs.replace(record, expected_version=None)
    )
    return blake2b_hex(kind + msgspec.msgpack.encode(body), 16, b"")


def _accepts_commands(shard_status: str) -> bool:
    return shard_status != "FROZEN"


def _verdict_for(op: str, current: Message | None, condition: str) -> Rule:
    # The member itself: a StrEnum hashes and compares as its value, so it finds the same
    # row as str(status) without the call to Enum.__str__.
    return rule(op, "ABSENT" if current is None else current.status, condition)


def _condition(current: Message | None, identical: bool | None, txn: str | None = None) -> str:
    """The table condition of a reschedule (identical given) or cancel (None)."""
    if current is not None and current.status is Status.DEAD_LETTERED:
        if current.evidence is not None:
            return "published"
        return "behind_unknown" if current.open_attempts else "alone"
    if identical is None:
        return "-"
    return _change(current, identical, txn)


def _change(current: Message | None, identical: bool, txn: str | None) -> str:
    if identical:
        return "identical"
    return "reused_txn" if current is not None and current.txn == txn else "changed"


def _check_version(step: Step, expected: int | None, current: Message | None) -> bool:
    if expected is not None and expected != (current.version if current else 0):
        step.rejected(Code.VERSION_MISMATCH, current)
        return False
    return True


def _too_late(step: Step, current: Message, txn: str | None = None) -> None:
    step.rejected(
        _TOO_LATE,
        current,
        txn=txn,
        attempt_id=current.delivered_attempt_id or current.last_attempt_id,
        evidence=current.evidence,
    )


def timing_of(bp_ms: int, r: Schedule | Reschedule, config: KernelConfig) -> tuple[int, int] | Code:
    """The absolute (deliverAt, expireAt) of a command persisted at `bp_ms`, or the code
    of the first timing rule it breaks. Only the command and its persistence time go in:
    `storage.scheduled` runs the same check before its compiled fold."""
    timing = resolve_timing(
        bp_ms,
        deliver_at_ms=r.deliver_at_ms,
        delay_ms=r.delay_ms,
        expire_at_ms=r.expire_at_ms,
        lifetime_ms=r.lifetime_ms,
        config=config,
    )
    if isinstance(timing, Code):
        return timing
    return validate_timing(bp_ms, timing[0], timing[1], config.limits) or timing


def _timing(step: Step, r: Schedule | Reschedule) -> tuple[int, int] | None:
    """`timing_of` at the entry's persistence time; None after recording the rejection."""
    timing = timing_of(step.bp_ms, r, step.config)
    if isinstance(timing, Code):
        step.rejected(timing)
        return None
    return timing


def check_command(shard_status: str, r: Schedule | Reschedule, config: KernelConfig) -> Code | None:
    """The checks every timing command starts with, in code-list order."""
    return (
        (None if _accepts_commands(shard_status) else Code.SHARD_NOT_ACTIVE)
        or check_identity(r.tenant, r.queue, r.timer_key, config)
        or check_txn(r.txn, config)
    )


def check_schedule(shard_status: str, r: Schedule, config: KernelConfig) -> Code | None:
    """The checks of a schedule that need only the command and the shard's state, in
    code-list order (the compiled fold runs them too: `storage.scheduled`)."""
    return (
        check_command(shard_status, r, config)
        or check_payload(r.payload_digest, r.payload_size, config)
        or check_headers(r.headers, config)
        or check_capability(r.capability, config)
    )


def schedule(step: Step, r: Schedule) -> None:
    code = check_schedule(step.shard_status, r, step.config)
    if code is not None:
        return step.rejected(code)
    mid = message_id(r.tenant, r.queue, r.timer_key)
    current = step.message(mid)
    digest = request_digest(b"schedule", r)
    identical = current is not None and current.request_digest == digest
    verdict = _verdict_for("schedule", current, _change(current, identical, r.txn))
    # An identical retry is answered before anything that depends on when it arrived (its
    # timing against a later persistence time) or on what the first try did (the version).
    if verdict.code is _UNCHANGED:
        return step.applied(_UNCHANGED, current)
    timing = _timing(step, r)
    if timing is None:
        return None
    deliver_at_ms, expire_at_ms = timing
    if not _check_version(step, r.expected_version, current):
        return None
    if verdict.code is _TOO_LATE:
        assert current is not None
        return _too_late(step, current, r.txn)
    if verdict.code is _TXN_REUSED:
        return step.rejected(_TXN_REUSED, current, txn=r.txn)
    if (
        current is not None
        and current.status is _SCHEDULED
        and (current.destination != r.destination or current.capability != r.capability)
    ):
        return step.rejected(Code.DESTINATION_CHANGED, current)

    message = Message(
        message_id=mid,
        tenant=r.tenant,
        queue=r.queue,
        timer_key=r.timer_key,
        generation=(current.generation + 1) if current else 1,
        version=(current.version + 1) if current else 1,
        status=_SCHEDULED,
        txn=r.txn,
        payload_digest=r.payload_digest,
        payload_size=r.payload_size,
        partition_key=r.partition_key,
        headers=r.headers,
        destination=r.destination,
        capability=r.capability,
        producer_sub=r.producer_sub,
        encrypted=r.encrypted,
        deliver_at_ms=deliver_at_ms,
        expire_at_ms=expire_at_ms,
        action_at_ms=action_at(deliver_at_ms, r.capability),
        has_work=True,
        request_digest=digest,
        **FRESH_GENERATION,
        created_at_ms=step.bp_ms,
        updated_at_ms=step.bp_ms,
        created_position=step.position,
        updated_position=step.position,
    )
    _replace_generation(step, current, message, verdict)


def _replace_generation(
    step: Step, current: Message | None, message: Message, verdict: Rule
) -> None:
    assert verdict.new_generation and verdict.to_status is not SAME
    if current is not None and current.has_work:
        step.remove_timeline(current)
        step.revoke(current, verdict.code)
    step.put_message(current, message)
    step.put_timeline(message, "deliver")
    step.applied(verdict.code, message)


def reschedule(step: Step, r: Reschedule) -> None:
    code = check_command(step.shard_status, r, step.config)
    if code is not None:
        return step.rejected(code)
    current = step.message(message_id(r.tenant, r.queue, r.timer_key))
    digest = request_digest(b"reschedule", r)
    identical = current is not None and current.request_digest == digest
    verdict = _verdict_for("reschedule", current, _condition(current, identical, r.txn))
    if verdict.code is _UNCHANGED:
        return step.applied(_UNCHANGED, current)
    timing = _timing(step, r)
    if timing is None:
        return None
    deliver_at_ms, expire_at_ms = timing
    if not _check_version(step, r.expected_version, current):
        return None
    if verdict.code is _ABSENT:
        return step.rejected(_ABSENT, txn=r.txn)
    assert current is not None
    if verdict.code is _TOO_LATE:
        return _too_late(step, current, r.txn)
    if verdict.code is _TXN_REUSED:
        return step.rejected(_TXN_REUSED, current, txn=r.txn)

    # A rescheduled timer is a new timer under an old name: fresh budget, no last error.
    message = msgspec.structs.replace(
        current,
        generation=current.generation + 1,
        version=current.version + 1,
        txn=r.txn,
        deliver_at_ms=deliver_at_ms,
        expire_at_ms=expire_at_ms,
        action_at_ms=action_at(deliver_at_ms, current.capability),
        has_work=True,
        request_digest=digest,
        **FRESH_GENERATION,
        updated_at_ms=step.bp_ms,
        updated_position=step.position,
    )
    _replace_generation(step, current, message, verdict)


def cancel(step: Step, r: Cancel) -> None:
    code = (
        None if _accepts_commands(step.shard_status) else Code.SHARD_NOT_ACTIVE
    ) or check_identity(r.tenant, r.queue, r.timer_key, step.config)
    if code is not None:
        return step.rejected(code, txn=r.txn)
    current = step.message(message_id(r.tenant, r.queue, r.timer_key))
    if not _check_version(step, r.expected_version, current):
        return None
    verdict = _verdict_for("cancel", current, _condition(current, None))
    if verdict.code is _ABSENT:
        return step.rejected(_ABSENT, txn=r.txn)
    assert current is not None
    if verdict.code is _TOO_LATE:
        return _too_late(step, current, r.txn)
    canceled = msgspec.structs.replace(
        current,
        status=Status.CANCELED,
        has_work=False,
        version=current.version + 1,
        updated_at_ms=step.bp_ms,
        updated_position=step.position,
    )
    step.remove_timeline(current)
    step.revoke(current, Code.CANCELED)
    step.put_message(current, canceled)
    step.applied(Code.CANCELED, canceled, txn=r.txn or current.txn)
