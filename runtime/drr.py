"""Two-level bounded deficit round robin: tenants, then lanes (queues) within a tenant.

Theory of operation: a turn starts by adding a quantum to the tenant's (or lane's) deficit;
a lane serves at most min(its deficit, its tenant's deficit, what is left of the tick's
budget) items, one deficit unit each. A turn ends when its deficit is used up, when the lane
(tenant) has nothing more due, or, for a lane, when its tenant's turn ends; what is left is
forfeit, as in classic DRR, so idle time is never banked into a burst. A turn cut short by
the tick's budget alone is *suspended*: the next tick resumes it without a new quantum. The
rotation positions and suspended turns survive between ticks, so a hot lane early in the
order cannot take every tick, and a lane with due work waits at most one quantum of each
other lane of its tenant, and one tenant quantum of each other tenant.
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
        self._tenant_suspended: set[str] = set()
        self._lane_suspended: set[Lane] = set()

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
            self._lane_suspended.discard((tenant, q))
        self._lane_pos.pop(tenant, None)
        self._tenant_deficit.pop(tenant, None)
        self._tenant_suspended.discard(tenant)
        self._tenant_pos = self._tenant_pos % len(self._tenants) if self._tenants else 0

    def _drop_lane(self, tenant: str, queue: str) -> None:
        ring = self._lanes[tenant]
        index = ring.index(queue)
        ring.pop(index)
        if index < self._lane_pos[tenant]:
            self._lane_pos[tenant] -= 1
        self._lane_pos[tenant] = self._lane_pos[tenant] % len(ring) if ring else 0
        self._lane_deficit.pop((tenant, queue), None)
        self._lane_suspended.discard((tenant, queue))

    def run(self, budget: int, take: Take) -> int:
        """Serve up to `budget` items in DRR order; returns how many were served. Stops early
        after a whole round of tenants served nothing."""
        served = 0
        idle_turns = 0
        while served < budget and self._tenants and idle_turns < len(self._tenants):
            tenant = self._tenants[self._tenant_pos]
            if tenant in self._tenant_suspended:
                self._tenant_suspended.discard(tenant)
            else:
                self._tenant_deficit[tenant] += self.tenant_quantum
            got, cut = self._tenant_turn(tenant, budget - served, take)
            served += got
            if cut:
                self._tenant_suspended.add(tenant)
                break
            self._tenant_pos = (self._tenant_pos + 1) % len(self._tenants)
            idle_turns = 0 if got else idle_turns + 1
        return served

    def _tenant_turn(self, tenant: str, budget: int, take: Take) -> tuple[int, bool]:
        """Serve the tenant's lanes in order; (served, cut short by the budget)."""
        ring = self._lanes[tenant]
        served = 0
        for _ in range(len(ring)):
            if self._tenant_deficit[tenant] <= 0:
                break
            if budget - served <= 0:
                return served, True
            lane = (tenant, ring[self._lane_pos[tenant]])
            if lane in self._lane_suspended:
                self._lane_suspended.discard(lane)
            else:
                self._lane_deficit[lane] += self.lane_quantum
            want = min(self._lane_deficit[lane], self._tenant_deficit[tenant], budget - served)
            got = take(lane, want)
            served += got
            self._tenant_deficit[tenant] -= got
            self._lane_deficit[lane] -= got
            cut = got == want and budget - served <= 0 < self._lane_deficit[lane]
            if cut and self._tenant_deficit[tenant] > 0:
                # Stopped by the tick's budget alone: both turns resume next tick.
                self._lane_suspended.add(lane)
                return served, True
            # Ran dry, used its quantum, or its tenant's turn ended: the lane's turn is over
            # and what it did not use is forfeit.
            self._lane_deficit[lane] = 0
            self._lane_pos[tenant] = (self._lane_pos[tenant] + 1) % len(ring)
        # The tenant's turn is over: what it did not use is forfeit.
        self._tenant_deficit[tenant] = 0
        return served, False
