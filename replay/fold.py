"""Deterministic replay: `kernel.reduce` folded over a log source, and what it proves.

Theory of operation: replay needs nothing but the entries and the kernel configuration. It
folds them into a `MemoryStore` (starting empty, or from a snapshot when the log was
compacted), or into a scratch LMDB store when the state is larger than memory should hold
(`replay.disk`), and reports the state digest, the counters, how many entries got each outcome
code, and above all the open obligations: attempts that are PUBLISHING or UNKNOWN and so may
exist at the destination.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable

import msgspec

from nereus.kernel.config import KernelConfig
from nereus.kernel.digest import state_digest
from nereus.kernel.effects import Effect, EntryOutcome
from nereus.kernel.model import Attempt, Counters, Obligation, Table
from nereus.kernel.records import LogEntry
from nereus.kernel.state import State
from nereus.storage.memory import MemoryStore


class ObligationView(msgspec.Struct, frozen=True):
    attempt_id: str
    message_id: str
    generation: int
    status: str
    destination: str
    admitted_position: int
    admitted_at_ms: int


class ReplayResult(msgspec.Struct, frozen=True):
    position: int
    entries_folded: int
    digest: str
    counters: Counters
    outcome_counts: dict[str, int]
    obligations: list[ObligationView]


def obligations(state: State) -> list[ObligationView]:
    out: list[ObligationView] = []
    for key, value in state.items(Table.OBLIGATIONS):
        assert isinstance(value, Obligation)
        attempt = state.attempt(key)
        assert isinstance(attempt, Attempt), f"obligation {key!r} without attempt"
        out.append(
            ObligationView(
                attempt_id=key.decode(),
                message_id=value.message_id,
                generation=value.generation,
                status=str(attempt.status),
                destination=value.destination,
                admitted_position=value.admitted_position,
                admitted_at_ms=value.admitted_at_ms,
            )
        )
    out.sort(key=lambda o: o.admitted_position)
    return out


def replay(
    entries: Iterable[LogEntry],
    config: KernelConfig,
    *,
    start: MemoryStore | None = None,
    on_entry: Callable[[int], None] | None = None,
) -> tuple[MemoryStore, ReplayResult]:
    store = start or MemoryStore(config)
    counts: Counter[str] = Counter()

    def observe(entry: LogEntry, effects: tuple[Effect, ...]) -> None:
        for effect in effects:
            if isinstance(effect, EntryOutcome):  # one per record, or per batch item
                counts[str(effect.code)] += 1
        if on_entry is not None:
            on_entry(entry.position)

    folded = store.feed(entries, observe)
    return store, result_of(store.state, folded, counts)


def result_of(state: State, folded: int, counts: Counter[str]) -> ReplayResult:
    """What a replay reports about the state it reached."""
    return ReplayResult(
        position=state.meta.position,
        entries_folded=folded,
        digest=state_digest(state),
        counters=state.meta.counters,
        outcome_counts=dict(sorted(counts.items())),
        obligations=obligations(state),
    )
