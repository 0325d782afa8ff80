"""One reducer step's scratch space.

Theory of operation: a handler needs to read state, stage several row changes, keep the
counters in step with status changes, and emit effects. `Step` collects all of that while the
handler runs and `finish()` freezes it into a new `State`. The input State is never touched:
the overlay is a persistent map, so the old State still sees its own rows afterwards.

Writes are staged in a plain dict (`writes`) and reach the overlay in `finish()` as one
version: no State exists between two writes of one step, so nothing can observe the rows
one at a time, and a dict store is several times cheaper than a persistent-map version per
row (this is the replay hot path: a few row writes per entry, millions of entries). Reads
look in `writes` first, so a handler still sees its own earlier writes.
"""

from __future__ import annotations

from typing import Final, get_args

import msgspec

from nereus.kernel.codes import POSITION_CODES, Code
from nereus.kernel.effects import Effect, EntryOutcome, RevokeClaim, TimelinePut, TimelineRemove
from nereus.kernel.keys import dead_letter_key, str_key, timeline_key, usage_key
from nereus.kernel.model import (
    ATTEMPT_COUNTER,
    LIVE_STATUSES,
    PAYLOAD_HOLDING,
    STATUS_COUNTER,
    Attempt,
    Counters,
    DeadLetterPending,
    Message,
    PayloadRef,
    ShardMeta,
    Table,
    TenantUsage,
    TimelineWork,
    Value,
)
from nereus.kernel.records import Evidence, LogEntry, Record, record_type, record_type_of
from nereus.kernel.state import DELETED, Overlay, OverlayValue, State, _Deleted

# The tables every entry touches, as module globals: an Enum class attribute goes through
# EnumType.__getattr__'s slot on Python 3.11 (~0.1 us a lookup, four times a global's),
# and the reducer looks several up per entry.
_MESSAGES: Final = Table.MESSAGES
_ATTEMPTS: Final = Table.ATTEMPTS
_TIMELINE: Final = Table.TIMELINE
_USAGE: Final = Table.USAGE
_PAYLOADS: Final = Table.PAYLOADS

# Each record class's wire tag, read once: `record_type` asks msgspec for the class's
# struct config on every call. Anything else (a subclass) still goes through it.
_RECORD_TYPES: Final[dict[type, str]] = {cls: record_type_of(cls) for cls in get_args(Record)}

_COUNTER_INDEX: dict[str, int] = {name: i for i, name in enumerate(Counters.__struct_fields__)}


