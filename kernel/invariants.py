"""Invariants of a shard state, checked after every step in tests and after every restore.

Theory of operation: the reducer maintains redundant structure (counters, the obligation
index, the timeline, payload reference counts) for speed. Each invariant recomputes one piece
from the primary rows and compares. The ids (INV-nn) are stable and listed in
`specs/invariants.md`. This walks the whole state: it is an audit, not a hot-path check.

Each invariant is kept by small named checks in two tables keyed by its id, as the lifecycle
rules are a table (`kernel/rules.py`): `STATE_CHECKS` look at the whole state, and
`MESSAGE_CHECKS` at one message at a time. The primary rows are read once (`_Rows`), and the
report follows `ORDER`, which lists every id once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

from nereus.kernel.keys import dead_letter_key, message_id, parse_timeline_key
from nereus.kernel.model import (
    ATTEMPT_COUNTER,
    LIVE_STATUSES,
    OPEN_ATTEMPT_STATUSES,
    PAYLOAD_HOLDING,
    STATUS_COUNTER,
    Attempt,
    AttemptStatus,
    DeadLetterPending,
    Message,
    Obligation,
    PayloadRef,
    Status,
    Table,
    TenantUsage,
    TimelineWork,
)
from nereus.kernel.state import State
from nereus.kernel.validation import action_at


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
    "INV-03": "An open attempt of a message's current generation fits its status: a "
    "PUBLISHING attempt only while the message is PUBLISHING or DELIVERED, an UNKNOWN attempt "
    "only while it is UNCERTAIN, PUBLISHING, DELIVERED or DEAD_LETTERED.",
    "INV-04": "No generation has two PUBLISHING attempts; a PUBLISHING message's last attempt "
    "is its PUBLISHING one; an UNCERTAIN message has an UNKNOWN attempt and no PUBLISHING one.",
    "INV-05": "Timeline work exists exactly for messages with has_work, one row each, keyed by "
    "their actionAt, id and generation, carrying their current version; SCHEDULED messages "
    "always have work, and only SCHEDULED or UNCERTAIN messages have any.",
    "INV-06": "The status, attempt and pending dead-letter counters equal the counts of rows.",
    "INV-07": "A payload's reference count equals the number of SCHEDULED, PUBLISHING and "
    "UNCERTAIN messages and pending dead-letter copies that hold it.",
    "INV-08": "A DELIVERED message has evidence; any evidence a message holds is that of a "
    "PUBLISHED attempt of its generation.",
    "INV-09": "attempts_spent never exceeds max_attempts; a DEAD_LETTERED message spent it all.",
    "INV-10": "Work is never keyed before the generation's first action time (deliverAt minus "
    "the handoff lead), and deliverAt plus the minimum delivery window is at most expireAt.",
    "INV-11": "open_attempts equals the number of open attempts of the current generation, "
    "and uncertain_retries never exceeds max_uncertain_retries.",
    "INV-12": "A tenant's usage row holds the number of its SCHEDULED, PUBLISHING and "
    "UNCERTAIN messages and the sum of their payload sizes; a tenant with none has no row.",
    "INV-13": "A dead-letter copy is pending (a dead_letters row keyed by message id and "
    "generation) exactly for each DEAD_LETTERED message without dead-letter evidence, "
    "restating its generation's content and budget, and for earlier generations of existing "
    "messages superseded before their copy was written; only a DEAD_LETTERED message holds "
    "dead-letter evidence.",
}


class _Rows(NamedTuple):
    """The state's primary rows, read once, and what several checks derive from them."""

    messages: dict[str, Message]
    attempts: dict[str, Attempt]
    obligations: dict[str, Obligation]
    timeline: list[tuple[bytes, TimelineWork]]
    payloads: dict[str, PayloadRef]
    usage: dict[str, TenantUsage]
    dead_letters: list[tuple[bytes, DeadLetterPending]]
    state: State
    open_attempts: dict[str, Attempt]
    # Of each message's current generation only: its open attempts, PUBLISHING ones by id,
    # and UNKNOWN ones counted (a superseded generation's attempt only waits for evidence).
    current_open: Counter[str]
    publishing: dict[str, list[str]]
    unknown: Counter[str]
    # (message, generation, evidence) of every PUBLISHED attempt.
    published: set[tuple[str, int, object]]


