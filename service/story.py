"""A timer's story from one store snapshot: what the console's timer page shows.

Theory of operation: the store keeps, for other reasons, everything a story needs to find
its places in the log: the story index names the position and verdict of every command
that named the message (`StoreView.story_marks`), and each attempt row the positions of its
Admission and its resolution. Each position is read back from the shard log, so what a
line says (a deliverAt, a txn, the destination's offset, the fence of a proof of absence)
is the record itself, not a summary of it; a position below the log's floor (compacted
behind a snapshot) keeps its line, without its persistence time. The Admission's clock
interval is shown beside deliverAt: "was it early?" is answered by the interval's
earliest end against deliverAt, the rule the reducer applied.
"""

from __future__ import annotations

from typing import Any

from nereus.kernel.model import Attempt, Message, Status, Table
from nereus.kernel.records import (
    Cancel,
    Evidence,
    LogEntry,
    NotPublished,
    PublishAdmission,
    Published,
    PublishOutcome,
    Reschedule,
    Schedule,
    Unknown,
    members,
    record_type,
)
from nereus.service.inspect import AttemptView, Event, Story
from nereus.storage import inspect as reads
from nereus.storage.base import StoreView

# The newest commands a story shows; older ones are counted as left out.
STORY_MARKS = 200
# Attempts a story shows (a generation has at most its attempt budget; many generations
# could hold more).
STORY_ATTEMPTS = 100

# A fact's value is text, or an int: epoch milliseconds, shown as a time in UTC and the
# viewer's zone.
Fact = tuple[str, str | int]
Facts = tuple[Fact, ...]


def build_story(view: StoreView, tenant: str, message_id: str) -> Story | None:
    """The story of `message_id` if it is the tenant's, else None."""
    m = view.get(Table.MESSAGES, message_id.encode())
    if isinstance(m, Message) and m.tenant != tenant:
        return None
    marks, older = view.story_marks(message_id, STORY_MARKS)
    if not isinstance(m, Message) and not marks:
        return None
    events: list[Event] = []
    names: tuple[str, str] | None = (m.queue, m.timer_key) if isinstance(m, Message) else None
    for mark in marks:
        entry = reads.log_entry(view, mark.position)
        record = _member(entry, mark.index)
        if isinstance(record, Schedule | Reschedule | Cancel):
            if record.tenant != tenant:
                return None
            names = names or (record.queue, record.timer_key)
        events.append(_command_event(mark, entry, record))
    attempts = _attempts(view, message_id)
    for a in attempts:
        events.extend(_attempt_events(view, a))
    if isinstance(m, Message):
        marked = {e.position for e in events}
        events.extend(e for e in _ending(m) if e.position not in marked)
    events.sort(key=lambda e: e.position)
    queue, timer_key = names or ("", "")
    return Story(
        message_id=message_id,
        tenant=tenant,
        queue=queue,
        timer_key=timer_key,
        status=m.status.value if isinstance(m, Message) else None,
        generation=m.generation if isinstance(m, Message) else None,
        deliver_at_ms=m.deliver_at_ms if isinstance(m, Message) else None,
        expire_at_ms=m.expire_at_ms if isinstance(m, Message) else None,
        txn=m.txn if isinstance(m, Message) else None,
        last_error=m.last_error if isinstance(m, Message) else None,
        events=tuple(events),
        attempts=tuple(_attempt_view(view, a) for a in attempts),
        index_floor=view.story_floor(),
        older_left_out=older,
    )


def _member(entry: LogEntry | None, index: int) -> Any:
    if entry is None:
        return None
    items = members(entry.record)
    return items[index] if index < len(items) else None


def _command_event(row: Any, entry: LogEntry | None, record: Any) -> Event:
    mark = row.mark
    facts: list[Fact] = []
    title = mark.record_type
    if isinstance(record, Schedule | Reschedule | Cancel):
        title = record_type(record)
        facts += _command_facts(record)
    elif record is not None:
        title = record_type(record)
    if mark.deliver_at_ms is not None:
        facts.append(("deliverAt (resolved)", mark.deliver_at_ms))
    if mark.attempt_id:
        facts.append(("attempt that crossed Admission", mark.attempt_id))
    return Event(
        position=row.position,
        persisted_at_ms=mark.persisted_at_ms,
        kind=_KINDS.get(title, "command"),
        title=title,
        verdict=str(mark.code),
        applied=mark.applied,
        generation=mark.generation,
        facts=tuple(facts),
    )


_KINDS = {"EXPIRE_V1": "expiry", "DEAD_LETTER_WRITTEN_V1": "dead letter"}


def _command_facts(record: Schedule | Reschedule | Cancel) -> list[Fact]:
    facts: list[Fact] = []
    for name, label in (
        ("txn", "txn"),
        ("deliver_at_ms", "deliverAt"),
        ("delay_ms", "delay ms"),
        ("expire_at_ms", "expireAt"),
        ("lifetime_ms", "lifetime ms"),
        ("expected_version", "expected version"),
        ("payload_size", "payload bytes"),
        ("producer_sub", "producer"),
    ):
        v = getattr(record, name, None)
        if v is None:
            continue
        facts.append((label, v if name.endswith("_at_ms") else str(v)))
    return facts


