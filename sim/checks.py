"""Checks made while the simulation runs: at every send, and after every step.

The end-of-run audit (which needs the whole log) is `sim.audit`.
"""

from __future__ import annotations

from collections import Counter

from nereus.kernel.codes import Code
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.invariants import check as invariant_violations
from nereus.kernel.keys import dead_letter_key, str_key
from nereus.kernel.model import Attempt, AttemptStatus, Message, Status, Table
from nereus.kernel.records import Appendable, Reschedule, Schedule
from nereus.runtime.destination import H_TENANT, H_TIMER_KEY, Send, dead_letter_attempt_id
from nereus.runtime.timer_key_header import decode_timer_key
from nereus.storage.base import StoreView
from nereus.storage.store import ShardStore

_NEW_GENERATION = (Code.SCHEDULED, Code.RESCHEDULED)


def send_problem(view: StoreView, send: Send) -> str | None:
    """Why this send must not happen now, judged from a committed read view of the shard
    store taken inside the destination call; None if the attempt is durably PUBLISHING for
    exactly what is being sent (the Admission was committed before the write)."""
    p = send.prepared
    message = view.get(Table.MESSAGES, str_key(p.message_id))
    if not isinstance(message, Message):
        return "no message row"
    named = [v for k, v in p.headers if k == H_TENANT]
    if named != [message.tenant.encode()]:
        return f"the record names tenants {named}, its message is {message.tenant!r}'s"
    keys = [decode_timer_key(v) for k, v in p.headers if k == H_TIMER_KEY]
    if keys != [message.timer_key]:
        return f"the record names timer keys {keys}, its message is {message.timer_key!r}"
    if p.topic.endswith(".dlq"):
        # A copy is written only while the committed state owes it: after the batch that
        # dead-lettered its generation, before DEAD_LETTER_WRITTEN_V1 recorded it.
        if view.get(Table.DEAD_LETTERS, dead_letter_key(p.message_id, p.generation)) is None:
            return f"dead letter of {p.message_id}.{p.generation} not owed ({message.status})"
        if send.attempt_id != dead_letter_attempt_id(p.message_id, p.generation):
            return "dead letter under another attempt id"
        return None
    attempt = view.get(Table.ATTEMPTS, str_key(send.attempt_id))
    if not isinstance(attempt, Attempt):
        return "attempt not durable in the shard store at send time"
    if attempt.status is not AttemptStatus.PUBLISHING:
        return f"attempt is {attempt.status} at send time"
    if (attempt.message_id, attempt.generation) != (p.message_id, p.generation):
        return "attempt belongs to another message or generation"
    if attempt.descriptor_hash != p.descriptor_hash():
        return "descriptor differs from the admitted one"
    if view.get(Table.OBLIGATIONS, str_key(send.attempt_id)) is None:
        return "PUBLISHING attempt without an obligation"
    if message.generation == p.generation and message.status is not Status.PUBLISHING:
        return f"message is {message.status} at send time"
    return None


def step_problems(store: ShardStore) -> list[str]:
    """The kernel invariants over the committed state (they walk every row)."""
    with store.state_view() as state:
        return [f"{v.invariant}: {v.detail}" for v in invariant_violations(state)]


def arrival_problems(
    items: list[Appendable],
    outcomes: list[EntryOutcome],
    submitted_ms: int,
    stats: Counter[str],
) -> list[str]:
    """A relative schedule's deliverAt is never before the clock at its submission plus its
    delay: its persistence time is read after it arrived."""
    problems: list[str] = []
    for (record, _payload), outcome in zip(items, outcomes, strict=True):
        if outcome.code not in _NEW_GENERATION or outcome.deliver_at_ms is None:
            continue
        delay_ms = getattr(record, "delay_ms", None)
        if not isinstance(record, Schedule | Reschedule) or delay_ms is None:
            continue
        stats["reach_deliver_at_after_arrival"] += 1
        early_ms = submitted_ms + delay_ms - outcome.deliver_at_ms
        if early_ms > 0:
            problems.append(
                f"{outcome.message_id}: deliverAt {early_ms} ms before submission + delay"
            )
    return problems
