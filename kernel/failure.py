"""What a failed try does to its message: back off and retry, wait for evidence, or
dead-letter.

Theory of operation: a publish outcome that is not PUBLISHED, or a claim that reports it could
not send, ends in `after_failure`. The lifecycle table decides the message's next status from
the operation and one condition (is the budget spent, is another attempt of the generation
still UNKNOWN); this module computes that condition and the consequences the table leaves to
code: the backoff (never keyed before the generation's first action time, nor after expireAt
for a SCHEDULED retry), the bounded retries of an UNCERTAIN message, and, once the budget is
spent, the dead-letter copy the generation owes from this very step.
"""

from __future__ import annotations

from typing import Final

import msgspec

from nereus.kernel.effects import DeadLetter
from nereus.kernel.model import DeadLetterPending, Message, Status
from nereus.kernel.rules import new_status, rule
from nereus.kernel.step import Step
from nereus.kernel.validation import action_at

# Enum members as module globals: an Enum class attribute lookup is several times slower.
_SCHEDULED: Final = Status.SCHEDULED
_UNCERTAIN: Final = Status.UNCERTAIN
_DEAD_LETTERED: Final = Status.DEAD_LETTERED


def after_failure(
    step: Step, before: Message, base: Message, op: str, error: str, *, spends: bool
) -> Message:
    """A try failed (or its fate is unknown): back off and retry, wait for evidence, or
    dead-letter once the budget is spent. Transient failures cost no attempt; every failure
    doubles the next backoff. A retry is never keyed before the generation's first action
    time, whatever the entry's persistence time says."""
    cfg = step.config
    spent = base.attempts_spent + (1 if spends else 0)
    behind_unknown = base.open_attempts > 0
    if op == "outcome_unknown":
        condition = "-"
    elif spent >= cfg.max_attempts:
        condition = "budget_spent"
    elif op in ("outcome_permanent", "claim_result"):
        condition = "budget_left_behind_unknown" if behind_unknown else "budget_left"
    else:
        condition = "behind_unknown" if behind_unknown else "alone"
    verdict = rule(op, before.status, condition)
    status = new_status(verdict.to_status)
    failures = base.failures + 1
    first_action_ms = action_at(base.deliver_at_ms, base.capability)
    retry_at = max(step.bp_ms + cfg.backoff_ms(failures), first_action_ms)
    has_work = False
    action_at_ms = base.action_at_ms
    if status is _SCHEDULED:
        # Keyed no later than expireAt so an expiry is discovered on time.
        has_work, action_at_ms = True, min(retry_at, base.expire_at_ms)
    elif status is _UNCERTAIN and (
        base.uncertain_retries < cfg.max_uncertain_retries and retry_at < base.expire_at_ms
    ):
        has_work, action_at_ms = True, retry_at
    updated = msgspec.structs.replace(
        base,
        status=status,
        attempts_spent=spent,
        failures=failures,
        last_error=error,
        has_work=has_work,
        action_at_ms=action_at_ms,
    )
    if before.has_work:
        step.remove_timeline(before)
    if status is _DEAD_LETTERED:
        _owe_copy(step, updated)
    step.put_message(before, updated)
    if has_work:
        step.put_timeline(updated, "retry")
    return updated


def _owe_copy(step: Step, updated: Message) -> None:
    """The generation just spent its budget: it owes a dead-letter copy of its content as it
    stands now, which holds the payload until the copy is written, and the runtime is told to
    write it."""
    step.put_dead_letter(
        DeadLetterPending(
            message_id=updated.message_id,
            generation=updated.generation,
            attempts_spent=updated.attempts_spent,
            failures=updated.failures,
            last_error=updated.last_error,
            txn=updated.txn,
            payload_digest=updated.payload_digest,
            payload_size=updated.payload_size,
            partition_key=updated.partition_key,
            producer_sub=updated.producer_sub,
            encrypted=updated.encrypted,
            deliver_at_ms=updated.deliver_at_ms,
            dead_lettered_position=step.position,
            dead_lettered_at_ms=step.bp_ms,
        )
    )
    step.effects.append(
        DeadLetter(
            message_id=updated.message_id,
            generation=updated.generation,
            attempts_spent=updated.attempts_spent,
            failures=updated.failures,
            last_error=updated.last_error,
        )
    )
