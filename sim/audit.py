"""The end-of-run audit: the whole shard log, replayed, against what the broker saw.

The simulator trusts nothing the product computed without restating it: deliverAt and
expireAt are recomputed from each command and its persistence time by the rules of
`specs/time.md`, true times come from the simulator's clock, and writes from the broker.
Each check returns sentences; an empty list means the run kept every promise:

1. replay of the log equals the live store (state digest, obligations) and yields the same
   effects the live folds did, and every reply a client got;
2. no Admission while true time < deliverAt (actionAt, immediate targets) or >= expireAt;
   no expiry while true time < expireAt; neither while the clock is unsynchronised; and the
   seed's rules restated on each record's own evidence: an accepted schedule satisfies the
   three V1 inequalities at its persistence time, an Admission's interval has latest <
   expireAt and earliest >= deliverAt and its persistence time lies in [deliverAt,
   expireAt), an expiry's interval has earliest >= expireAt and so has its persistence time;
3. every write had its attempt durably PUBLISHING, committed before it, at true time >=
   deliverAt and while the runtime's clock proved it (earliest end >= deliverAt at the
   write); no attempt written twice; NOT_PUBLISHED never said of a written attempt,
   PUBLISHED only with the broker's evidence; UNKNOWN never followed by NOT_PUBLISHED;
4. two writes of one generation only behind a recorded UNKNOWN of the earlier attempt;
5. nothing lost: every generation ever scheduled is superseded or ended DELIVERED (with the
   broker's evidence), CANCELED or EXPIRED (with no write), DEAD_LETTERED, or UNCERTAIN
   with an open obligation; once settled, no PUBLISHING attempt is left and no UNKNOWN
   attempt whose record the broker holds;
6. every dead-lettered generation (superseded since, or not) ends with its dead-letter copy
   recorded once (DEAD_LETTER_WRITTEN_V1) with the evidence of a copy the broker holds under
   its attempt id, filed under the DLQ consumer group with the generation's budget; the
   message keeps that evidence; no copy is owed once settled, and no copy was written for a
   generation that was never dead-lettered (copies are at-least-once: duplicates counted).

Figures named `reach_*` count the inputs that put a check to work (a NOT_PUBLISHED report
after UNKNOWN, one for a record the broker holds, a write at exactly its action time), so
a test can require that the seeds it runs reach them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from nereus.kernel.codes import Code
from nereus.kernel.config import KernelConfig
from nereus.kernel.digest import state_digest
from nereus.kernel.effects import DeadLetter, Effect, EntryOutcome, outcomes_of, split
from nereus.kernel.invariants import check as invariant_violations
from nereus.kernel.keys import message_id
from nereus.kernel.model import Attempt, AttemptStatus, Message, Status, Table
from nereus.kernel.records import (
    DeadLetterWritten,
    Evidence,
    Expire,
    LogEntry,
    NotPublished,
    PublishAdmission,
    Published,
    PublishOutcome,
    Reschedule,
    Schedule,
    Unknown,
)
from nereus.replay.fold import obligations
from nereus.replay.verify import first_difference
from nereus.runtime.destination import DLQ_CONSUMER_GROUP, H_CONSUMER_GROUP, dead_letter_attempt_id
from nereus.runtime.prepare import H_DLQ_ATTEMPTS_SPENT
from nereus.sim.destination import Write
from nereus.sim.ends import generation_ends
from nereus.storage.memory import MemoryStore
from nereus.storage.store import ShardStore

ENDED = frozenset({Status.DELIVERED, Status.CANCELED, Status.EXPIRED, Status.DEAD_LETTERED})


@dataclass(frozen=True)
class Generation:
    message_id: str
    generation: int
    deliver_at_ms: int
    expire_at_ms: int
    position: int


@dataclass
class Observed:
    """What the simulator saw live, independent of the store."""

    committed_at: dict[int, int]  # position -> true time its commit became durable
    committed_unsynced: set[int]  # positions committed while the clock was unsynchronised
    live_effects: dict[int, tuple[Effect, ...]]
    replies: dict[tuple[int, int], EntryOutcome]  # (position, item) -> what the client was told
    writes: list[Write]
    send_problems: list[str]


@dataclass
class Audit:
    problems: list[str] = field(default_factory=list)
    figures: Counter[str] = field(default_factory=Counter)
    gens: dict[tuple[str, int], Generation] = field(default_factory=dict)
    admitted: dict[str, tuple[int, str, int]] = field(default_factory=dict)  # pos, mid, gen
    # attempt id -> applied outcomes, in log order: (position, result)
    outcomes: dict[str, list[tuple[int, Published | NotPublished | Unknown]]] = field(
        default_factory=dict
    )
    written: dict[str, list[Write]] = field(default_factory=dict)  # attempt id -> writes
    # (message id, generation) -> the DeadLetter effect that made the copy owed, its position
    dead_lettered: dict[tuple[str, int], tuple[int, DeadLetter]] = field(default_factory=dict)
    # (message id, generation) -> the evidence its DEAD_LETTER_WRITTEN_V1 recorded
    copies: dict[tuple[str, int], Evidence] = field(default_factory=dict)

    def fail(self, sentence: str) -> None:
        self.problems.append(sentence)


def timing(record: Schedule | Reschedule, bp_ms: int, config: KernelConfig) -> tuple[int, int]:
    """deliverAt and expireAt restated from specs/time.md, not from the kernel."""
    if record.deliver_at_ms is not None:
        deliver = record.deliver_at_ms
    else:
        assert record.delay_ms is not None
        deliver = bp_ms + record.delay_ms
    if record.expire_at_ms is not None:
        expire = record.expire_at_ms
    elif record.lifetime_ms is not None:
        expire = bp_ms + record.lifetime_ms
    else:
        expire = min(
            max(deliver, bp_ms) + config.default_expiry_grace_ms,
            bp_ms + config.limits.max_message_lifetime_ms,
        )
    return deliver, expire


def audit(store: ShardStore, seen: Observed) -> Audit:
    a = Audit()
    for w in seen.writes:
        a.written.setdefault(w.attempt_id, []).append(w)
    entries = list(store.iter_log())
    replayed = _replay_matches(store, entries, seen, a)
    _walk_log(entries, replayed, seen, store.config, a)
    _check_writes(seen.writes, a)
    ends, folded = generation_ends(entries, store.config)
    with store.state_view() as live:
        if state_digest(live) != state_digest(folded):
            a.fail(f"a pure kernel fold differs: {first_difference(live, folded)}")
    _check_generations(ends, seen.writes, a)
    _check_settled(store, seen.writes, a)
    a.problems.extend(seen.send_problems)
    a.figures["log_entries"] = len(entries)
    return a


def _replay_matches(
    store: ShardStore, entries: list[LogEntry], seen: Observed, a: Audit
) -> dict[int, tuple[Effect, ...]]:
    replay_effects: dict[int, tuple[Effect, ...]] = {}

    def keep(entry: LogEntry, effects: tuple[Effect, ...]) -> None:
        replay_effects[entry.position] = effects

    memory = MemoryStore(store.config)
    memory.feed(entries, keep)
    with store.state_view() as live:
        if state_digest(live) != state_digest(memory.state):
            a.fail(f"replay differs from the store: {first_difference(live, memory.state)}")
        if obligations(live) != obligations(memory.state):
            a.fail("live obligations differ from the replay's obligations")
    a.problems.extend(f"replayed state: {v.detail}" for v in invariant_violations(memory.state))
    if set(seen.live_effects) != set(replay_effects):
        a.fail("the positions folded live differ from the positions in the log")
    for position, effects in sorted(seen.live_effects.items()):
        if replay_effects.get(position) != effects:
            a.fail(f"position {position}: live effects differ from the replay's")
    for (position, index), reply in sorted(seen.replies.items()):
        replayed = replay_effects.get(position)
        entry = entries[position - 1] if 0 < position <= len(entries) else None
        answers = outcomes_of(entry.record, replayed) if entry and replayed else ()
        if index >= len(answers) or answers[index] != reply:
            a.fail(
                f"position {position}.{index}: the client was told {reply}, replay says otherwise"
            )
    return replay_effects


def _walk_log(
    entries: list[LogEntry],
    effects: dict[int, tuple[Effect, ...]],
    seen: Observed,
    config: KernelConfig,
    a: Audit,
) -> None:
    for entry in entries:
        pos = entry.position
        true_ms = seen.committed_at.get(pos)
        if true_ms is None:
            a.fail(f"position {pos} is in the log but was never seen committed")
            continue
        # A batch entry is audited item by item, as the records its items stand for.
        for record, outcome, rest in split(entry.record, effects[pos]):
            a.figures[f"code_{outcome.code}"] += 1
            for effect in rest:
                if isinstance(effect, DeadLetter):
                    key = (effect.message_id, effect.generation)
                    if key in a.dead_lettered:
                        a.fail(f"{key[0]}.{key[1]} dead-lettered twice")
                    a.dead_lettered[key] = (pos, effect)
            if isinstance(record, PublishOutcome):
                _reach_outcome(record, outcome.applied, a)
            if not outcome.applied:
                continue
            if pos in seen.committed_unsynced and isinstance(record, PublishAdmission | Expire):
                a.fail(f"position {pos}: {outcome.code} while the clock was unsynchronised")
            match record:
                case Schedule() | Reschedule() if outcome.code in (
                    Code.SCHEDULED,
                    Code.RESCHEDULED,
                ):
                    _scheduled(record, outcome, entry, config, a)
                case PublishAdmission() if outcome.code is Code.ADMITTED:
                    _admitted(record, entry, true_ms, a)
                case PublishOutcome():
                    _outcome(record, pos, a)
                case DeadLetterWritten():
                    _copy_recorded(record, pos, a)
                case Expire():
                    _expired(record, outcome, entry, true_ms, a)
                case _:
                    pass


def _scheduled(
    record: Schedule | Reschedule,
    outcome: EntryOutcome,
    entry: LogEntry,
    config: KernelConfig,
    a: Audit,
) -> None:
    """A new generation: its timing restated from the spec, and remembered."""
    pos = entry.position
    deliver, expire = timing(record, entry.persisted_at_ms, config)
    mid = message_id(record.tenant, record.queue, record.timer_key)
    assert outcome.generation is not None
    if outcome.deliver_at_ms != deliver:
        a.fail(f"position {pos}: deliverAt {outcome.deliver_at_ms}, spec {deliver}")
    _check_v1_timing(pos, entry.persisted_at_ms, deliver, expire, config=config, a=a)
    a.gens[(mid, outcome.generation)] = Generation(mid, outcome.generation, deliver, expire, pos)


def _admitted(record: PublishAdmission, entry: LogEntry, true_ms: int, a: Audit) -> None:
    """An applied Admission: in its generation's window by true time and by its evidence."""
    pos = entry.position
    gen = a.gens.get((record.message_id, record.generation))
    if gen is None:
        a.fail(f"position {pos}: Admission of a generation never scheduled")
        return
    a.admitted[record.attempt_id] = (pos, record.message_id, record.generation)
    if true_ms < gen.deliver_at_ms:
        a.fail(
            f"attempt {record.attempt_id} admitted at true {true_ms} before "
            f"deliverAt {gen.deliver_at_ms}"
        )
    if true_ms >= gen.expire_at_ms:
        a.fail(f"attempt {record.attempt_id} admitted at/after expireAt")
    _check_admission_evidence(record, entry.persisted_at_ms, gen, a)


