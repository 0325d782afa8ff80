"""Recovery and reconciliation: settling open attempts by evidence, never by guessing.

Theory of operation: after a restart or a takeover no send gate of a PUBLISHING attempt
survives, so each is settled by evidence, all of them in one background search
(`runtime.settle`): PUBLISHED where the attempt is found; NOT_PUBLISHED with its proof where
the destination fenced the producer it was sent under and a complete search missed it;
otherwise UNKNOWN. Every dead-letter copy still owed is looked for too. Never re-send blindly;
never infer absence without a fence.

Reconciliation looks for positive evidence of UNKNOWN attempts every
`reconcile_interval_ms` (only positive evidence resolves one). And before an uncertain retry
is claimed, the generation's UNKNOWN attempts are looked for once more (`retry_checked`): a
retry while one of them sits at the destination would be a duplicate. What a finished search
proves comes back from `settle` as records for the next commit.
"""

from __future__ import annotations

from nereus.kernel.keys import attempt_prefix, str_key
from nereus.kernel.model import Attempt, AttemptStatus, Message, Obligation, Table
from nereus.kernel.records import Appendable, NotPublished, Published, PublishOutcome, Unknown
from nereus.runtime.config import RuntimeConfig
from nereus.runtime.dead_letters import DeadLetters
from nereus.runtime.destination import Destination, Lookup, fence_id_for, proven_absent
from nereus.runtime.log import Logger
from nereus.runtime.settle import Settled, Settler, Want
from nereus.storage.base import StoreView
from nereus.storage.store import ShardStore

_OPEN = (AttemptStatus.PUBLISHING, AttemptStatus.UNKNOWN)