def _rows(state: State) -> _Rows:
    messages = {k.decode(): v for k, v in state.items(Table.MESSAGES) if isinstance(v, Message)}
    attempts = {k.decode(): v for k, v in state.items(Table.ATTEMPTS) if isinstance(v, Attempt)}
    open_attempts = {a: v for a, v in attempts.items() if v.status in OPEN_ATTEMPT_STATUSES}
    current_open: Counter[str] = Counter()
    publishing: dict[str, list[str]] = {}
    unknown: Counter[str] = Counter()
    for aid, att in open_attempts.items():
        msg = messages.get(att.message_id)
        if msg is None or msg.generation != att.generation:
            continue
        current_open[att.message_id] += 1
        if att.status is AttemptStatus.PUBLISHING:
            publishing.setdefault(att.message_id, []).append(aid)
        else:
            unknown[att.message_id] += 1
    return _Rows(
        messages=messages,
        attempts=attempts,
        obligations={
            k.decode(): v for k, v in state.items(Table.OBLIGATIONS) if isinstance(v, Obligation)
        },
        timeline=[(k, v) for k, v in state.items(Table.TIMELINE) if isinstance(v, TimelineWork)],
        payloads={
            k.decode(): v for k, v in state.items(Table.PAYLOADS) if isinstance(v, PayloadRef)
        },
        usage={k.decode(): v for k, v in state.items(Table.USAGE) if isinstance(v, TenantUsage)},
        dead_letters=[
            (k, v) for k, v in state.items(Table.DEAD_LETTERS) if isinstance(v, DeadLetterPending)
        ],
        state=state,
        open_attempts=open_attempts,
        current_open=current_open,
        publishing=publishing,
        unknown=unknown,
        published={
            (a.message_id, a.generation, a.evidence)
            for a in attempts.values()
            if a.status is AttemptStatus.PUBLISHED
        },
    )


def _identity(rows: _Rows) -> Iterator[Violation]:
    for mid, m in rows.messages.items():
        if message_id(m.tenant, m.queue, m.timer_key) != mid or m.message_id != mid:
            yield Violation("INV-01", f"message {mid} has identity of another id")


def _obligations(rows: _Rows) -> Iterator[Violation]:
    for aid, att in rows.open_attempts.items():
        ob = rows.obligations.get(aid)
        if ob is None or ob.message_id != att.message_id or ob.generation != att.generation:
            yield Violation("INV-02", f"open attempt {aid} has no matching obligation")
    for aid in rows.obligations.keys() - rows.open_attempts.keys():
        yield Violation("INV-02", f"obligation {aid} names no open attempt")


def _open_attempt_fits(rows: _Rows) -> Iterator[Violation]:
    for aid, att in rows.open_attempts.items():
        msg = rows.messages.get(att.message_id)
        if msg is None:
            yield Violation("INV-03", f"open attempt {aid} has no message")
            continue
        if msg.generation != att.generation:
            continue
        if att.status is AttemptStatus.PUBLISHING:
            allowed: tuple[Status, ...] = (Status.PUBLISHING, Status.DELIVERED)
        else:
            allowed = (Status.UNCERTAIN, Status.PUBLISHING, Status.DELIVERED, Status.DEAD_LETTERED)
        if msg.status not in allowed:
            yield Violation("INV-03", f"open attempt {aid} but message is {msg.status}")


def _publishing_attempts(rows: _Rows) -> Iterator[Violation]:
    for mid, aids in rows.publishing.items():
        if len(aids) > 1:
            yield Violation("INV-04", f"message {mid} has {len(aids)} PUBLISHING attempts")


def _message_attempts(rows: _Rows, mid: str, m: Message) -> Iterator[Violation]:
    mine = rows.publishing.get(mid, [])
    if m.status is Status.PUBLISHING and mine != [m.last_attempt_id]:
        yield Violation("INV-04", f"PUBLISHING message {mid} lacks its attempt")
    if m.status is Status.UNCERTAIN and (mine or not rows.unknown.get(mid)):
        yield Violation("INV-04", f"UNCERTAIN message {mid} attempts do not fit")


