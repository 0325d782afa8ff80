"""Simulated clients: the commands submitted between ticks.

A small identity space (2 tenants x 2 queues x a few keys per seed) makes commands collide
with each other and with the fire: schedules of new keys, upserts of live ones (a changed
schedule on a pending key supersedes it), identical retries (same request, same txn), timing
reschedules, cancels (sometimes with a wrong expected version), lane gate flips and, rarely,
an operator pausing the shard. Timing is biased to the rules' edges: already due, due within
the window, lifetimes just over the minimum delivery window, absolute times in the past.
A few payloads are larger than the destination accepts, and a few schedules reference bytes
that were never stored, so claims fail permanently and messages reach DEAD_LETTERED.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from typing import NamedTuple

from nereus.kernel.config import KernelConfig
from nereus.kernel.records import Appendable, Cancel, LaneGate, Reschedule, Schedule, ShardState
from nereus.sim.destination import MAX_RECORD_BYTES

TENANTS = ("t0", "t1")
QUEUES = ("q0", "q1")
MISSING = b"bytes that were never stored"


class Timing(NamedTuple):
    deliver_at_ms: int | None = None
    delay_ms: int | None = None
    expire_at_ms: int | None = None
    lifetime_ms: int | None = None


class Client:
    def __init__(self, rng: random.Random, config: KernelConfig, stats: Counter[str]) -> None:
        self.rng = rng
        self.config = config
        self.stats = stats
        nkeys = rng.randint(3, 12)
        self.identities = [(t, q, f"k{i}") for t in TENANTS for q in QUEUES for i in range(nkeys)]
        self.lanes = [(t, q) for t in TENANTS for q in QUEUES]
        self.payloads = [f"payload-{i}".encode() for i in range(4)]
        self.payloads.append(b"x" * (MAX_RECORD_BYTES + 1))  # refused at claim: too large
        self._last: dict[tuple[str, str, str], Appendable] = {}
        self._touched: dict[tuple[str, str, str], int] = {}
        self._txns = 0

    def batch(self, now_ms: int) -> list[Appendable]:
        """One unit of 1-3 records, appended together."""
        return [self._one(now_ms) for _ in range(self.rng.choice((1, 1, 1, 2, 3)))]

    def _one(self, now_ms: int) -> Appendable:
        r = self.rng.random()
        ident = self.rng.choice(self.identities)
        if r < 0.45:
            # Mostly keys left alone for a while, so most generations run their course
            # rather than being superseded while pending.
            quiet = [i for i in self.identities if now_ms - self._touched.get(i, 0) > 20_000]
            if quiet and self.rng.random() < 0.7:
                ident = self.rng.choice(quiet)
            self._touched[ident] = now_ms
            return self._schedule(ident, now_ms)
        if r < 0.55 and ident in self._last:
            self.stats["cmd_identical_retry"] += 1
            return self._last[ident]
        if r < 0.68:
            return self._reschedule(ident, now_ms)
        if r < 0.85:
            self.stats["cmd_cancel"] += 1
            expected = self.rng.randint(0, 6) if self.rng.random() < 0.15 else None
            return Cancel(*ident, expected_version=expected), None
        if r < 0.98:
            self.stats["cmd_lane_gate"] += 1
            tenant, queue = self.rng.choice(self.lanes)
            if self.rng.random() < 0.3:
                return LaneGate(tenant, queue, "CLOSED", "sim"), None
            return LaneGate(tenant, queue, "OPEN", "sim"), None
        self.stats["cmd_shard_state"] += 1
        if self.rng.random() < 0.4:
            return ShardState("PAUSED", "sim"), None
        return ShardState("ACTIVE_FOR_COMMANDS", "sim"), None

    def _txn(self) -> str:
        self._txns += 1
        return f"txn-{self._txns}"

    def _when(self, now_ms: int) -> Timing:
        """deliverAt (relative or absolute) and maybe an expiry, biased to the edges."""
        rng = self.rng
        window = self.config.limits.min_delivery_window_ms
        delay = rng.choice((0, 0, rng.randint(1, 800), rng.randint(800, 4_000), 12_000))
        t = Timing(delay_ms=delay)
        if rng.random() < 0.3:  # absolute, from the client's own (skewed) clock
            t = Timing(deliver_at_ms=max(0, now_ms + rng.randint(-2_000, 4_000)))
        kind = rng.random()
        if kind < 0.35:  # tight: just over the minimum window after deliverAt
            lifetime = delay + window + rng.choice((0, 1, rng.randint(0, 3_000)))
            t = t._replace(lifetime_ms=lifetime)
        elif kind < 0.45:
            t = t._replace(expire_at_ms=now_ms + delay + window + rng.randint(-500, 3_000))
        return t

    def _schedule(self, ident: tuple[str, str, str], now_ms: int) -> Appendable:
        self.stats["cmd_schedule"] += 1
        payload = self.rng.choice(self.payloads)
        stored: bytes | None = payload
        if self.rng.random() < 0.03:
            payload, stored = MISSING, None  # the claim will prove the bytes missing
        t = self._when(now_ms)
        record = Schedule(
            *ident,
            txn=self._txn(),
            payload_digest=hashlib.sha256(payload).hexdigest(),
            payload_size=len(payload),
            partition_key=self.rng.choice((None, "p")),
            deliver_at_ms=t.deliver_at_ms,
            delay_ms=t.delay_ms,
            expire_at_ms=t.expire_at_ms,
            lifetime_ms=t.lifetime_ms,
        )
        item: Appendable = (record, stored)
        self._last[ident] = item
        return item

    def _reschedule(self, ident: tuple[str, str, str], now_ms: int) -> Appendable:
        self.stats["cmd_reschedule"] += 1
        t = self._when(now_ms)
        record = Reschedule(
            *ident,
            txn=self._txn(),
            deliver_at_ms=t.deliver_at_ms,
            delay_ms=t.delay_ms,
            expire_at_ms=t.expire_at_ms,
            lifetime_ms=t.lifetime_ms,
        )
        item: Appendable = (record, None)
        self._last[ident] = item
        return item
