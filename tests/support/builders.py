"""Builders for kernel tests: records with sensible defaults and a small shard harness.

`Shard` appends records at dense positions with a persistence time the test controls, keeps
every step's effects, and checks the invariants after each step.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from nereus import kernel as k
from nereus.kernel.effects import Effect, EntryOutcome, Publish

DIGEST = hashlib.sha256(b"payload").hexdigest()
OTHER_DIGEST = hashlib.sha256(b"other payload").hexdigest()
T0_MS = 1_780_000_000_000
TENANT = "acme"
QUEUE = "reminders"


def schedule(
    key: str = "k1",
    *,
    txn: str = "txn-1",
    delay_ms: int | None = 1_000,
    deliver_at_ms: int | None = None,
    tenant: str = TENANT,
    queue: str = QUEUE,
    digest: str = DIGEST,
    size: int = 7,
    **kwargs: object,
) -> k.Schedule:
    if deliver_at_ms is not None:
        delay_ms = None
    return k.Schedule(
        tenant,
        queue,
        key,
        txn,
        digest,
        size,
        deliver_at_ms=deliver_at_ms,
        delay_ms=delay_ms,
        **kwargs,  # type: ignore[arg-type]
    )


def mid(key: str = "k1", tenant: str = TENANT, queue: str = QUEUE) -> str:
    return k.message_id(tenant, queue, key)


def records(entries: Iterable[k.LogEntry]) -> list[k.Record]:
    """The records a log holds, each batch record as the single records its items mean."""
    return [r for e in entries for r in k.members(e.record)]


def interval_at(now_ms: int, error_ms: int = 5) -> k.TrustedInterval:
    return k.TrustedInterval(now_ms - error_ms, now_ms + error_ms)


@dataclass
class Shard:
    """A kernel state plus the bookkeeping a test needs to drive it."""

    config: k.KernelConfig = field(default_factory=k.KernelConfig)
    now_ms: int = T0_MS
    check_invariants: bool = True
    state: k.State = field(init=False)
    history: list[tuple[k.LogEntry, tuple[Effect, ...]]] = field(default_factory=list)
    _attempt_seq: int = 0

    def __post_init__(self) -> None:
        self.state = k.State.initial(self.config)

    @property
    def position(self) -> int:
        return self.state.meta.position

    def apply(self, record: k.Record, *, at_ms: int | None = None) -> EntryOutcome:
        if at_ms is not None:
            self.now_ms = at_ms
        entry = k.LogEntry(self.position + 1, self.now_ms, record)
        self.state, effects = k.reduce(self.state, entry)
        self.history.append((entry, effects))
        if self.check_invariants:
            k.assert_invariants(self.state)
        outcome = effects[0]
        assert isinstance(outcome, EntryOutcome)
        return outcome

    @property
    def last_effects(self) -> tuple[Effect, ...]:
        return self.history[-1][1]

    def message(self, key: str = "k1") -> k.Message | None:
        return self.state.message(mid(key).encode())

    def admission(
        self,
        key: str = "k1",
        *,
        attempt_id: str | None = None,
        interval: k.TrustedInterval | None = None,
        granted: bool = True,
        fence_id: str | None = None,
    ) -> k.PublishAdmission:
        """An Admission for the message's current generation and version, as a worker that
        claimed it right now would propose it."""
        m = self.message(key)
        assert m is not None, f"no message {key}"
        self._attempt_seq += 1
        return k.PublishAdmission(
            message_id=m.message_id,
            generation=m.generation,
            version=m.version,
            attempt_id=attempt_id
            or f"{k.attempt_prefix(m.message_id, m.generation)}{self._attempt_seq}",
            claim_id=f"claim-{self._attempt_seq}",
            owner="node-a",
            descriptor_hash="d" * 16,
            capability=m.capability,
            interval=interval or interval_at(self.now_ms),
            capacity=k.Capacity(granted),
            fence_id=fence_id,
        )

    def admit(self, key: str = "k1", *, fence_id: str | None = None) -> str:
        """Move time to the message's actionAt and admit it; returns the attempt id."""
        m = self.message(key)
        assert m is not None
        self.now_ms = max(self.now_ms, m.action_at_ms + 10)
        record = self.admission(key, fence_id=fence_id)
        outcome = self.apply(record)
        assert outcome.code is k.Code.ADMITTED, outcome
        return record.attempt_id

    def outcome(
        self, attempt_id: str, result: k.Published | k.NotPublished | k.Unknown
    ) -> k.PublishOutcome:
        attempt = self.state.attempt(attempt_id.encode())
        assert attempt is not None
        return k.PublishOutcome(attempt_id, attempt.message_id, attempt.generation, result)

    def publishes(self) -> list[Publish]:
        return [e for _, effects in self.history for e in effects if isinstance(e, Publish)]


def published(offset: int = 0, at_ms: int = T0_MS) -> k.Published:
    return k.Published(k.Evidence("reminders", 0, offset, at_ms))


def not_published(disposition: str = "retriable", error: str = "broker_down") -> k.NotPublished:
    return k.NotPublished(disposition, error)  # type: ignore[arg-type]


FENCE = "nereus-dest.test"


def proven_absent(fence_id: str = FENCE) -> k.NotPublished:
    """Absence proven after the fact: the attempt's producer fenced, the committed view read."""
    proof = k.AbsenceProof(fence_id, T0_MS, "reminders[0]@0")
    return k.NotPublished("retriable", "absent_after_fence", proof=proof)


def unknown(reason: str = "timeout") -> k.Unknown:
    return k.Unknown(reason)


def tables(state: k.State) -> dict[k.Table, list[tuple[bytes, object]]]:
    """Every row of every table in key order: compare two of these to see what changed."""
    return {table: list(state.items(table)) for table in k.Table}


def obligations(state: k.State) -> set[str]:
    """The attempt ids with an open obligation."""
    return {key.decode() for key, _ in state.items(k.Table.OBLIGATIONS)}


def expiry_proof(shard: Shard, key: str = "k1") -> k.Expire:
    """An Expire of the message's current generation and version whose evidence proves that
    expireAt passed: persisted at expireAt (or later, if the shard's time already is), with
    the interval's earliest bound at expireAt. Only the message's status can refuse it."""
    m = shard.message(key)
    assert m is not None, f"no message {key}"
    shard.now_ms = max(shard.now_ms, m.expire_at_ms)
    interval = k.TrustedInterval(m.expire_at_ms, m.expire_at_ms + 10)
    return k.Expire(m.message_id, m.generation, m.version, interval)