def _message_open_count(rows: _Rows, mid: str, m: Message) -> Iterator[Violation]:
    if m.open_attempts != rows.current_open.get(mid, 0):
        yield Violation("INV-11", f"message {mid} open_attempts={m.open_attempts}")
    if m.uncertain_retries > rows.state.config.max_uncertain_retries:
        yield Violation("INV-11", f"message {mid} uncertain_retries")


def _timeline(rows: _Rows) -> Iterator[Violation]:
    seen: set[str] = set()
    for key, work in rows.timeline:
        action_at_ms, mid, generation = parse_timeline_key(key)
        owner = rows.messages.get(mid)
        if (
            owner is None
            or not owner.has_work
            or owner.generation != generation
            or owner.action_at_ms != action_at_ms
            or work.version != owner.version
            or mid in seen
        ):
            yield Violation("INV-05", f"timeline row {action_at_ms}/{mid}/{generation}")
        seen.add(mid)
    for mid, m in rows.messages.items():
        if m.has_work and mid not in seen:
            yield Violation("INV-05", f"message {mid} has_work but no timeline row")
        if m.status is Status.SCHEDULED and not m.has_work:
            yield Violation("INV-05", f"scheduled message {mid} has no work")
        if m.has_work and m.status not in (Status.SCHEDULED, Status.UNCERTAIN):
            yield Violation("INV-05", f"{m.status} message {mid} has work")


def _counters(rows: _Rows) -> Iterator[Violation]:
    counters = rows.state.meta.counters
    by_status = Counter(m.status for m in rows.messages.values())
    for st, name in STATUS_COUNTER.items():
        if getattr(counters, name) != by_status.get(st, 0):
            yield Violation("INV-06", f"counter {name}={getattr(counters, name)}")
    by_attempt = Counter(a.status for a in rows.attempts.values())
    for ast, name in ATTEMPT_COUNTER.items():
        if getattr(counters, name) != by_attempt.get(ast, 0):
            yield Violation("INV-06", f"counter {name}={getattr(counters, name)}")
    if counters.dead_letters_pending != len(rows.dead_letters):
        yield Violation("INV-06", f"counter dead_letters_pending={counters.dead_letters_pending}")


def _payload_refcounts(rows: _Rows) -> Iterator[Violation]:
    messages = rows.messages.values()
    holders = Counter(m.payload_digest for m in messages if m.status in PAYLOAD_HOLDING)
    holders.update(d.payload_digest for _, d in rows.dead_letters)
    for digest in holders.keys() | rows.payloads.keys():
        ref = rows.payloads.get(digest)
        if ref is None or ref.count != holders.get(digest, 0):
            yield Violation("INV-07", f"payload {digest[:12]} refcount mismatch")


def _tenant_usage(rows: _Rows) -> Iterator[Violation]:
    expected: dict[str, TenantUsage] = {}
    for m in rows.messages.values():
        if m.status in LIVE_STATUSES:
            held = expected.get(m.tenant, TenantUsage(0, 0))
            expected[m.tenant] = TenantUsage(held.live + 1, held.bytes + m.payload_size)
    for tenant in expected.keys() | rows.usage.keys():
        if rows.usage.get(tenant) != expected.get(tenant):
            yield Violation(
                "INV-12",
                f"tenant {tenant!r} usage {rows.usage.get(tenant)!r}, "
                f"messages say {expected.get(tenant)!r}",
            )


def _message_evidence(rows: _Rows, mid: str, m: Message) -> Iterator[Violation]:
    if (m.status is Status.DELIVERED and m.evidence is None) or (
        m.evidence is not None and (mid, m.generation, m.evidence) not in rows.published
    ):
        yield Violation("INV-08", f"delivered message {mid} lacks evidence")


def _message_budget(rows: _Rows, mid: str, m: Message) -> Iterator[Violation]:
    cfg = rows.state.config
    if m.attempts_spent > cfg.max_attempts or (
        m.status is Status.DEAD_LETTERED and m.attempts_spent != cfg.max_attempts
    ):
        yield Violation("INV-09", f"message {mid} spent {m.attempts_spent}")


