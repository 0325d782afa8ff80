"""Per-tenant metering, rate limiting and the admin block, as the HTTP edge keeps them.

Theory of operation:

* **Metering** counts one message per accepted promise: an operation whose result is
  `scheduled` or `rescheduled` (a new generation). An identical retry (`unchanged`), a
  cancel, a fire or a refusal counts zero and nothing is ever refunded. The counters live in
  the process (a Prometheus counter, `nereus_metered_messages_total{tenant=...}`), since
  process start; billing scrapes them.
* **Rate limit**: one token bucket per tenant, refilled at `max_ops_per_s` and holding one
  second's worth. A batch of n operations is let through when the bucket holds
  `min(n, capacity)` tokens and then takes n (the bucket may go into debt), so a batch larger
  than one second's worth is never refused forever and the long-run rate still holds. A
  refusal says when the tokens will be there (`Retry-After`, whole seconds, at least 1).
  DELETEs that append have buckets of their own, one per credential (tenant and token
  subject), refilled at the tenant's `max_appending_deletes_per_s` (`Policy.take_delete`).
* **Admin block**: a flag per tenant set by `PUT /api/v1/admin/block`, held in this
  process's memory (the durable block is `blocked` in the configuration).
* **Quota reservations**: what a producing batch may add to its tenant's usage (live
  timers, payload bytes) is reserved from the moment its quota check passes until its
  commit has been answered, so the check of a concurrent batch counts it while the durable
  usage does not yet. Checks of one tenant are serialised and each reads the reservations
  BEFORE the durable usage: a reservation released before that read belongs to a commit
  the usage read already sees, so no batch is ever counted by neither (it may be counted
  by both for a moment, which only refuses early). Held in this process's memory.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable

from nereus.kernel.model import TenantUsage
from nereus.runtime.metrics import Metrics

NOTHING = TenantUsage(live=0, bytes=0)

METERED = "nereus_metered_messages_total"


class Meter:
    def __init__(self, metrics: Metrics, tenants: Iterable[str]) -> None:
        self._metrics = metrics
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self.started_at_ms = int(time.time() * 1000)
        metrics.describe(
            METERED,
            "counter",
            "Messages metered per tenant: accepted schedule/reschedule operations (scheduled "
            "or rescheduled results); identical retries, cancels and fires count zero.",
        )
        for tenant in tenants:
            self.add(tenant, 0)  # every configured tenant is exported from the start

    def add(self, tenant: str, messages: int) -> None:
        with self._lock:
            self._counts[tenant] = self._counts.get(tenant, 0) + messages
        self._metrics.inc(METERED, float(messages), labels={"tenant": tenant})

    def count(self, tenant: str) -> int:
        with self._lock:
            return self._counts.get(tenant, 0)


class RateLimiter:
    """Token buckets by tenant; `rate` None means unlimited."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[str, tuple[float, float]] = {}  # tenant -> (tokens, at)

    def take(self, tenant: str, rate: float | None, n: int) -> float | None:
        """Take n tokens and return None, or return the seconds to wait before they are
        there (nothing taken)."""
        if rate is None or n <= 0:
            return None
        capacity = rate  # one second's worth
        now = self.clock()
        with self._lock:
            tokens, at = self._buckets.get(tenant, (capacity, now))
            tokens = min(capacity, tokens + (now - at) * rate)
            need = min(float(n), capacity)
            if tokens + 1e-9 < need:
                self._buckets[tenant] = (tokens, now)
                return (need - tokens) / rate
            self._buckets[tenant] = (tokens - n, now)
            return None


def retry_after_s(wait_s: float) -> int:
    return max(1, math.ceil(wait_s))


class Blocks:
    """Admin blocks on producing, by tenant (in memory)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blocked: set[str] = set()

    def set(self, tenant: str, blocked: bool) -> None:
        with self._lock:
            if blocked:
                self._blocked.add(tenant)
            else:
                self._blocked.discard(tenant)

    def get(self, tenant: str) -> bool:
        with self._lock:
            return tenant in self._blocked


class Reservations:
    """Quota reserved by batches between their check and their answer, by tenant."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards the two dicts
        self._checks: dict[str, threading.Lock] = {}
        self._held: dict[str, TenantUsage] = {}

    def reserve(
        self, tenant: str, need: TenantUsage, check: Callable[[TenantUsage], None]
    ) -> Reservation:
        """Call `check(held)` with what the tenant's other batches hold now; it reads the
        durable usage itself (after this read of `held`) and raises to refuse. When it
        returns, `need` is held until the reservation is released."""
        with self._lock:
            serial = self._checks.setdefault(tenant, threading.Lock())
        with serial:
            check(self.held(tenant))
            self._add(tenant, need, +1)
        return Reservation(self, tenant, need)

    def held(self, tenant: str) -> TenantUsage:
        with self._lock:
            return self._held.get(tenant, NOTHING)

    def _add(self, tenant: str, need: TenantUsage, sign: int) -> None:
        with self._lock:
            held = self._held.get(tenant, NOTHING)
            now = TenantUsage(held.live + sign * need.live, held.bytes + sign * need.bytes)
            assert now.live >= 0 and now.bytes >= 0, f"reservations of {tenant!r} below zero"
            if now == NOTHING:
                self._held.pop(tenant, None)
            else:
                self._held[tenant] = now


class Reservation:
    """One batch's hold on its tenant's quota; `release` once its commit is answered (or
    failed). Releasing twice releases once."""

    def __init__(self, owner: Reservations, tenant: str, need: TenantUsage) -> None:
        self._owner = owner
        self._tenant = tenant
        self._need: TenantUsage | None = need

    def release(self) -> None:
        need, self._need = self._need, None
        if need is not None:
            self._owner._add(self._tenant, need, -1)
