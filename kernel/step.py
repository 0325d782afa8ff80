"""One reducer step's scratch space.

Theory of operation: a handler needs to read state, stage several row changes, keep the
counters in step with status changes, and emit effects. `Step` collects all of that while the
handler runs and `finish()` freezes it into a new `State`. The input State is never touched:
the overlay is a persistent map, so the old State still sees its own rows afterwards.
"""

from __future__ import annotations

import msgspec

from kernel.codes import POSITION_CODES, Code
from kernel.effects import Effect, EntryOutcome, RevokeClaim, TimelinePut, TimelineRemove
from kernel.keys import dead_letter_key, str_key, timeline_key, usage_key
from kernel.model import (
    ATTEMPT_COUNTER,
    LIVE_STATUSES,
    PAYLOAD_HOLDING,
    STATUS_COUNTER,
    Attempt,
    DeadLetterPending,
    Message,
    PayloadRef,
    Table,
    TenantUsage,
    TimelineWork,
    Value,
)
from kernel.records import Evidence, LogEntry, record_type
from kernel.state import DELETED, Overlay, State, _Deleted


class Step:
    __slots__ = (
        "bp_ms",
        "config",
        "counter_deltas",
        "effects",
        "entry",
        "outcome",
        "overlay",
        "position",
        "shard_status",
        "state",
    )

    def __init__(self, state: State, entry: LogEntry) -> None:
        self.state = state
        self.entry = entry
        self.config = state.config
        self.position = entry.position
        self.bp_ms = entry.persisted_at_ms
        self.overlay: Overlay = state.overlay
        self.shard_status = state.meta.shard_status
        self.counter_deltas: dict[str, int] = {}
        self.effects: list[Effect] = []
        self.outcome: EntryOutcome | None = None

    # Reads ---------------------------------------------------------------------------------

    def get(self, table: Table, key: bytes) -> Value | None:
        found = self.overlay.get((table, key))
        if found is None:
            return self.state.base.get(table, key)
        if isinstance(found, _Deleted):
            return None
        return found

    def message(self, message_id: str) -> Message | None:
        value = self.get(Table.MESSAGES, str_key(message_id))
        assert value is None or isinstance(value, Message)
        return value

    def attempt(self, attempt_id: str) -> Attempt | None:
        value = self.get(Table.ATTEMPTS, str_key(attempt_id))
        assert value is None or isinstance(value, Attempt)
        return value

    # Writes --------------------------------------------------------------------------------

    def put(self, table: Table, key: bytes, value: Value) -> None:
        self.overlay = self.overlay.set((table, key), value)

    def delete(self, table: Table, key: bytes) -> None:
        self.overlay = self.overlay.set((table, key), DELETED)

    def _count(self, name: str, delta: int) -> None:
        self.counter_deltas[name] = self.counter_deltas.get(name, 0) + delta

    def put_message(self, old: Message | None, new: Message) -> None:
        """Stores `new` and keeps the status counters, payload references and tenant usage
        consistent with the change from `old`."""
        assert old is None or old.message_id == new.message_id
        if old is not None:
            self._count(STATUS_COUNTER[old.status], -1)
        self._count(STATUS_COUNTER[new.status], +1)
        old_holds = old is not None and old.status in PAYLOAD_HOLDING
        new_holds = new.status in PAYLOAD_HOLDING
        if (
            old is not None
            and old_holds
            and (not new_holds or old.payload_digest != new.payload_digest)
        ):
            self._release_payload(old.payload_digest)
        if new_holds and (old is None or not old_holds or old.payload_digest != new.payload_digest):
            self._acquire_payload(new.payload_digest, new.payload_size)
        old_live = old is not None and old.status in LIVE_STATUSES
        new_live = new.status in LIVE_STATUSES
        live_delta = int(new_live) - int(old_live)
        bytes_delta = (new.payload_size if new_live else 0) - (
            old.payload_size if old is not None and old_live else 0
        )
        if live_delta or bytes_delta:
            self._adjust_usage(new.tenant, live_delta, bytes_delta)
        self.put(Table.MESSAGES, str_key(new.message_id), new)

    def put_attempt(self, old: Attempt | None, new: Attempt) -> None:
        if old is not None:
            self._count(ATTEMPT_COUNTER[old.status], -1)
        self._count(ATTEMPT_COUNTER[new.status], +1)
        self.put(Table.ATTEMPTS, str_key(new.attempt_id), new)

    def dead_letter(self, message_id: str, generation: int) -> DeadLetterPending | None:
        value = self.get(Table.DEAD_LETTERS, dead_letter_key(message_id, generation))
        assert value is None or isinstance(value, DeadLetterPending)
        return value

    def put_dead_letter(self, pending: DeadLetterPending) -> None:
        """Record a dead-letter copy as owed; it holds the payload bytes until written."""
        self._count("dead_letters_pending", +1)
        self._acquire_payload(pending.payload_digest, pending.payload_size)
        self.put(
            Table.DEAD_LETTERS, dead_letter_key(pending.message_id, pending.generation), pending
        )

    def close_dead_letter(self, pending: DeadLetterPending) -> None:
        """The owed copy was written: drop the row and its payload reference."""
        self._count("dead_letters_pending", -1)
        self._release_payload(pending.payload_digest)
        self.delete(Table.DEAD_LETTERS, dead_letter_key(pending.message_id, pending.generation))

    def _adjust_usage(self, tenant: str, live_delta: int, bytes_delta: int) -> None:
        key = usage_key(tenant)
        row = self.get(Table.USAGE, key)
        assert row is None or isinstance(row, TenantUsage)
        live = (row.live if row else 0) + live_delta
        size = (row.bytes if row else 0) + bytes_delta
        assert live >= 0 and size >= 0, f"usage of tenant {tenant!r} would be negative"
        if live == 0 and size == 0:
            self.delete(Table.USAGE, key)
        else:
            self.put(Table.USAGE, key, TenantUsage(live, size))

    def _acquire_payload(self, digest: str, size: int) -> None:
        key = str_key(digest)
        ref = self.get(Table.PAYLOADS, key)
        assert ref is None or isinstance(ref, PayloadRef)
        self.put(Table.PAYLOADS, key, PayloadRef((ref.count if ref else 0) + 1, size))

    def _release_payload(self, digest: str) -> None:
        key = str_key(digest)
        ref = self.get(Table.PAYLOADS, key)
        assert isinstance(ref, PayloadRef) and ref.count > 0, f"payload {digest} not referenced"
        if ref.count == 1:
            self.delete(Table.PAYLOADS, key)
        else:
            self.put(Table.PAYLOADS, key, PayloadRef(ref.count - 1, ref.size))

    def put_timeline(self, message: Message, kind: str) -> None:
        key = timeline_key(message.action_at_ms, message.message_id, message.generation)
        work = TimelineWork(
            kind="retry" if kind == "retry" else "deliver",
            tenant=message.tenant,
            queue=message.queue,
            message_id=message.message_id,
            generation=message.generation,
            version=message.version,
            deliver_at_ms=message.deliver_at_ms,
            expire_at_ms=message.expire_at_ms,
            payload_size=message.payload_size,
        )
        self.put(Table.TIMELINE, key, work)
        self.effects.append(TimelinePut(key, message.action_at_ms, work))

    def remove_timeline(self, message: Message) -> None:
        key = timeline_key(message.action_at_ms, message.message_id, message.generation)
        self.delete(Table.TIMELINE, key)
        self.effects.append(TimelineRemove(key))

    def revoke(self, message: Message, reason: Code, claim_id: str | None = None) -> None:
        self.effects.append(RevokeClaim(message.message_id, message.generation, reason, claim_id))

    # Verdicts ------------------------------------------------------------------------------

    def applied(
        self,
        code: Code,
        message: Message | None = None,
        *,
        txn: str | None = None,
        attempt_id: str | None = None,
        evidence: Evidence | None = None,
    ) -> None:
        self._verdict(
            True, code=code, message=message, txn=txn, attempt_id=attempt_id, evidence=evidence
        )

    def rejected(
        self,
        code: Code,
        message: Message | None = None,
        *,
        txn: str | None = None,
        attempt_id: str | None = None,
        evidence: Evidence | None = None,
    ) -> None:
        self._verdict(
            False, code=code, message=message, txn=txn, attempt_id=attempt_id, evidence=evidence
        )

    def _verdict(
        self,
        applied: bool,
        *,
        code: Code,
        message: Message | None,
        txn: str | None,
        attempt_id: str | None,
        evidence: Evidence | None,
    ) -> None:
        assert self.outcome is None, "an entry gets exactly one outcome"
        self.outcome = EntryOutcome(
            position=self.position,
            record_type=record_type(self.entry.record),
            applied=applied,
            code=code,
            message_id=message.message_id if message else None,
            generation=message.generation if message else None,
            version=message.version if message else None,
            txn=txn if txn is not None else (message.txn if message else None),
            deliver_at_ms=message.deliver_at_ms if message else None,
            attempt_id=attempt_id,
            evidence=evidence,
        )

    def finish(self) -> tuple[State, tuple[Effect, ...]]:
        assert self.outcome is not None, "handler ended without an outcome"
        effects = (self.outcome, *self.effects)
        if self.outcome.code in POSITION_CODES:
            return self.state, effects
        meta = self.state.meta
        counters = meta.counters
        if self.counter_deltas:
            counters = msgspec.structs.replace(
                counters,
                **{
                    name: getattr(counters, name) + delta
                    for name, delta in self.counter_deltas.items()
                },
            )
        bp_ms = self.bp_ms if self.outcome.code is not Code.PERSISTED_AT_OUT_OF_RANGE else 0
        new_meta = msgspec.structs.replace(
            meta,
            position=self.position,
            last_persisted_at_ms=max(meta.last_persisted_at_ms, bp_ms),
            shard_status=self.shard_status,
            counters=counters,
        )
        return self.state.with_changes(new_meta, self.overlay), effects