class Step:
    __slots__ = (
        "base",
        "bp_ms",
        "config",
        "counter_deltas",
        "done",
        "effects",
        "entry",
        "index",
        "item_tag",
        "outcome",
        "overlay",
        "position",
        "shard_status",
        "state",
        "writes",
    )

    def __init__(self, state: State, entry: LogEntry) -> None:
        self.state = state
        self.entry = entry
        self.config = state.config
        self.position = entry.position
        self.bp_ms = entry.persisted_at_ms
        self.overlay: Overlay = state.overlay
        self.base = state.base
        self.writes: dict[tuple[Table, bytes], OverlayValue] = {}
        self.shard_status = state.meta.shard_status
        self.counter_deltas: dict[str, int] = {}
        self.effects: list[Effect] = []
        self.outcome: EntryOutcome | None = None
        # A batch record's items are folded one after another in this one step; each item's
        # outcome and effects move to `done` when the next item begins (`begin_item`).
        self.done: list[Effect] | None = None
        self.index = 0
        self.item_tag: str | None = None

    def begin_item(self, index: int, tag: str) -> None:
        """The next item of a batch record (wire tag `tag`) is about to be decided."""
        self._close_item()
        self.index = index
        self.item_tag = tag

    def _close_item(self) -> None:
        if self.done is None:
            self.done = []
        if self.outcome is not None:
            self.done.append(self.outcome)
            self.done.extend(self.effects)
            self.outcome = None
            self.effects = []

    # Reads ---------------------------------------------------------------------------------

    def get(self, table: Table, key: bytes) -> Value | None:
        row = (table, key)
        found = self.writes.get(row)
        if found is None:
            found = self.overlay.get(row)
            if found is None:
                return self.base.get(table, key)
        if isinstance(found, _Deleted):
            return None
        return found

    def message(self, message_id: str) -> Message | None:
        value = self.get(_MESSAGES, message_id.encode())  # str_key, inlined: hot
        assert value is None or isinstance(value, Message)
        return value

    def attempt(self, attempt_id: str) -> Attempt | None:
        value = self.get(_ATTEMPTS, attempt_id.encode())  # str_key, inlined: hot
        assert value is None or isinstance(value, Attempt)
        return value

    # Writes --------------------------------------------------------------------------------

    def put(self, table: Table, key: bytes, value: Value) -> None:
        self.writes[(table, key)] = value

    def delete(self, table: Table, key: bytes) -> None:
        self.writes[(table, key)] = DELETED

    def _count(self, name: str, delta: int) -> None:
        self.counter_deltas[name] = self.counter_deltas.get(name, 0) + delta

    def put_message(self, old: Message | None, new: Message) -> None:
        """Stores `new` and keeps the status counters, payload references and tenant usage
        consistent with the change from `old`."""
        assert old is None or old.message_id == new.message_id
        deltas = self.counter_deltas  # `_count`, inlined: called on nearly every entry
        if old is not None:
            name = STATUS_COUNTER[old.status]
            deltas[name] = deltas.get(name, 0) - 1
        name = STATUS_COUNTER[new.status]
        deltas[name] = deltas.get(name, 0) + 1
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
        self.writes[(_MESSAGES, new.message_id.encode())] = new

    def put_attempt(self, old: Attempt | None, new: Attempt) -> None:
        deltas = self.counter_deltas  # `_count`, inlined: once per admission and outcome
        if old is not None:
            name = ATTEMPT_COUNTER[old.status]
            deltas[name] = deltas.get(name, 0) - 1
        name = ATTEMPT_COUNTER[new.status]
        deltas[name] = deltas.get(name, 0) + 1
        self.writes[(_ATTEMPTS, new.attempt_id.encode())] = new

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
        row = self.get(_USAGE, key)
        assert row is None or isinstance(row, TenantUsage)
        live = (row.live if row else 0) + live_delta
        size = (row.bytes if row else 0) + bytes_delta
        assert live >= 0 and size >= 0, f"usage of tenant {tenant!r} would be negative"
        if live == 0 and size == 0:
            self.delete(_USAGE, key)
        else:
            self.put(_USAGE, key, TenantUsage(live, size))

    def _acquire_payload(self, digest: str, size: int) -> None:
        key = str_key(digest)
        ref = self.get(_PAYLOADS, key)
        assert ref is None or isinstance(ref, PayloadRef)
        self.put(_PAYLOADS, key, PayloadRef((ref.count if ref else 0) + 1, size))

    def _release_payload(self, digest: str) -> None:
        key = str_key(digest)
        ref = self.get(_PAYLOADS, key)
        assert isinstance(ref, PayloadRef) and ref.count > 0, f"payload {digest} not referenced"
        if ref.count == 1:
            self.delete(_PAYLOADS, key)
        else:
            self.put(_PAYLOADS, key, PayloadRef(ref.count - 1, ref.size))

    def put_timeline(self, message: Message, kind: str) -> None:
        key = timeline_key(message.action_at_ms, message.message_id, message.generation)
        work = TimelineWork(  # positional, in field order: once per schedule
            "retry" if kind == "retry" else "deliver",
            message.tenant,
            message.queue,
            message.message_id,
            message.generation,
            message.version,
            message.deliver_at_ms,
            message.expire_at_ms,
            message.payload_size,
        )
        self.writes[(_TIMELINE, key)] = work
        self.effects.append(TimelinePut(key, message.action_at_ms, work))

    def remove_timeline(self, message: Message) -> None:
        key = timeline_key(message.action_at_ms, message.message_id, message.generation)
        self.writes[(_TIMELINE, key)] = DELETED
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
        assert self.outcome is None, "an entry (or a batch item) gets exactly one outcome"
        # Positional, in EntryOutcome's field order: once per entry, and msgspec matches
        # keyword arguments to fields one by one.
        tag = self.item_tag
        if tag is None:
            record = self.entry.record
            tag = _RECORD_TYPES.get(type(record)) or record_type(record)
        message_id: str | None = None
        generation: int | None = None
        version: int | None = None
        deliver_at_ms: int | None = None
        if message is not None:
            message_id = message.message_id
            generation = message.generation
            version = message.version
            deliver_at_ms = message.deliver_at_ms
            if txn is None:
                txn = message.txn
        self.outcome = EntryOutcome(
            self.position,
            tag,
            applied,
            code,
            message_id,
            generation,
            version,
            txn,
            deliver_at_ms,
            attempt_id,
            evidence,
            self.index,
        )

    def finish(self) -> tuple[State, tuple[Effect, ...]]:
        effects: tuple[Effect, ...]
        if self.done is not None:
            self._close_item()
            assert self.done, "a batch ended without outcomes"
            effects = tuple(self.done)
            bp_ms = self.bp_ms
        else:
            assert self.outcome is not None, "handler ended without an outcome"
            effects = (self.outcome, *self.effects)
            if self.outcome.code in POSITION_CODES:
                assert not self.writes, "a position verdict changes nothing"
                return self.state, effects
            bp_ms = self.bp_ms if self.outcome.code is not Code.PERSISTED_AT_OUT_OF_RANGE else 0
        meta = self.state.meta
        counters = meta.counters
        if self.counter_deltas:
            # Rebuilt positionally from its fields: cheaper than replace(**changes), and
            # every entry that changes a status pays it.
            values = list(msgspec.structs.astuple(counters))
            for name, delta in self.counter_deltas.items():
                values[_COUNTER_INDEX[name]] += delta
            counters = Counters(*values)
        # Every field is set: positional construction, cheaper than replace(**changes).
        last_ms = meta.last_persisted_at_ms
        new_meta = ShardMeta(
            self.position, bp_ms if bp_ms > last_ms else last_ms, self.shard_status, counters
        )
        overlay = self.overlay.set_many(self.writes) if self.writes else self.overlay
        return self.state.with_changes(new_meta, overlay), effects
