"""Dead-letter copies: writing the copies the shard state owes to `<topic>.dlq`.

Theory of operation: a copy is owed in the shard state (the dead_letters table), not in
memory. The fold that dead-letters a generation records the copy as owed; a `DeadLetter`
effect (or, at recovery, the table itself) has `DeadLetters` write it to `<topic>.dlq`, and a
PUBLISHED result goes back into the log as DEAD_LETTER_WRITTEN_V1, which closes it. A failed
or UNKNOWN write is retried after a backoff (`dead_letter_backoff_ms`); after an UNKNOWN
one, and after a restart or a takeover, the copy is first looked for at the destination
under its attempt id (through the settler's bulk search). Copies are at-least-once: a write
whose fate was unknown and that the lookup misses is written again, and both copies carry
the same attempt id. What is held here is only which copies this runtime is writing and
where each stands; a restart loses none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from nereus.kernel.keys import dead_letter_key, str_key
from nereus.kernel.model import DeadLetterPending, Message, Table
from nereus.kernel.records import Appendable, DeadLetterWritten, NotPublished, Published, Unknown
from nereus.runtime.config import RuntimeConfig
from nereus.runtime.deferred import Deferred
from nereus.runtime.destination import (
    DLQ_SUFFIX,
    Destination,
    Lookup,
    Send,
    SendResult,
    dead_letter_attempt_id,
)
from nereus.runtime.log import Logger
from nereus.runtime.metrics import Metrics
from nereus.runtime.prepare import dead_letter_message, prepare_dead_letter
from nereus.runtime.settle import Settled, Settler, Want
from nereus.storage.base import StoreView
from nereus.storage.store import ShardStore


@dataclass
class DeadLetterCopy:
    """A copy this runtime is writing. `waiting`: to be written at `due_ms` (runtime clock),
    after looking for it at the destination first if `look_first`; `looking`: that look is
    in an evidence search; `sending`: handed to the destination; `recorded`:
    DEAD_LETTER_WRITTEN_V1 is on its way into the log."""

    message_id: str
    generation: int
    state: Literal["waiting", "looking", "sending", "recorded"] = "waiting"
    due_ms: int = 0
    failures: int = 0
    look_first: bool = False


class DeadLetters:
    def __init__(
        self,
        store: ShardStore,
        destination: Destination,
        settler: Settler,
        *,
        config: RuntimeConfig,
        metrics: Metrics,
        log: Logger,
        deferred: Deferred,
    ) -> None:
        self.store = store
        self.destination = destination
        self.settler = settler
        self.config = config
        self.metrics = metrics
        self.log = log
        self._deferred = deferred  # records for the next commit, owned by the runtime
        # Copies being written, by their attempt id.
        self.copies: dict[str, DeadLetterCopy] = {}

    def owe(self, message_id: str, generation: int, *, look_first: bool) -> None:
        aid = dead_letter_attempt_id(message_id, generation)
        if aid not in self.copies:
            self.copies[aid] = DeadLetterCopy(message_id, generation, look_first=look_first)

    def recover(self, view: StoreView) -> None:
        """Take every copy still owed: the process that owed it may have written it and died
        before recording it, so each is looked for first, then written if it is not there."""
        for _key, pending in view.items(Table.DEAD_LETTERS):
            assert isinstance(pending, DeadLetterPending)
            self.owe(pending.message_id, pending.generation, look_first=True)
            message = view.get(Table.MESSAGES, str_key(pending.message_id))
            assert isinstance(message, Message)
            aid = dead_letter_attempt_id(pending.message_id, pending.generation)
            self._look_for(self.copies[aid], aid, message, pending)

    def due(self, now_ms: int) -> bool:
        return any(c.state == "waiting" and c.due_ms <= now_ms for c in self.copies.values())

    def recorded(self, record: DeadLetterWritten) -> None:
        """DEAD_LETTER_WRITTEN_V1 was folded: the copy is no longer owed (or never was)."""
        self.copies.pop(dead_letter_attempt_id(record.message_id, record.generation), None)

    def clear(self) -> None:
        self.copies = {}

    def result(self, res: SendResult, now_ms: int) -> list[Appendable]:
        """A PUBLISHED copy goes into the log (whichever of its writes it was: the evidence
        is true of any); a failed or UNKNOWN write is written again after a backoff."""
        copy = self.copies.get(res.attempt_id)
        result = res.result
        if copy is None or copy.state == "recorded":
            return []  # already recorded (a duplicate report) or no longer owed
        if isinstance(result, Published):
            copy.state = "recorded"
            self.metrics.inc("nereus_dead_letters_total", labels={"result": "written"})
            self.log.info("dead_letter_written", attempt_id=res.attempt_id)
            record = DeadLetterWritten(copy.message_id, copy.generation, result.evidence)
            return [(record, None)]
        if copy.state != "sending":
            return []  # a late report of an earlier write: the retry is already planned
        copy.failures += 1
        copy.state = "waiting"
        # Once a write's fate was unknown, every later write looks first: that one may have
        # landed, and a lookup that missed it once proves nothing.
        copy.look_first = copy.look_first or isinstance(result, Unknown)
        copy.due_ms = now_ms + self.config.dead_letter_backoff_ms(copy.failures)
        self.metrics.inc("nereus_dead_letters_total", labels={"result": "failed"})
        self.log.warning(
            "dead_letter_write_failed",
            attempt_id=res.attempt_id,
            result=type(result).__name__,
            error=result.error_code if isinstance(result, NotPublished) else result.reason,
            failures=copy.failures,
            retry_at_ms=copy.due_ms,
        )
        return []

    def looked(self, settled: Settled) -> None:
        """A copy found at the destination goes into the log; one not found is written
        (copies are at-least-once: a miss, even by an incomplete search, only risks a second
        copy under the same attempt id)."""
        aid = settled.want.lookup.attempt_id
        copy = self.copies.get(aid)
        if copy is None or copy.state != "looking":
            return
        found = settled.evidence
        if found is None:
            copy.state = "waiting"
            copy.look_first = False
            return
        copy.state = "recorded"
        self.metrics.inc("nereus_dead_letters_total", labels={"result": "found"})
        self.log.info("dead_letter_found", attempt_id=aid, topic=found.destination)
        self._deferred.add((DeadLetterWritten(copy.message_id, copy.generation, found), None))

    def take_due(self, now_ms: int) -> list[Send]:
        """The writes of the copies that are due; where a write's fate is unknown, a look
        for the copy instead."""
        due: list[tuple[str, DeadLetterCopy, Message, DeadLetterPending, bytes | None]] = []
        with self.store.read() as view:
            for aid, copy in list(self.copies.items()):
                if copy.state != "waiting" or copy.due_ms > now_ms:
                    continue
                key = dead_letter_key(copy.message_id, copy.generation)
                pending = view.get(Table.DEAD_LETTERS, key)
                if not isinstance(pending, DeadLetterPending):
                    del self.copies[aid]  # recorded since (folded from the log)
                    continue
                message = view.get(Table.MESSAGES, str_key(copy.message_id))
                assert isinstance(message, Message)
                due.append((aid, copy, message, pending, view.payload(pending.payload_digest)))
        sends: list[Send] = []
        for aid, copy, message, pending, payload in due:
            if copy.look_first:
                self._look_for(copy, aid, message, pending)
                continue
            prepared = prepare_dead_letter(
                dead_letter_message(message, pending),
                payload,
                self.destination,
                attempts_spent=pending.attempts_spent,
                failures=pending.failures,
                last_error=pending.last_error,
            )
            copy.state = "sending"
            sends.append(Send(aid, prepared))
            self.log.warning(
                "dead_lettered",
                message_id=copy.message_id,
                generation=copy.generation,
                topic=prepared.topic,
                last_error=pending.last_error,
                attempt=copy.failures + 1,
            )
        return sends

    def _look_for(
        self, copy: DeadLetterCopy, aid: str, message: Message, pending: DeadLetterPending
    ) -> None:
        copy.state = "looking"
        topic = self.destination.topic_for(message.queue, tenant=message.tenant) + DLQ_SUFFIX
        lookup = Lookup(aid, topic, pending.dead_lettered_at_ms)
        self.settler.want([Want(lookup, "dead_letter")])
