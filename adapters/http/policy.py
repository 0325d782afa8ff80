"""Whether a tenant's batch may go in: its rate, then for a batch that produces the blocks,
its quota and the storage.

Theory of operation: the checks run in a fixed order and the first refusal answers (specs/
http.md, "Blocked for producing"): rate (429), admin/operator block (403), quota (403),
storage (503). A refused producing batch carries the hint header naming the route that always
works (DELETE). The map fill is read by the caller (it may need a thread) and handed in.

The quota counts the batch itself: it is refused when the tenant is at its quota, or when
the durable usage, what concurrent batches hold (`metering.Reservations`) and the most this
batch can add (`quota_need`) together exceed it. A batch that passes holds its need until
its commit is answered, so concurrent batches never overshoot the quota together. The need
is a bound that reads no rows: each distinct key scheduled counts one live timer and its
largest stored payload, since the edge cannot know whether the key is live when the batch
commits (a live key's upsert adds nothing, a cancelled or delivered one's adds a timer).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet

from nereus.adapters import crypto
from nereus.adapters.http.batch import Checked, ScheduleOp
from nereus.adapters.http.contract import HINT_HEADER, HINT_VALUE, STORAGE_FULL_FRACTION
from nereus.adapters.http.errors import ApiError
from nereus.adapters.metering import (
    NOTHING,
    Blocks,
    RateLimiter,
    Reservation,
    Reservations,
    retry_after_s,
)
from nereus.adapters.tenancy import Principal, Tenancy, TenantPolicy
from nereus.kernel.model import TenantUsage

_HINT = ((HINT_HEADER, HINT_VALUE),)


def quota_need(
    checked: Sequence[Checked],
    queue_keys: Mapping[str, str],
    clear_headers: AbstractSet[str] = frozenset(),
) -> TenantUsage:
    """The most a batch can add to its tenant's usage: one live timer per distinct key it
    schedules, with the largest payload it gives that key as stored (sealed, for an
    encrypted queue, with the headers inside unless the queue is in `clear_headers`).
    Reschedules keep their payload and cancels only free room: zero."""
    sizes: dict[tuple[str, str], int] = {}
    for c in checked:
        op = c.op
        if isinstance(op, ScheduleOp):
            key_id = queue_keys.get(op.queue)
            size = len(c.payload)
            if key_id is not None:
                sealed = () if op.queue in clear_headers else c.headers
                size = crypto.sealed_size(key_id, size, sealed)
            key = (op.queue, op.timer_key)
            sizes[key] = max(sizes.get(key, 0), size)
    return TenantUsage(live=len(sizes), bytes=sum(sizes.values()))


def _credential(who: Principal) -> str:
    # NUL never occurs in a tenant name, so no two (tenant, subject) pairs share a key.
    return f"{who.tenant}\x00{who.subject or ''}"


class Policy:
    def __init__(
        self,
        tenancy: Tenancy,
        rates: RateLimiter,
        blocks: Blocks,
        reservations: Reservations | None = None,
    ) -> None:
        self.tenancy = tenancy
        self.rates = rates
        # DELETEs that append, by credential: buckets of their own, on the same clock.
        self.deletes = RateLimiter(rates.clock)
        self.blocks = blocks
        self.reservations = reservations or Reservations()

    def tenant(self, who: Principal) -> TenantPolicy:
        return self.tenancy.tenants[who.tenant]

    def take_rate(self, who: Principal, operations: int) -> None:
        policy = self.tenant(who)
        wait = self.rates.take(who.tenant, policy.max_ops_per_s, operations)
        if wait is not None:
            raise ApiError(
                "rate_limited",
                f"tenant {who.tenant!r} may send {policy.max_ops_per_s} operations per second",
                headers=(("Retry-After", str(retry_after_s(wait))),),
            )

    def take_delete(self, who: Principal) -> bool:
        """Take a token for a DELETE that appends, if the credential has one."""
        rate = self.tenant(who).max_appending_deletes_per_s
        return self.deletes.take(_credential(who), rate, 1) is None

    def refuse_delete(self, who: Principal) -> ApiError:
        """The answer to a DELETE that found no token and cancels no pending timer."""
        rate = self.tenant(who).max_appending_deletes_per_s
        # One token comes back every 1/rate seconds: the bucket was empty a moment ago.
        return ApiError(
            "rate_limited",
            f"this credential may append {rate} DELETEs per second (a pending timer's DELETE "
            "is never refused)",
            headers=(("Retry-After", str(retry_after_s(1.0 / rate))),),
        )

    def blocked(self, tenant: str) -> bool:
        """Blocked for producing by the operator or an admin (not by quota or storage)."""
        policy = self.tenancy.tenants[tenant]
        return self.tenancy.server.blocked or policy.blocked or self.blocks.get(tenant)

    def check_block(self, who: Principal) -> None:
        if self.blocked(who.tenant):
            raise ApiError(
                "produce_blocked",
                f"producing is blocked for tenant {who.tenant!r}; cancels still work",
                headers=_HINT,
            )

    def reserve_quota(
        self, who: Principal, need: TenantUsage, usage: Callable[[str], TenantUsage]
    ) -> Reservation:
        """Check the quota with the batch's `need` and hold it (release the reservation once
        the commit is answered); `usage(tenant)` reads the durable usage, and is called
        after what other batches hold has been read."""
        return self.reservations.reserve(
            who.tenant, need, lambda held: self.check_quota(who, usage(who.tenant), need, held)
        )

    def check_quota(
        self,
        who: Principal,
        usage: TenantUsage,
        need: TenantUsage = NOTHING,
        held: TenantUsage = NOTHING,
    ) -> None:
        """Refuse (403 over_quota) a tenant at its quota, or a batch that could take the
        usage, with what other batches `held`, past it."""
        policy = self.tenant(who)
        over = []
        for what, limit, used, pending, wanted in (
            ("live timers", policy.max_live_timers, usage.live, held.live, need.live),
            ("payload bytes", policy.max_bytes, usage.bytes, held.bytes, need.bytes),
        ):
            if limit is None:
                continue
            if used >= limit:
                over.append(f"{used} {what} of {limit}")
            elif used + pending + wanted > limit:
                held_now = f", {pending} held by batches being committed" if pending else ""
                over.append(f"{used} {what}{held_now} and {wanted} in this batch pass {limit}")
        if over:
            raise ApiError(
                "over_quota",
                f"tenant {who.tenant!r} has no room for this batch ({'; '.join(over)}); "
                "cancel timers, or send fewer, to produce again",
                headers=_HINT,
            )

    @staticmethod
    def check_storage(used: float) -> None:
        if used >= STORAGE_FULL_FRACTION:
            raise ApiError(
                "storage_full",
                f"storage is {used:.0%} full: producing is paused; cancels still work",
                headers=_HINT,
            )