def _attempts(view: StoreView, message_id: str) -> list[Attempt]:
    # Attempt ids start with "<message id>." (`kernel.keys.attempt_prefix`): one key range;
    # "/" is the byte after ".".
    out: list[Attempt] = []
    for _, a in view.range(Table.ATTEMPTS, f"{message_id}.".encode(), f"{message_id}/".encode()):
        if isinstance(a, Attempt):
            out.append(a)
            if len(out) >= STORY_ATTEMPTS:
                break
    return out


def _attempt_events(view: StoreView, a: Attempt) -> list[Event]:
    entry = reads.log_entry(view, a.admitted_position)
    admission = _find(entry, PublishAdmission, a.attempt_id)
    facts: list[Fact] = [("claim", a.claim_id), ("owner", a.owner)]
    if isinstance(admission, PublishAdmission):
        iv = admission.interval
        facts += [("clock earliest", iv.earliest_ms), ("clock latest", iv.latest_ms)]
        if admission.fence_id:
            facts.append(("producer fence", admission.fence_id))
    facts.append(("descriptor", a.descriptor_hash))
    events = [
        Event(
            a.admitted_position,
            entry.persisted_at_ms if entry is not None else a.admitted_at_ms,
            "admission",
            "Admission",
            verdict="PUBLISHING",
            generation=a.generation,
            attempt_id=a.attempt_id,
            facts=tuple(facts),
        )
    ]
    if a.resolved_position is not None:
        done = reads.log_entry(view, a.resolved_position)
        outcome = _find(done, PublishOutcome, a.attempt_id)
        events.append(
            Event(
                a.resolved_position,
                done.persisted_at_ms if done is not None else a.resolved_at_ms,
                "outcome",
                "Outcome",
                verdict=a.status.value,
                generation=a.generation,
                attempt_id=a.attempt_id,
                facts=_outcome_facts(a, outcome),
            )
        )
    return events


def _find(entry: LogEntry | None, kind: type[Any], attempt_id: str) -> Any:
    if entry is None:
        return None
    for r in members(entry.record):
        if isinstance(r, kind) and getattr(r, "attempt_id", None) == attempt_id:
            return r
    return None


def _outcome_facts(a: Attempt, outcome: Any) -> Facts:
    result = outcome.result if isinstance(outcome, PublishOutcome) else None
    if isinstance(result, Published):
        return _evidence(result.evidence)
    if isinstance(result, NotPublished):
        facts: list[Fact] = [("disposition", result.disposition), ("error", result.error_code)]
        if result.detail:
            facts.append(("detail", result.detail))
        if result.proof is not None:
            facts += _absence(result.proof)
        return tuple(facts)
    if isinstance(result, Unknown):
        return (("reason", result.reason), ("detail", result.detail or "-"))
    facts2: list[Fact] = [("disposition", a.disposition or "-"), ("error", a.error_code or "-")]
    return tuple(facts2) + (_evidence(a.evidence) if a.evidence else ())


def _evidence(ev: Evidence) -> Facts:
    facts: list[Fact] = [
        ("topic", ev.destination),
        ("partition", str(ev.partition)),
        ("offset", str(ev.offset)),
        ("destination timestamp", ev.timestamp_ms),
    ]
    if ev.broker_message_id:
        facts.append(("broker message id", ev.broker_message_id))
    return tuple(facts)


def _absence(proof: Any) -> list[Fact]:
    return [
        ("proof of absence: fence", proof.fence_id),
        ("fenced at", proof.fenced_at_ms),
        ("searched", proof.searched or "-"),
    ]


def _attempt_view(view: StoreView, a: Attempt) -> AttemptView:
    outcome = None
    if a.resolved_position is not None:
        outcome = _find(reads.log_entry(view, a.resolved_position), PublishOutcome, a.attempt_id)
    result = outcome.result if isinstance(outcome, PublishOutcome) else None
    proof = result.proof if isinstance(result, NotPublished) else None
    return AttemptView(
        attempt_id=a.attempt_id,
        generation=a.generation,
        status=a.status.value,
        destination=a.destination,
        claim_id=a.claim_id,
        owner=a.owner,
        admitted_position=a.admitted_position,
        admitted_at_ms=a.admitted_at_ms,
        resolved_position=a.resolved_position,
        resolved_at_ms=a.resolved_at_ms,
        disposition=a.disposition,
        error_code=a.error_code,
        evidence=_evidence(a.evidence) if a.evidence is not None else (),
        absence=tuple(_absence(proof)) if proof is not None else (),
    )


def _ending(m: Message) -> list[Event]:
    """The transition a row ended in that no command or attempt line shows."""
    if m.status is Status.EXPIRED:
        facts: Facts = (("expireAt", m.expire_at_ms),)
        return [
            Event(
                m.updated_position,
                m.updated_at_ms,
                "expiry",
                "Expired",
                "EXPIRED",
                True,
                m.generation,
                facts=facts,
            )
        ]
    if m.status is Status.DEAD_LETTERED:
        dl = m.dead_letter_evidence
        facts = (("last error", m.last_error or "-"),) + (_evidence(dl) if dl else ())
        return [
            Event(
                m.updated_position,
                m.updated_at_ms,
                "dead letter",
                "Dead-lettered",
                "DEAD_LETTERED",
                True,
                m.generation,
                facts=facts,
            )
        ]
    return []