def _expired(
    record: Expire, outcome: EntryOutcome, entry: LogEntry, true_ms: int, a: Audit
) -> None:
    """An applied expiry: never before expireAt, by true time nor by its evidence."""
    pos = entry.position
    gen = a.gens.get((record.message_id, record.generation))
    if gen is None:
        a.fail(f"position {pos}: expiry of a generation never scheduled")
        return
    if true_ms < gen.expire_at_ms:
        a.fail(
            f"{record.message_id}.{record.generation} {outcome.code} at true "
            f"{true_ms} before expireAt {gen.expire_at_ms}"
        )
    if min(record.interval.earliest_ms, entry.persisted_at_ms) < gen.expire_at_ms:
        a.fail(
            f"position {pos}: {outcome.code} on evidence earliest "
            f"{record.interval.earliest_ms} / persisted {entry.persisted_at_ms} "
            f"before expireAt {gen.expire_at_ms}"
        )
    a.figures[f"expiry_{outcome.code}"] += 1


def _check_v1_timing(
    pos: int, bp_ms: int, deliver_ms: int, expire_ms: int, *, config: KernelConfig, a: Audit
) -> None:
    """The seed's three inequalities for an accepted schedule, at its persistence time."""
    limits = config.limits
    if expire_ms < max(deliver_ms, bp_ms) + limits.min_delivery_window_ms:
        a.fail(f"position {pos}: accepted with less than the minimum delivery window")
    if deliver_ms > bp_ms + limits.max_delay_horizon_ms:
        a.fail(f"position {pos}: accepted with deliverAt beyond the horizon")
    if expire_ms > bp_ms + limits.max_message_lifetime_ms:
        a.fail(f"position {pos}: accepted with expireAt beyond the maximum lifetime")


