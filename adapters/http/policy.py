"""Whether a tenant's batch may go in: its rate, then for a batch that produces the blocks,
its quota and the storage.

Theory of operation: the checks run in a fixed order and the first refusal answers (specs/
http.md, "Blocked for producing"): rate (429), admin/operator block (403), quota (403),
storage (503). A refused producing batch carries the hint header naming the route that always
works (DELETE). The usage and the map fill are read by the caller (they may need a thread)
and handed in, so everything here is a plain decision over values.
"""

from __future__ import annotations

from nereus.adapters.http.contract import HINT_HEADER, HINT_VALUE, STORAGE_FULL_FRACTION
from nereus.adapters.http.errors import ApiError
from nereus.adapters.metering import Blocks, RateLimiter, retry_after_s
from nereus.adapters.tenancy import Principal, Tenancy, TenantPolicy
from nereus.kernel.model import TenantUsage

_HINT = ((HINT_HEADER, HINT_VALUE),)


class Policy:
    def __init__(self, tenancy: Tenancy, rates: RateLimiter, blocks: Blocks) -> None:
        self.tenancy = tenancy
        self.rates = rates
        self.blocks = blocks

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

    def check_quota(self, who: Principal, usage: TenantUsage) -> None:
        policy = self.tenant(who)
        over = []
        if policy.max_live_timers is not None and usage.live >= policy.max_live_timers:
            over.append(f"{usage.live} live timers of {policy.max_live_timers}")
        if policy.max_bytes is not None and usage.bytes >= policy.max_bytes:
            over.append(f"{usage.bytes} payload bytes of {policy.max_bytes}")
        if over:
            raise ApiError(
                "over_quota",
                f"tenant {who.tenant!r} is at its quota ({'; '.join(over)}); cancel timers "
                "to produce again",
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
