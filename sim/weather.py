"""How simulated time moves: the clock's weather between and inside the steps.

Theory of operation: the world's loop asks this, at fixed points of a step, whether the clock
is disturbed (a step, a grown error bound, sync lost or regained), how far true time advances
(sometimes to exactly an edge of the rules: the interval's earliest end on due work's
actionAt, or either end on a live timer's expireAt) and whether the clock steps back between
an Admission's commit and its send. Every choice is drawn from the world's one
`random.Random`, in the order the loop asks, so a seed replays exactly; the rates are drawn by
the world (their place among its draws is part of the seed's meaning) and handed in.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

from nereus.kernel.effects import Publish
from nereus.kernel.keys import parse_timeline_key
from nereus.kernel.model import Message, Status, Table
from nereus.sim.clock import SimClock
from nereus.storage.store import Applied, ShardStore


class Weather:
    def __init__(
        self,
        rng: random.Random,
        clock: SimClock,
        stats: Counter[str],
        trace: Callable[[str], None],
        *,
        edge_faults: bool,
        clock_rate: float,
        step_back_rate: float,
        edge_rate: float,
    ) -> None:
        self.rng = rng
        self.clock = clock
        self.stats = stats
        self.trace = trace
        # False: nothing is drawn for the send gate and the rules' edges (see `World`).
        self.edge_faults = edge_faults
        self.clock_rate = clock_rate
        # How often the clock steps back between an Admission's commit and its send, and
        # how often time is advanced to exactly an edge of the rules.
        self.step_back_rate = step_back_rate
        self.edge_rate = edge_rate

    def after_commit(self, results: list[Applied]) -> None:
        """The window between a commit that admitted attempts and their sends: the clock may
        step back inside its bound, often to 1 ms before the earliest admitted action time,
        so the send gate must wait for a fresh proof."""
        actions = [
            e.action_at_ms for _, effects in results for e in effects if isinstance(e, Publish)
        ]
        if not actions or not self.clock.synchronized or not self.edge_faults:
            return
        if self.rng.random() >= self.step_back_rate:
            return
        target = min(actions) - 1 if self.rng.random() < 0.5 else None
        jump = self.clock.step_back(target)
        self.stats["clock_step_back_before_send"] += 1
        if self.clock.interval().earliest_ms < min(actions):
            self.stats["sends_held_by_step_back"] += 1
        self.trace(f"clock step {jump} ms between the Admission commit and the send")

    def advance(self, store: ShardStore) -> None:
        """True time moves on, sometimes to exactly an edge of the rules."""
        if self.edge_faults and self.rng.random() < self.edge_rate:
            edges = self._edges(store)
            if edges:
                end, target_ms, name = self.rng.choice(edges)
                landed = self.clock.land(end, target_ms)
                if landed is not None:
                    if landed:
                        self.stats[name] += 1
                        self.trace(f"clock {end} end landed on {target_ms} ({name})")
                    return
        self.clock.advance(self._dt())

    def _edges(self, store: ShardStore) -> list[tuple[str, int, str]]:
        """Instants the rules part at, within a few seconds: the timeline head's actionAt
        (for the earliest end) and live timers' expireAt (for either end)."""
        interval = self.clock.interval()
        horizon_ms = interval.latest_ms + 6_000
        edges: list[tuple[str, int, str]] = []
        with store.read() as view:
            head = view.first_timeline_key()
            if head is not None:
                action_at_ms = parse_timeline_key(head)[0]
                if interval.earliest_ms <= action_at_ms <= horizon_ms:
                    edges.append(("earliest", action_at_ms, "clock_landed_earliest_on_action_at"))
            for _key, m in view.items(Table.MESSAGES):
                if not isinstance(m, Message) or m.status is not Status.SCHEDULED:
                    continue
                if interval.latest_ms <= m.expire_at_ms <= horizon_ms:
                    edges.append(("latest", m.expire_at_ms, "clock_landed_latest_on_expire_at"))
                if interval.earliest_ms <= m.expire_at_ms <= horizon_ms:
                    edges.append(("earliest", m.expire_at_ms, "clock_landed_earliest_on_expire_at"))
        return edges

    def _dt(self) -> int:
        r = self.rng.random()
        if r < 0.1:
            return 0
        if r < 0.55:
            return self.rng.randint(1, 60)
        if r < 0.95:
            return self.rng.randint(60, 500)
        return self.rng.randint(1_000, 6_000)

    def disturb(self) -> None:
        """Maybe a clock event: a step, a grown error, lost or regained sync."""
        rng, clock = self.rng, self.clock
        if not clock.synchronized:
            if rng.random() < 0.1:
                self.stats["clock_resync"] += 1
                clock.resync()
                self.trace("clock resynchronised")
            return
        if rng.random() >= self.clock_rate:
            return
        event = rng.choice(("step", "step", "grow", "lose_sync", "resync"))
        self.stats[f"clock_{event}"] += 1
        if event == "step":
            jump = clock.step()
            if jump < 0:
                self.stats["clock_step_backwards"] += 1
            self.trace(f"clock step {jump} ms (error {clock.error_ms})")
        elif event == "grow":
            clock.grow_error(rng.randint(1, 500))
        elif event == "lose_sync":
            clock.lose_sync()
            self.trace("clock lost sync")
        else:
            clock.resync()