def _check_admission_evidence(
    record: PublishAdmission, bp_ms: int, gen: Generation, a: Audit
) -> None:
    """Admission only when the whole interval is past the action time (never before
    deliverAt) and before expireAt, persisted inside [deliverAt, expireAt)."""
    interval = record.interval
    where = f"attempt {record.attempt_id}"
    if interval.latest_ms >= gen.expire_at_ms:
        a.fail(f"{where} admitted on evidence whose latest end {interval.latest_ms} >= expireAt")
    if interval.earliest_ms < gen.deliver_at_ms:
        a.fail(f"{where} admitted on evidence whose earliest end is before deliverAt")
    if not gen.deliver_at_ms <= bp_ms < gen.expire_at_ms:
        a.fail(f"{where} admitted by an entry persisted at {bp_ms}, outside its window")


def _reach_outcome(record: PublishOutcome, applied: bool, a: Audit) -> None:
    """Counts the reports that put the NOT_PUBLISHED checks to work (see the docstring)."""
    if not isinstance(record.result, NotPublished):
        return
    history = a.outcomes.get(record.attempt_id, [])
    refused = "" if applied else "_refused"
    if any(isinstance(r, Unknown) for _, r in history):
        a.figures["reach_not_published_after_unknown" + refused] += 1
    if a.written.get(record.attempt_id):
        a.figures["reach_not_published_of_written" + refused] += 1


