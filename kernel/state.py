"""Shard state as an immutable base plus a small persistent overlay.

Theory of operation: the reducer must be pure, yet the shard may hold millions of live
timers; one big persistent map is too slow at that size (see ARCHITECTURE.md). So a `State`
is a read-only `StateBase` (an LMDB read transaction, or a plain mapping) with a persistent
overlay holding only what the current batch changed. Reads look in the overlay, then the
base. After storage durably writes `changes()`, it calls `rebase()` with a base that already
contains them, and the overlay starts empty again: memory is bounded by the batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Final, Protocol, TypeVar, final

import msgspec

from nereus.kernel.config import KernelConfig
from nereus.kernel.model import (
    Attempt,
    DeadLetterPending,
    Lane,
    Message,
    Obligation,
    PayloadRef,
    ShardMeta,
    Table,
    TenantUsage,
    TimelineWork,
    Value,
)
from nereus.kernel.overlay import Overlay as PersistentOverlay


class StateBase(Protocol):
    """The read side storage must offer. Implementations must not change while a State
    built on them is in use (an LMDB read transaction is a snapshot by construction)."""

    def get(self, table: Table, key: bytes) -> Value | None: ...

    def items(self, table: Table) -> Iterator[tuple[bytes, Value]]:
        """All rows of a table in ascending key order."""
        ...


@final
class MappingBase:
    """A StateBase over plain mappings, for tests and in-memory replay."""

    __slots__ = ("_tables",)

    def __init__(self, tables: Mapping[Table, Mapping[bytes, Value]] | None = None) -> None:
        self._tables: Mapping[Table, Mapping[bytes, Value]] = tables or {}

    def get(self, table: Table, key: bytes) -> Value | None:
        rows = self._tables.get(table)
        return None if rows is None else rows.get(key)

    def items(self, table: Table) -> Iterator[tuple[bytes, Value]]:
        rows = self._tables.get(table, {})
        for key in sorted(rows):
            yield key, rows[key]


EMPTY_BASE: Final = MappingBase()


class _Deleted:
    """Overlay tombstone: the row is deleted in this batch even if the base has it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "DELETED"


DELETED: Final = _Deleted()

OverlayValue = Value | _Deleted
Overlay = PersistentOverlay[tuple[Table, bytes], OverlayValue]

V = TypeVar("V", bound=Value)


class State(msgspec.Struct, frozen=True):
    """Immutable: every change makes a new State sharing the base and most of the overlay."""

    config: KernelConfig
    meta: ShardMeta
    base: StateBase = EMPTY_BASE
    overlay: Overlay = msgspec.field(default_factory=PersistentOverlay)

    @classmethod
    def initial(cls, config: KernelConfig | None = None) -> State:
        return cls(config or KernelConfig(), ShardMeta())

    def __repr__(self) -> str:
        return f"State(position={self.meta.position}, overlay={len(self.overlay)} rows)"

    # Reads -------------------------------------------------------------------------------

    def get(self, table: Table, key: bytes) -> Value | None:
        found = self.overlay.get((table, key))
        if found is None:
            return self.base.get(table, key)
        if isinstance(found, _Deleted):
            return None
        return found

    def _typed(self, table: Table, key: bytes, kind: type[V]) -> V | None:
        value = self.get(table, key)
        if value is not None and not isinstance(value, kind):
            raise TypeError(f"{table} row {key!r} holds {type(value).__name__}")
        return value

    def message(self, key: bytes) -> Message | None:
        return self._typed(Table.MESSAGES, key, Message)

    def attempt(self, key: bytes) -> Attempt | None:
        return self._typed(Table.ATTEMPTS, key, Attempt)

    def obligation(self, key: bytes) -> Obligation | None:
        return self._typed(Table.OBLIGATIONS, key, Obligation)

    def lane(self, key: bytes) -> Lane | None:
        return self._typed(Table.LANES, key, Lane)

    def payload(self, key: bytes) -> PayloadRef | None:
        return self._typed(Table.PAYLOADS, key, PayloadRef)

    def timeline(self, key: bytes) -> TimelineWork | None:
        return self._typed(Table.TIMELINE, key, TimelineWork)

    def usage(self, key: bytes) -> TenantUsage | None:
        return self._typed(Table.USAGE, key, TenantUsage)

    def dead_letter(self, key: bytes) -> DeadLetterPending | None:
        return self._typed(Table.DEAD_LETTERS, key, DeadLetterPending)

    def items(self, table: Table) -> Iterator[tuple[bytes, Value]]:
        """Merged rows in key order. Walks the whole base: for audits and tests, not for
        the hot path. The base streams in key order and the overlay's few changes are merged
        into it, so a table larger than memory (an LMDB base) is never held whole."""
        changed = sorted(((k, v) for (t, k), v in self.overlay.items() if t == table), key=_first)
        i = 0
        for key, value in self.base.items(table):
            while i < len(changed) and changed[i][0] <= key:
                at, change = changed[i]
                i += 1
                if not isinstance(change, _Deleted):
                    yield at, change
                if at == key:
                    break
            else:
                yield key, value
        for at, change in changed[i:]:
            if not isinstance(change, _Deleted):
                yield at, change

    # Writes (each returns a new State) ---------------------------------------------------

    def with_changes(self, meta: ShardMeta, overlay: Overlay) -> State:
        return State(self.config, meta, self.base, overlay)

    def changes(self) -> Iterator[tuple[Table, bytes, Value | None]]:
        """What this batch changed, for storage: None means delete."""
        # DELETED is the only tombstone there is (`_Deleted` is made nowhere else).
        changed: Iterator[tuple[Table, bytes, Value | None]] = self.overlay.flat_items(DELETED)
        return changed

    def rebase(self, base: StateBase) -> State:
        """A State over `base`, which must already contain `changes()`."""
        return State(self.config, self.meta, base, PersistentOverlay())


def _first(row: tuple[bytes, OverlayValue]) -> bytes:
    return row[0]
