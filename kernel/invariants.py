"""Invariants of a shard state, checked after every step in tests and after every restore.

Theory of operation: the reducer maintains redundant structure (counters, the obligation
index, the timeline, payload reference counts) for speed. Each invariant recomputes one piece
from the primary rows and compares. The ids (INV-nn) are stable and listed in
`specs/invariants.md`. This walks the whole state: it is an audit, not a hot-path check.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from kernel.keys import message_id, parse_timeline_key
from kernel.model import (
    ATTEMPT_COUNTER,
    OPEN_ATTEMPT_STATUSES,
    PAYLOAD_HOLDING,
    STATUS_COUNTER,
    Attempt,
    AttemptStatus,
    Message,
    Obligation,
    PayloadRef,
    Status,
    Table,
    TimelineWork,
)
from kernel.state import State


class Violation(NamedTuple):
    invariant: str
    detail: str


class InvariantViolation(AssertionError):
    def __init__(self, violations: list[Violation]) -> None:
        self.violations = violations
        shown = "; ".join(f"{v.invariant}: {v.detail}" for v in violations[:5])
        more = f" (+{len(violations) - 5} more)" if len(violations) > 5 else ""
        super().__init__(f"shard state violates invariants: {shown}{more}")


INVARIANTS: dict[str, str] = {
    "INV-01": "A message's id is the hash of its (tenant, queue, timer_key) identity.",
    "INV-02": "Every open attempt (PUBLISHING or UNKNOWN) has an obligation row, and every "
    "obligation row names an open attempt with the same message and generation.",
    "INV-03": "An open attempt belongs to its message's current generation; PUBLISHING "
    "attempts only to PUBLISHING messages, UNKNOWN attempts only to UNCERTAIN messages.",
    "INV-04": "No message has two open attempts; a PUBLISHING or UNCERTAIN message's last "
    "attempt is its open one.",
    "INV-05": "Exactly the SCHEDULED messages have timeline work, one row each, keyed by "
    "their actionAt, id and generation, carrying their current version.",
    "INV-06": "The status and attempt counters equal the counts of rows.",
    "INV-07": "A payload's reference count equals the number of messages that hold it.",
    "INV-08": "A DELIVERED message has evidence and its last attempt is PUBLISHED.",
    "INV-09": "attempts_spent never exceeds max_attempts; a DEAD_LETTERED message spent it all.",
    "INV-10": "A SCHEDULED message's actionAt is at most its expireAt, and deliverAt plus "
    "the minimum delivery window is at most expireAt.",
}


def check(state: State) -> list[Violation]:
    out: list[Violation] = []
    messages = {k.decode(): v for k, v in state.items(Table.MESSAGES) if isinstance(v, Message)}
    attempts = {k.decode(): v for k, v in state.items(Table.ATTEMPTS) if isinstance(v, Attempt)}
    obligations = {
        k.decode(): v for k, v in state.items(Table.OBLIGATIONS) if isinstance(v, Obligation)
    }
    timeline = [(k, v) for k, v in state.items(Table.TIMELINE) if isinstance(v, TimelineWork)]
    payloads = {k.decode(): v for k, v in state.items(Table.PAYLOADS) if isinstance(v, PayloadRef)}
    cfg = state.config

    for mid, m in messages.items():
        if message_id(m.tenant, m.queue, m.timer_key) != mid or m.message_id != mid:
            out.append(Violation("INV-01", f"message {mid} has identity of another id"))

    open_attempts = {a: v for a, v in attempts.items() if v.status in OPEN_ATTEMPT_STATUSES}
    for aid, att in open_attempts.items():
        ob = obligations.get(aid)
        if ob is None or ob.message_id != att.message_id or ob.generation != att.generation:
            out.append(Violation("INV-02", f"open attempt {aid} has no matching obligation"))
    for aid in obligations.keys() - open_attempts.keys():
        out.append(Violation("INV-02", f"obligation {aid} names no open attempt"))

    open_per_message: Counter[str] = Counter()
    for aid, att in open_attempts.items():
        open_per_message[att.message_id] += 1
        msg = messages.get(att.message_id)
        want = Status.PUBLISHING if att.status is AttemptStatus.PUBLISHING else Status.UNCERTAIN
        if msg is None or msg.generation != att.generation or msg.status is not want:
            out.append(Violation("INV-03", f"open attempt {aid} detached from its message"))
    for mid, n in open_per_message.items():
        if n > 1:
            out.append(Violation("INV-04", f"message {mid} has {n} open attempts"))
    for mid, m in messages.items():
        if m.status in (Status.PUBLISHING, Status.UNCERTAIN) and (
            m.last_attempt_id not in open_attempts
        ):
            out.append(Violation("INV-04", f"message {mid} ({m.status}) has no open attempt"))

    seen: set[str] = set()
    for key, work in timeline:
        action_at_ms, mid, generation = parse_timeline_key(key)
        owner = messages.get(mid)
        if (
            owner is None
            or owner.status is not Status.SCHEDULED
            or owner.generation != generation
            or owner.action_at_ms != action_at_ms
            or work.version != owner.version
            or mid in seen
        ):
            out.append(Violation("INV-05", f"timeline row {action_at_ms}/{mid}/{generation}"))
        seen.add(mid)
    for mid, m in messages.items():
        if m.status is Status.SCHEDULED and mid not in seen:
            out.append(Violation("INV-05", f"scheduled message {mid} has no timeline work"))

    counters = state.meta.counters
    by_status = Counter(m.status for m in messages.values())
    for st, name in STATUS_COUNTER.items():
        if getattr(counters, name) != by_status.get(st, 0):
            out.append(Violation("INV-06", f"counter {name}={getattr(counters, name)}"))
    by_attempt = Counter(a.status for a in attempts.values())
    for ast, name in ATTEMPT_COUNTER.items():
        if getattr(counters, name) != by_attempt.get(ast, 0):
            out.append(Violation("INV-06", f"counter {name}={getattr(counters, name)}"))

    holders = Counter(m.payload_digest for m in messages.values() if m.status in PAYLOAD_HOLDING)
    for digest in holders.keys() | payloads.keys():
        ref = payloads.get(digest)
        if ref is None or ref.count != holders.get(digest, 0):
            out.append(Violation("INV-07", f"payload {digest[:12]} refcount mismatch"))

    for mid, m in messages.items():
        if m.status is Status.DELIVERED:
            last = attempts.get(m.last_attempt_id or "")
            if m.evidence is None or last is None or last.status is not AttemptStatus.PUBLISHED:
                out.append(Violation("INV-08", f"delivered message {mid} lacks evidence"))
        if m.attempts_spent > cfg.max_attempts or (
            m.status is Status.DEAD_LETTERED and m.attempts_spent != cfg.max_attempts
        ):
            out.append(Violation("INV-09", f"message {mid} spent {m.attempts_spent}"))
        if m.status is Status.SCHEDULED and (
            m.action_at_ms > m.expire_at_ms
            or m.deliver_at_ms + cfg.limits.min_delivery_window_ms > m.expire_at_ms
        ):
            out.append(Violation("INV-10", f"message {mid} timing"))
    return out


def assert_invariants(state: State) -> None:
    violations = check(state)
    if violations:
        raise InvariantViolation(violations)