def _outcome(record: PublishOutcome, pos: int, a: Audit) -> None:
    result = record.result
    history = a.outcomes.setdefault(record.attempt_id, [])
    if isinstance(result, NotPublished) and any(isinstance(r, Unknown) for _, r in history):
        a.fail(f"attempt {record.attempt_id}: UNKNOWN turned into NOT_PUBLISHED")
    history.append((pos, result))
    writes = a.written.get(record.attempt_id, [])
    if isinstance(result, Published):
        w = writes[0] if writes else None
        if w is None or (w.topic, w.offset) != (
            result.evidence.destination,
            result.evidence.offset,
        ):
            a.fail(f"attempt {record.attempt_id}: PUBLISHED without the broker's evidence")
    elif isinstance(result, NotPublished) and writes:
        a.fail(f"attempt {record.attempt_id}: NOT_PUBLISHED but the broker holds it")
    if isinstance(result, NotPublished) and result.proof is not None:
        a.figures["proven_absent"] += 1


def _copy_recorded(record: DeadLetterWritten, pos: int, a: Audit) -> None:
    key = (record.message_id, record.generation)
    where = f"{record.message_id}.{record.generation}"
    if key not in a.dead_lettered or a.dead_lettered[key][0] > pos:
        a.fail(f"position {pos}: a dead-letter copy of {where} recorded, never dead-lettered")
    if key in a.copies:
        a.fail(f"position {pos}: the dead-letter copy of {where} recorded twice")
    a.copies[key] = record.evidence
    if any(g > record.generation for mid, g in a.gens if mid == record.message_id):
        a.figures["dlq_copies_of_superseded"] += 1  # owed across a superseding schedule
    ev = record.evidence
    held = a.written.get(dead_letter_attempt_id(*key), [])
    if not any((w.topic, w.offset) == (ev.destination, ev.offset) for w in held):
        a.fail(f"position {pos}: the dead-letter copy of {where} without the broker's evidence")