def _message_timing(rows: _Rows, mid: str, m: Message) -> Iterator[Violation]:
    if (m.has_work and m.action_at_ms < action_at(m.deliver_at_ms, m.capability)) or (
        m.deliver_at_ms + rows.state.config.limits.min_delivery_window_ms > m.expire_at_ms
    ):
        yield Violation("INV-10", f"message {mid} timing")


def _dead_letters(rows: _Rows) -> Iterable[Violation]:
    messages = rows.messages
    out: list[Violation] = []
    current: set[str] = set()
    for key, d in rows.dead_letters:
        where = f"dead letter {key.decode(errors='replace')}"
        m = messages.get(d.message_id)
        if key != dead_letter_key(d.message_id, d.generation) or m is None:
            out.append(Violation("INV-13", f"{where} names no message under its key"))
        elif d.generation > m.generation:
            out.append(Violation("INV-13", f"{where} is of a generation never made"))
        elif d.generation == m.generation:
            current.add(d.message_id)
            same = (
                m.txn, m.payload_digest, m.payload_size, m.partition_key, m.producer_sub,
                m.encrypted, m.deliver_at_ms, m.attempts_spent, m.failures, m.last_error,
            ) == (
                d.txn, d.payload_digest, d.payload_size, d.partition_key, d.producer_sub,
                d.encrypted, d.deliver_at_ms, d.attempts_spent, d.failures, d.last_error,
            )  # fmt: skip
            if m.status is not Status.DEAD_LETTERED or m.dead_letter_evidence is not None:
                out.append(Violation("INV-13", f"{where} pending for a {m.status} message"))
            elif not same:
                out.append(Violation("INV-13", f"{where} differs from its message"))
    for mid, m in messages.items():
        if m.dead_letter_evidence is not None and m.status is not Status.DEAD_LETTERED:
            out.append(Violation("INV-13", f"{m.status} message {mid} has dead-letter evidence"))
        owed = m.status is Status.DEAD_LETTERED and m.dead_letter_evidence is None
        if owed and mid not in current:
            out.append(Violation("INV-13", f"dead-lettered message {mid} owes no copy"))
    return out


StateCheck = Callable[[_Rows], Iterable[Violation]]
MessageCheck = Callable[[_Rows, str, Message], Iterable[Violation]]

# The checks, keyed by the invariant each keeps. An invariant may have a check of the whole
# state, a check of one message, or both; the whole-state one runs first.
STATE_CHECKS: dict[str, StateCheck] = {
    "INV-01": _identity,
    "INV-02": _obligations,
    "INV-03": _open_attempt_fits,
    "INV-04": _publishing_attempts,
    "INV-05": _timeline,
    "INV-06": _counters,
    "INV-07": _payload_refcounts,
    "INV-12": _tenant_usage,
    "INV-13": _dead_letters,
}
MESSAGE_CHECKS: dict[str, MessageCheck] = {
    "INV-04": _message_attempts,
    "INV-11": _message_open_count,
    "INV-08": _message_evidence,
    "INV-09": _message_budget,
    "INV-10": _message_timing,
}

# The order of the report: a stage of several ids walks the messages once, running each id's
# message check on a message before moving to the next one, so that a message's violations
# are listed together.
ORDER: tuple[tuple[str, ...], ...] = (
    ("INV-01",),
    ("INV-02",),
    ("INV-03",),
    ("INV-04", "INV-11"),
    ("INV-05",),
    ("INV-06",),
    ("INV-07",),
    ("INV-12",),
    ("INV-08", "INV-09", "INV-10"),
    ("INV-13",),
)


def check(state: State) -> list[Violation]:
    """Every violation of `state`, in the order of `ORDER`."""
    rows = _rows(state)
    out: list[Violation] = []
    for stage in ORDER:
        for inv in stage:
            whole = STATE_CHECKS.get(inv)
            if whole is not None:
                out.extend(whole(rows))
        per_message = [MESSAGE_CHECKS[inv] for inv in stage if inv in MESSAGE_CHECKS]
        if per_message:
            for mid, m in rows.messages.items():
                for one in per_message:
                    out.extend(one(rows, mid, m))
    return out


def assert_invariants(state: State) -> None:
    violations = check(state)
    if violations:
        raise InvariantViolation(violations)
