"""Settling open attempts by evidence, in bulk and in the background.

Theory of operation: whoever needs to know whether attempts reached the destination —
recovery after a restart or a takeover, reconciliation of UNKNOWN attempts, the look before
an uncertain retry, the look for a dead-letter copy whose write was uncertain — asks the
`Settler` for them (`want`). The settler runs one destination search at a time over every
lookup wanted so far, so a thousand open attempts cost one read of each partition, not a
thousand; lookups wanted while a search runs go into the next one. `step` is called once
per tick: it starts a search when none runs, and hands back what a finished one says about
each lookup. The search itself runs in the destination's own thread (or is an index read
and done at once), so the shard loop keeps answering commands and firing other work while
the destination is read, and the destination wakes the loop when it is done.

What a result means is the runtime's decision, not the settler's: it reports the evidence
found, the proof of absence the search carries for the lookup's fence id (see
`runtime.destination.SearchOutcome`), and whether the search was complete. A search that
failed or was incomplete makes the next one wait (`retry_ms`, doubling up to
`retry_max_ms`), so an unreachable destination is not hammered. The settler reads no clock:
the tick's time comes in as `now_ms`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from nereus.kernel.records import AbsenceProof, Evidence
from nereus.runtime.destination import Destination, Lookup, Search

WantKind = Literal["attempt", "dead_letter"]


@dataclass(frozen=True)
class Want:
    lookup: Lookup
    kind: WantKind
    # The fence the attempt was sent under (its Admission's), for the proof of absence.
    fence_id: str | None = None


@dataclass(frozen=True)
class Settled:
    want: Want
    evidence: Evidence | None
    proof: AbsenceProof | None  # set only when the record is absent and that is proven
    complete: bool  # the search read everything it meant to
    started_ms: int  # the tick time the search started at
    error: str | None = None


@dataclass
class _Running:
    search: Search
    wants: dict[str, Want]
    started_ms: int


class Settler:
    def __init__(
        self,
        destination: Destination,
        wake: Callable[[], None],
        *,
        retry_ms: int = 1_000,
        retry_max_ms: int = 30_000,
        max_lookups: int = 100_000,
    ) -> None:
        self.destination = destination
        self._wake = wake
        self._retry_ms = retry_ms
        self._retry_max_ms = retry_max_ms
        self._max_lookups = max_lookups
        self._queued: dict[str, Want] = {}
        self._running: _Running | None = None
        self._failures = 0
        self._retry_at_ms = 0

    def want(self, wants: Iterable[Want]) -> None:
        """Look for these in the next search (a lookup already waiting or being looked for
        is not added twice)."""
        running = self._running.wants if self._running is not None else {}
        for want in wants:
            aid = want.lookup.attempt_id
            if aid not in running:
                self._queued.setdefault(aid, want)

    def busy(self) -> bool:
        return self._running is not None or bool(self._queued)

    def wake_at_ms(self) -> int | None:
        """When `step` has something to start, if it must wait for the retry delay."""
        if self._running is None and self._queued:
            return self._retry_at_ms
        return None

    def step(self, now_ms: int) -> list[Settled]:
        """Collect a finished search; start the next one if lookups wait. A search that is
        over when made (an index read) is collected in the same call."""
        settled = self._collect(now_ms)
        if self._running is None and self._queued and now_ms >= self._retry_at_ms:
            take = list(self._queued.items())[: self._max_lookups]
            wants = dict(take)
            for aid, _ in take:
                del self._queued[aid]
            lookups = [w.lookup for w in wants.values()]
            search = self.destination.search(lookups, self._wake)
            self._running = _Running(search, wants, now_ms)
            settled.extend(self._collect(now_ms))
        return settled

    def _collect(self, now_ms: int) -> list[Settled]:
        running = self._running
        if running is None or not running.search.done():
            return []
        self._running = None
        outcome = running.search.outcome()
        if outcome.complete and outcome.error is None:
            self._failures = 0
        else:
            self._failures += 1
            delay_ms = min(self._retry_ms * 2 ** (self._failures - 1), self._retry_max_ms)
            self._retry_at_ms = now_ms + delay_ms
        settled: list[Settled] = []
        for aid, want in running.wants.items():
            evidence = outcome.found.get(aid)
            proof = outcome.proof_for(want.fence_id, aid) if evidence is None else None
            settled.append(
                Settled(want, evidence, proof, outcome.complete, running.started_ms, outcome.error)
            )
        return settled

    def close(self) -> None:
        if self._running is not None:
            self._running.search.cancel()
            self._running = None
        self._queued = {}