def _check_dead_letter_write(w: Write, per_attempt: Counter[str], a: Audit) -> None:
    a.figures["dlq_writes"] += 1
    where = f"dead-letter copy {w.attempt_id}"
    owed = a.dead_lettered.get((w.message_id, w.generation))
    if owed is None or w.attempt_id != dead_letter_attempt_id(w.message_id, w.generation):
        a.fail(f"{where}: written for a generation never dead-lettered")
        return
    if owed[0] > w.applied_position:
        a.fail(f"{where}: written before the entry that dead-lettered it was committed")
    headers = dict(w.headers)
    if headers.get(H_CONSUMER_GROUP) != DLQ_CONSUMER_GROUP.encode():
        a.fail(f"{where}: not filed under the {DLQ_CONSUMER_GROUP} consumer group")
    if headers.get(H_DLQ_ATTEMPTS_SPENT) != str(owed[1].attempts_spent).encode():
        a.fail(f"{where}: its attempt history differs from the dead-lettered generation's")
    if per_attempt[w.attempt_id] > 1 and w is not a.written[w.attempt_id][0]:
        a.figures["dlq_duplicate_writes"] += 1  # at-least-once: a rewrite after UNKNOWN


def _check_writes(writes: list[Write], a: Audit) -> None:
    by_gen: dict[tuple[str, int], list[Write]] = {}
    per_attempt = Counter(w.attempt_id for w in writes)
    for w in writes:
        if w.dlq:
            _check_dead_letter_write(w, per_attempt, a)
            continue
        a.figures["writes"] += 1
        by_gen.setdefault((w.message_id, w.generation), []).append(w)
        if per_attempt[w.attempt_id] > 1:
            a.fail(f"attempt {w.attempt_id} written {per_attempt[w.attempt_id]} times")
        gen = a.gens.get((w.message_id, w.generation))
        admitted = a.admitted.get(w.attempt_id)
        if gen is None or admitted is None:
            a.fail(f"write of {w.attempt_id}: no such scheduled generation or Admission")
            continue
        if w.true_ms < gen.deliver_at_ms:
            a.fail(
                f"write of {w.attempt_id} at true {w.true_ms} before deliverAt "
                f"{gen.deliver_at_ms} (early by {gen.deliver_at_ms - w.true_ms} ms)"
            )
        if w.earliest_ms < gen.deliver_at_ms:
            a.fail(
                f"write of {w.attempt_id} while the clock's earliest end {w.earliest_ms} was "
                f"before its action time {gen.deliver_at_ms}: the send gate did not hold it"
            )
        elif w.earliest_ms == gen.deliver_at_ms:
            a.figures["reach_write_at_exact_action_time"] += 1
        if admitted[0] > w.applied_position:
            a.fail(f"write of {w.attempt_id} before its Admission was committed")
    for group in by_gen.values():
        for j in range(1, len(group)):
            a.figures["duplicate_writes"] += 1
            later = a.admitted[group[j].attempt_id][0]
            for earlier in group[:j]:
                history = a.outcomes.get(earlier.attempt_id, [])
                if not any(isinstance(r, Unknown) and p < later for p, r in history):
                    a.fail(
                        f"{earlier.message_id}.{earlier.generation} written twice: "
                        f"{earlier.attempt_id} was not UNKNOWN before {group[j].attempt_id} "
                        "was admitted"
                    )


