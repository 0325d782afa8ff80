"""Two-level bounded deficit round robin: tenants, then lanes (queues) within a tenant.

Theory of operation: each visit adds a quantum to a tenant's deficit and to the visited
lane's deficit; a lane may serve at most min(its deficit, its tenant's deficit, the tick's
remaining budget) items. A lane or tenant with nothing due forfeits its deficit, as in
classic DRR, so idle time is not banked into a burst. The rotation positions survive between
ticks, so the next tick resumes after the last lane served instead of at the beginning: a hot
lane early in the order cannot take every tick, and any lane with due work is served after
at most one quantum of each other lane.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

Lane = tuple[str, str]  # (tenant, queue)
Take = Callable[[Lane, int], int]  # serve up to n from lane; return how many were served


class DeficitRoundRobin:
    def __init__(self, tenant_quantum: int, lane_quantum: int) -> None:
        if tenant_quantum < 1 or lane_quantum < 1:
            raise ValueError("quanta must be >= 1")
        self.tenant_quantum = tenant_quantum
        self.lane_quantum = lane_quantum
        self._tenants: list[str] = []
        self._lanes: dict[str, list[str]] = {}
        self._tenant_pos = 0
        self._lane_pos: dict[str, int] = {}
        self._tenant_deficit: dict[str, int] = {}
        self._lane_deficit: dict[Lane, int] = {}

    def sync(self, lanes: Iterable[Lane]) -> None:
        """Make the rings match the lanes that currently have work; new lanes join at the
        end of their ring, so they wait at most one round."""
        wanted: dict[str, list[str]] = {}
        for tenant, queue in lanes:
            wanted.setdefault(tenant, []).append(queue)
        for tenant in [t for t in self._tenants if t not in wanted]:
            self._drop_tenant(tenant)
        for tenant, queues in wanted.items():
            if tenant not in self._lanes:
                self._tenants.append(tenant)
                self._lanes[tenant] = []
                self._lane_pos[tenant] = 0
                self._tenant_deficit[tenant] = 0
            ring = self._lanes[tenant]
            keep = set(queues)
            for q in [q for q in ring if q not in keep]:
                self._drop_lane(tenant, q)
            for q in queues:
                if q not in ring:
                    ring.append(q)
                    self._lane_deficit[(tenant, q)] = 0

    def _drop_tenant(self, tenant: str) -> None:
        index = self._tenants.index(tenant)
        self._tenants.pop(index)
        if index < self._tenant_pos:
            self._tenant_pos -= 1
        for q in self._lanes.pop(tenant):
            self._lane_deficit.pop((tenant, q), None)
        self._lane_pos.pop(tenant, None)
        self._tenant_deficit.pop(tenant, None)
        if self._tenants:
            self._tenant_pos %= len(self._tenants)
        else:
            self._tenant_pos = 0

    def _drop_lane(self, tenant: str, queue: str) -> None:
        ring = self._lanes[tenant]
        index = ring.index(queue)
        ring.pop(index)
        if index < self._lane_pos[tenant]:
            self._lane_pos[tenant] -= 1
        self._lane_pos[tenant] = self._lane_pos[tenant] % len(ring) if ring else 0
        self._lane_deficit.pop((tenant, queue), None)

    def run(self, budget: int, take: Take) -> int:
        """Serve up to `budget` items in DRR order; returns how many were served."""
        served = 0
        while budget - served > 0 and self._tenants:
            round_served = 0
            for _ in range(len(self._tenants)):
                if budget - served - round_served <= 0:
                    break
                tenant = self._tenants[self._tenant_pos]
                got = self._visit_tenant(tenant, budget - served - round_served, take)
                round_served += got
                self._tenant_pos = (self._tenant_pos + 1) % len(self._tenants)
            served += round_served
            if round_served == 0:
                break
        return served

    def _visit_tenant(self, tenant: str, budget: int, take: Take) -> int:
        self._tenant_deficit[tenant] += self.tenant_quantum
        ring = self._lanes[tenant]
        served = 0
        for _ in range(len(ring)):
            allowance = min(self._tenant_deficit[tenant], budget - served)
            if allowance <= 0:
                break
            lane = (tenant, ring[self._lane_pos[tenant]])
            self._lane_deficit[lane] += self.lane_quantum
            want = min(self._lane_deficit[lane], allowance)
            got = take(lane, want)
            if got < want:
                self._lane_deficit[lane] = 0  # nothing more due: forfeit
            else:
                self._lane_deficit[lane] -= got
            self._tenant_deficit[tenant] -= got
            served += got
            self._lane_pos[tenant] = (self._lane_pos[tenant] + 1) % len(ring)
        # Unused deficit carries over at most one quantum: a tenant whose lanes ran dry
        # cannot bank a burst for later.
        left = self._tenant_deficit[tenant]
        self._tenant_deficit[tenant] = min(left, self.tenant_quantum) if served else 0
        return served
