"""The effects runner: what the runtime does with the entries one commit folded, in order.

Theory of operation: the shard log hands back every folded entry with its effects only after
the fold is durable, so everything here may act. For each entry, in log order, and for each
item of a batch entry (`kernel.effects.split`), in item order: its outcome
is counted (`runtime.tally`); a recorded `lane_unavailable` outcome makes its lane not READY
for a while; a folded DEAD_LETTER_WRITTEN_V1 ends the writing of that copy; then the entry's
effects, in the order the kernel gave them:

* `RevokeClaim` releases the claim it names (`runtime.claims`);
* `Publish` admits the claim it names, which is then sent once its send gate opens; a
  Publish for a claim not held here (released since) becomes a NOT_PUBLISHED
  `send_gate_closed` outcome for the next commit, because the producer was never called;
  one of another owner's claims (folded while catching up) is that owner's, and recovery
  settles it by evidence;
* `DeadLetter` owes a copy (before recovery it is history: recovery takes every copy owed);
* `TimelinePut` notes the earliest action time written, so the loop does not sleep past it.

The outcomes come back by position, for the futures of the commands in the commit.
"""

from __future__ import annotations

from nereus.kernel.effects import (
    DeadLetter,
    Effect,
    EntryOutcome,
    Publish,
    RevokeClaim,
    TimelinePut,
    per_item,
    split,
)
from nereus.kernel.keys import str_key
from nereus.kernel.model import Message, Table
from nereus.kernel.records import DeadLetterWritten, NotPublished, PublishOutcome
from nereus.runtime.claims import ClaimTable
from nereus.runtime.dead_letters import DeadLetters
from nereus.runtime.deferred import Deferred
from nereus.runtime.discovery import Discovery
from nereus.runtime.log import Logger
from nereus.runtime.metrics import Metrics
from nereus.runtime.tally import Tally
from nereus.storage.store import Applied, ShardStore


class EffectsRunner:
    def __init__(
        self,
        store: ShardStore,
        claims: ClaimTable,
        discovery: Discovery,
        dead_letters: DeadLetters,
        *,
        metrics: Metrics,
        log: Logger,
        deferred: Deferred,
    ) -> None:
        self.store = store
        self.claims = claims
        self.discovery = discovery
        self.dead_letters = dead_letters
        self.metrics = metrics
        self.log = log
        self._deferred = deferred  # records for the next commit, owned by the runtime
        # The earliest action time of timeline rows written since `put_action_ms` was reset.
        self.put_action_ms: int | None = None

    def run(
        self, results: list[Applied], now_ms: int, *, recovered: bool
    ) -> dict[int, tuple[EntryOutcome, ...]]:
        """Act on the effects of `results`; returns each entry's answers by position, one
        per record it stands for (`kernel.effects.per_item`)."""
        outcomes: dict[int, tuple[EntryOutcome, ...]] = {}
        tally = Tally(self.log, recovered)
        for entry, effects in results:
            answers: list[EntryOutcome] = []
            for record, outcome, rest in split(entry.record, effects):
                answers.append(outcome)
                tally.entry(record, outcome, entry.persisted_at_ms)
                if isinstance(record, PublishOutcome):
                    if outcome.applied:
                        self._outcome_recorded(record, now_ms)
                elif isinstance(record, DeadLetterWritten):
                    self.dead_letters.recorded(record)
                for effect in rest:
                    self._act(effect, recovered)
            outcomes[entry.position] = per_item(entry.record, answers)
        tally.write(self.metrics)
        return outcomes

    def _outcome_recorded(self, record: PublishOutcome, now_ms: int) -> None:
        result = record.result
        if isinstance(result, NotPublished) and result.disposition == "lane_unavailable":
            with self.store.read() as view:
                msg = view.get(Table.MESSAGES, str_key(record.message_id))
            if isinstance(msg, Message):
                self.discovery.lane_unavailable((msg.tenant, msg.queue), now_ms)

    def _act(self, effect: Effect, recovered: bool) -> None:
        match effect:
            case TimelinePut() as put:
                if self.put_action_ms is None or put.action_at_ms < self.put_action_ms:
                    self.put_action_ms = put.action_at_ms
            case Publish() as publish:
                if not self.claims.issued_here(publish.claim_id):
                    return  # another owner's: its send gate was that owner's
                if not self.claims.admit(publish):
                    # We never called the producer for this attempt: that is a fact.
                    closed = NotPublished("retriable", "send_gate_closed")
                    outcome = PublishOutcome(
                        publish.attempt_id, publish.message_id, publish.generation, closed
                    )
                    self._deferred.add((outcome, None))
            case RevokeClaim() as revoke:
                self.claims.revoke(revoke)
            case DeadLetter() as dead:
                if recovered:
                    self.dead_letters.owe(dead.message_id, dead.generation, look_first=False)
            case _:
                pass