def _check_generations(ends: dict[tuple[str, int], Message], writes: list[Write], a: Audit) -> None:
    written = {w.attempt_id: w for w in writes if not w.dlq}
    gens_written = {(w.message_id, w.generation) for w in writes if not w.dlq}
    dlq = {(w.message_id, w.generation) for w in writes if w.dlq}
    latest: dict[str, int] = {}
    for mid, generation in a.gens:
        latest[mid] = max(latest.get(mid, 0), generation)
    for (mid, generation), gen in sorted(a.gens.items()):
        a.figures["generations_checked"] += 1
        m = ends.get((mid, generation))
        where = f"{mid}.{generation}"
        if m is None:
            a.fail(f"{where}: scheduled, but no row of it was ever seen")
            continue
        current = generation == latest[mid]
        a.figures[f"final_{m.status.lower()}" if current else f"superseded_{m.status.lower()}"] += 1
        if (m.deliver_at_ms, m.expire_at_ms) != (gen.deliver_at_ms, gen.expire_at_ms):
            a.fail(f"{where}: stored timing differs from the spec's")
        if m.status is Status.SCHEDULED and not current:
            continue  # superseded while pending: the upsert took its place
        if m.status not in ENDED and not (m.status is Status.UNCERTAIN and m.open_attempts):
            a.fail(f"{where}: lost, ended {m.status} with nothing open")
        if m.status is Status.DELIVERED:
            w = written.get(m.delivered_attempt_id or "")
            if w is None or m.evidence is None or w.offset != m.evidence.offset:
                a.fail(f"{where}: DELIVERED without a matching broker record")
        if m.status in (Status.CANCELED, Status.EXPIRED) and (mid, generation) in gens_written:
            a.fail(f"{where}: {m.status} but the broker holds a record of it")
        if m.status is Status.DEAD_LETTERED:
            a.figures["dead_lettered"] += 1
            recorded = a.copies.get((mid, generation))
            if (mid, generation) not in a.dead_lettered:
                a.fail(f"{where}: DEAD_LETTERED without a DeadLetter effect")
            if recorded is None or (mid, generation) not in dlq:
                a.fail(f"{where}: DEAD_LETTERED, but its dead-letter copy was never recorded")
            elif current and m.dead_letter_evidence != recorded:
                a.fail(f"{where}: the message lacks its dead-letter copy's evidence")
    a.figures["keys_checked"] = len({mid for mid, _ in a.gens})


def _check_settled(store: ShardStore, writes: list[Write], a: Audit) -> None:
    """Once settled: no PUBLISHING attempt, and no UNKNOWN one the broker holds."""
    written = {w.attempt_id for w in writes if not w.dlq}
    if store.meta.counters.dead_letters_pending:
        a.fail(f"{store.meta.counters.dead_letters_pending} dead-letter copies still owed")
    with store.read() as view:
        for key, value in view.items(Table.ATTEMPTS):
            assert isinstance(value, Attempt)
            if value.status is AttemptStatus.PUBLISHING:
                a.fail(f"attempt {key.decode()} still PUBLISHING after the run settled")
            elif value.status is AttemptStatus.UNKNOWN:
                a.figures["open_unknown_attempts"] += 1
                if value.attempt_id in written:
                    a.fail(f"attempt {key.decode()} UNKNOWN though the broker holds it")