class Recovery:
    def __init__(
        self,
        store: ShardStore,
        destination: Destination,
        settler: Settler,
        dead_letters: DeadLetters,
        *,
        config: RuntimeConfig,
        log: Logger,
    ) -> None:
        self.store = store
        self.destination = destination
        self.settler = settler
        self.dead_letters = dead_letters
        self.config = config
        self.log = log
        # Recovery's open attempts not yet settled, and when recovery started (tick time).
        self.recovering: set[str] = set()
        self._started_ms = 0
        self._counts: dict[str, int] = {}
        self._last_reconcile_ms = 0
        # UNKNOWN attempts a complete search did not find, with the tick time it started
        # at: an uncertain retry is claimed only after such a look (`retry_checked`).
        self._looked: dict[str, int] = {}

    def recover(self, now_ms: int) -> None:
        """Ask for every PUBLISHING attempt and every dead-letter copy owed (the UNKNOWN
        attempts are the reconciler's)."""
        with self.store.read() as view:
            self.dead_letters.recover(view)
            wants = self._open_attempts(view, AttemptStatus.PUBLISHING)
        self.recovering = {w.lookup.attempt_id for w in wants}
        self._started_ms = now_ms
        self._counts = {}
        self.settler.want(wants)
        self.log.info(
            "recovery_started",
            open_attempts=len(wants),
            dead_letters_owed=len(self.dead_letters.copies),
            fence_id=self.destination.fence_id,
        )
        self._last_reconcile_ms = now_ms  # the reconciler's first pass comes later

    def reconcile_if_due(self, now_ms: int) -> None:
        """Look for positive evidence of UNKNOWN attempts, all in one search, once every
        `reconcile_interval_ms`."""
        if now_ms - self._last_reconcile_ms < self.config.reconcile_interval_ms:
            return
        self._last_reconcile_ms = now_ms
        if self.settler.busy():
            return  # whatever is being looked for now is looked for in full first
        with self.store.read() as view:
            wants = self._open_attempts(view, AttemptStatus.UNKNOWN)
        # Looks at attempts no longer UNKNOWN are of no use to a later retry.
        unknown = {w.lookup.attempt_id for w in wants}
        self._looked = {aid: at for aid, at in self._looked.items() if aid in unknown}
        self.settler.want(wants)

    def retry_checked(self, view: StoreView, message: Message) -> bool:
        """Before an uncertain retry, look for the generation's UNKNOWN attempts. True once a
        complete search that started after the retry came due missed every one of them;
        False while that look is still to be done (it is asked for here). A search that finds
        one records it PUBLISHED (`settle`), which ends the retry."""
        topic = self.destination.topic_for(message.queue, tenant=message.tenant)
        prefix = attempt_prefix(message.message_id, message.generation).encode()
        unchecked: list[Want] = []
        for _key, value in view.range(Table.ATTEMPTS, prefix, prefix + b"\xff"):
            assert isinstance(value, Attempt)
            if value.status is not AttemptStatus.UNKNOWN:
                continue
            if self._looked.get(value.attempt_id, -1) < message.action_at_ms:
                lookup = Lookup(value.attempt_id, topic, value.admitted_at_ms)
                unchecked.append(Want(lookup, "attempt", value.fence_id))
        if unchecked:
            self.settler.want(unchecked)
            return False
        return True

    def settle(self, now_ms: int) -> list[Appendable]:
        """What finished searches prove, as records: PUBLISHED where the attempt was found;
        NOT_PUBLISHED with its proof where its fence proves it absent; for a PUBLISHING
        attempt of recovery that nothing proves either way, UNKNOWN (or, if its fence can
        still prove it, another search). Attempts no longer open are left alone."""
        items: list[Appendable] = []
        results = self.settler.step(now_ms)
        if not results:
            return items
        again: list[Want] = []
        with self.store.read() as view:
            for settled in results:
                want = settled.want
                if want.kind == "dead_letter":
                    self.dead_letters.looked(settled)
                    continue
                aid = want.lookup.attempt_id
                attempt = view.get(Table.ATTEMPTS, str_key(aid))
                if not isinstance(attempt, Attempt) or attempt.status not in _OPEN:
                    self._recovered_one(aid, "resolved", now_ms)
                    continue
                result = self._settled_result(settled, attempt, again)
                if result is None:
                    continue
                name = str(type(result).__struct_config__.tag)
                self.log.info(
                    "settled_attempt", attempt_id=aid, result=name, recovery=aid in self.recovering
                )
                self._recovered_one(aid, name, now_ms)
                record = PublishOutcome(aid, attempt.message_id, attempt.generation, result)
                items.append((record, None))
        self.settler.want(again)
        return items

    def _settled_result(
        self, settled: Settled, attempt: Attempt, again: list[Want]
    ) -> Published | NotPublished | Unknown | None:
        if settled.evidence is not None:
            return Published(settled.evidence)
        aid = attempt.attempt_id
        if attempt.status is AttemptStatus.UNKNOWN:
            # Only positive evidence resolves UNKNOWN; a complete miss lets a retry go.
            if settled.complete:
                self._looked[aid] = settled.started_ms
            return None
        if settled.proof is not None:
            why = f"not in the committed records after the fence of {settled.proof.fence_id}"
            return proven_absent(settled.proof, why)
        if aid not in self.recovering:
            return None  # a live attempt looked for by someone else: its send reports it
        fence_id = fence_id_for(self.destination, settled.want.lookup.topic)
        fenced = attempt.fence_id is not None and attempt.fence_id == fence_id
        if fenced and not settled.complete:
            # Its fence can still prove it absent once a search completes: never guess. (A
            # complete search under its fence that proves nothing never will: the fence does
            # not cover it, as a local destination's does not cover what it sent itself.)
            again.append(settled.want)
            return None
        return Unknown("send_gate_lost", "the owner restarted before this attempt's outcome")

    def _recovered_one(self, attempt_id: str, result: str, now_ms: int) -> None:
        if attempt_id not in self.recovering:
            return
        self.recovering.discard(attempt_id)
        self._counts[result] = self._counts.get(result, 0) + 1
        if not self.recovering:
            self.log.info(
                "recovery_settled",
                took_ms=now_ms - self._started_ms,
                **{k.lower(): v for k, v in sorted(self._counts.items())},
            )

    def _open_attempts(self, view: StoreView, status: AttemptStatus) -> list[Want]:
        """A lookup for every open attempt in `status`."""
        wants: list[Want] = []
        for key, ob in view.items(Table.OBLIGATIONS):
            assert isinstance(ob, Obligation)
            attempt = view.get(Table.ATTEMPTS, key)
            assert isinstance(attempt, Attempt)
            if attempt.status is not status:
                continue
            message = view.get(Table.MESSAGES, str_key(ob.message_id))
            assert isinstance(message, Message)
            topic = self.destination.topic_for(message.queue, tenant=message.tenant)
            lookup = Lookup(attempt.attempt_id, topic, ob.admitted_at_ms)
            wants.append(Want(lookup, "attempt", attempt.fence_id))
        return wants
