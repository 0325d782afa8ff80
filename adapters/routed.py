"""Destinations chosen per queue: some queues to Pulsar targets, the rest to another.

Theory of operation: a `RoutedDestination` is one `runtime.destination.Destination` made of
named targets (the local destination, Pulsar targets), with a queue -> target map (keys
`queue`, every tenant's, or `tenant/queue`, one tenant's, which wins) and a default target
for the queues not in it. Everything the runtime asks by tenant and queue (topic,
capability) goes to that queue's target; what it asks by topic (size limits, sends, evidence
lookups) goes to the target that owns the topic. Topics are given out by the targets
themselves (a Pulsar topic is a full `persistent://` name, a local one never is), so
a topic names exactly one target; a dead-letter topic (`<topic>.dlq`) belongs to the target
of its topic. Sends and lookups are split by target and each target's results are merged.

Targets are fenced apart: an attempt's Admission records the fence id of its topic's target
(`fence_id_for`; the local destination's, once it holds its directory's lock; None for a
Pulsar target), and a search is each target's own search, so an attempt is proven absent
only by its own target's fence and a complete read of that target (`SearchOutcome.parts`).
The set as a whole has no fence (`fence_id` None).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from nereus.kernel.keys import DEFAULT_TENANT
from nereus.kernel.records import IMMEDIATE, Capability, Evidence
from nereus.runtime.destination import (
    DLQ_SUFFIX,
    Destination,
    Lookup,
    Search,
    SearchOutcome,
    SearchPart,
    Send,
    SendResult,
    accepts,
    capability_for,
    fence_id_for,
)


class RoutedDestination:
    capability: Capability = IMMEDIATE
    fence_id: str | None = None

    def __init__(
        self,
        targets: Mapping[str, Destination],
        queues: Mapping[str, str],
        default: str,
        *,
        name: str = "routed",
    ) -> None:
        for key, target in queues.items():
            if target not in targets:
                raise ValueError(f"queue {key!r} is routed to an unknown target {target!r}")
        if default not in targets:
            raise ValueError(f"the default target {default!r} is not one of the targets")
        self.name = name
        self.targets = dict(targets)
        self.queues = dict(queues)
        self.default = default
        self._owners: dict[str, str] = {}

    def _target_name(self, queue: str, tenant: str) -> str:
        return self.queues.get(f"{tenant}/{queue}") or self.queues.get(queue) or self.default

    def target_of(self, queue: str, tenant: str = DEFAULT_TENANT) -> Destination:
        return self.targets[self._target_name(queue, tenant)]

    def open(self, store_id: str) -> None:
        for target in self.targets.values():
            target.open(store_id)

    def fence_id_for(self, topic: str) -> str | None:
        return fence_id_for(self._owner(topic), topic)

    def topic_for(self, queue: str, *, tenant: str = DEFAULT_TENANT) -> str:
        name = self._target_name(queue, tenant)
        topic = self.targets[name].topic_for(queue, tenant=tenant)
        owner = self._owners.setdefault(topic, name)
        if owner != name:
            raise ValueError(f"topic {topic!r} is given out by both {owner!r} and {name!r}")
        return topic

    def _owner(self, topic: str) -> Destination:
        name = self._owners.get(topic)
        if name is None and topic.endswith(DLQ_SUFFIX):
            name = self._owners.get(topic[: -len(DLQ_SUFFIX)])
        return self.targets[name if name is not None else self.default]

    def capability_for(self, queue: str, *, tenant: str = DEFAULT_TENANT) -> Capability:
        return capability_for(self.target_of(queue, tenant), queue, tenant=tenant)

    def accepts(self, queue: str, capability: Capability, *, tenant: str = DEFAULT_TENANT) -> bool:
        return accepts(self.target_of(queue, tenant), queue, capability, tenant=tenant)

    def max_record_bytes(self, topic: str) -> int:
        return self._owner(topic).max_record_bytes(topic)

    def submit(self, sends: Sequence[Send], now_ms: int) -> None:
        by_target: dict[int, tuple[Destination, list[Send]]] = {}
        for send in sends:
            target = self._owner(send.prepared.topic)
            by_target.setdefault(id(target), (target, []))[1].append(send)
        for target, group in by_target.values():
            target.submit(group, now_ms)

    def poll(self, timeout_s: float) -> list[SendResult]:
        results: list[SendResult] = []
        for target in self.targets.values():
            results.extend(target.poll(0))
        return results

    def search(self, lookups: Sequence[Lookup], wake: Callable[[], None]) -> Search:
        by_target: dict[int, tuple[Destination, list[Lookup]]] = {}
        for lookup in lookups:
            target = self._owner(lookup.topic)
            by_target.setdefault(id(target), (target, []))[1].append(lookup)
        parts = [
            (frozenset(lk.attempt_id for lk in group), target.search(group, wake))
            for target, group in by_target.values()
        ]
        return _AllSearches(parts)

    def close(self) -> None:
        for target in self.targets.values():
            target.close()


class _AllSearches:
    """One search made of each target's: done when all are, complete when all are; each
    attempt's proof is the one its own target's search carries."""

    def __init__(self, parts: list[tuple[frozenset[str], Search]]) -> None:
        self._parts = parts

    def done(self) -> bool:
        return all(part.done() for _, part in self._parts)

    def outcome(self) -> SearchOutcome:
        found: dict[str, Evidence] = {}
        complete = True
        errors: list[str] = []
        searched: list[str] = []
        parts: list[SearchPart] = []
        for attempt_ids, part in self._parts:
            outcome = part.outcome()
            parts.append(SearchPart(attempt_ids, outcome))
            found.update(outcome.found)
            complete = complete and outcome.complete
            if outcome.error:
                errors.append(outcome.error)
            if outcome.searched:
                searched.append(outcome.searched)
        return SearchOutcome(
            found,
            complete=complete,
            searched="; ".join(searched),
            error="; ".join(errors) or None,
            parts=tuple(parts),
        )

    def cancel(self) -> None:
        for _, part in self._parts:
            part.cancel()
