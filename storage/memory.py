"""An in-memory store with the same apply contract as `ShardStore`.

Theory of operation: replay and tests need to fold a log without a disk. `MemoryStore` keeps
each table in a dict, folds a batch over a `MappingBase` of those dicts, then writes the
batch's overlay into them and rebases, exactly as the LMDB store does in one transaction.
The overlay therefore never holds more than one batch. It is not durable and holds every row
in Python objects, so it suits audits of logs that fit in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from nereus.kernel.config import KernelConfig
from nereus.kernel.effects import Effect
from nereus.kernel.keys import usage_key
from nereus.kernel.model import LIVE_STATUSES, TABLES, Message, ShardMeta, Table, TenantUsage, Value
from nereus.kernel.records import LogEntry
from nereus.kernel.reducer import reduce
from nereus.kernel.state import MappingBase, State

Observer = Callable[[LogEntry, tuple[Effect, ...]], None]


class MemoryStore:
    def __init__(
        self,
        config: KernelConfig | None = None,
        *,
        meta: ShardMeta | None = None,
        tables: dict[Table, dict[bytes, Value]] | None = None,
        batch_entries: int = 1000,
    ) -> None:
        self.config = config or KernelConfig()
        self.tables: dict[Table, dict[bytes, Value]] = tables or {t: {} for t in TABLES}
        self.batch_entries = batch_entries
        self._state = State(self.config, meta or ShardMeta(), MappingBase(self.tables))

    @property
    def meta(self) -> ShardMeta:
        return self._state.meta

    @property
    def state(self) -> State:
        """The current state. Valid until the next `apply`: the dicts under it change."""
        return self._state

    def apply(self, entries: Iterable[LogEntry]) -> list[tuple[LogEntry, tuple[Effect, ...]]]:
        results: list[tuple[LogEntry, tuple[Effect, ...]]] = []
        self.feed(entries, lambda entry, effects: results.append((entry, effects)))
        return results

    def feed(self, entries: Iterable[LogEntry], observe: Observer | None = None) -> int:
        """Fold entries without keeping their effects (beyond what `observe` keeps)."""
        count = 0
        state = self._state
        for entry in entries:
            state, effects = reduce(state, entry)
            if observe is not None:
                observe(entry, effects)
            count += 1
            if len(state.overlay) >= self.batch_entries:
                state = self._flush(state)
        self._state = self._flush(state)
        return count

    def _flush(self, state: State) -> State:
        for table, key, value in state.changes():
            rows = self.tables[table]
            if value is None:
                rows.pop(key, None)
            else:
                rows[key] = value
        return state.rebase(MappingBase(self.tables))

    # Reads the API needs, with the same answers as `storage.base.StoreView`. There is no
    # index here: a listing walks the messages (this store is for audits and tests).

    def tenant_usage(self, tenant: str) -> TenantUsage:
        value = self._state.get(Table.USAGE, usage_key(tenant))
        assert value is None or isinstance(value, TenantUsage)
        return value or TenantUsage(0, 0)

    def list_timers(
        self, tenant: str, queue: str, after: str | None, limit: int
    ) -> tuple[list[Message], bool]:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        floor = None if after is None else after.encode()
        found = sorted(
            (
                (m.timer_key.encode(), m)
                for _key, m in self._state.items(Table.MESSAGES)
                if isinstance(m, Message)
                and m.tenant == tenant
                and m.queue == queue
                and m.status in LIVE_STATUSES
                and (floor is None or m.timer_key.encode() > floor)
            ),
            key=lambda pair: pair[0],
        )
        return [m for _key, m in found[:limit]], len(found) > limit
