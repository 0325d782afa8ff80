"""Due discovery: from a view of the shard store and a clock reading, the proposals of a tick.

Theory of operation: `propose` walks the per-lane timeline index and returns what should
enter the log: the Admissions of work claimed ahead whose action time the clock now proves,
then, for due rows in two-level deficit-round-robin order (`runtime.drr`, so a lane with a
large backlog cannot starve the others), an Admission, a claim result proving a permanent
pre-send error, or an expiry. A row is proposed for only while it still matches the message
it was made from (`still_matches`) and its lane is open: its gate not CLOSED and not
recently unavailable (`lane_unavailable`). When nothing due is left waiting, rows due
within `claim_ahead_ms` are claimed ahead (their publish prepared) on the lanes the due pass
went through, so that when the clock proves the action time only the Admission is left to
commit; the Admission and the send still wait for that proof. Nothing is claimed ahead in a
tick that has Admissions: its commit would write the claims.

The result also says when the trusted clock's earliest end next gives discovery something
to do (`next_ms`), so the loop can sleep until then.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from nereus.kernel.keys import lane_id, parse_timeline_key, str_key
from nereus.kernel.model import Lane, Message, Status, Table, TimelineWork
from nereus.kernel.records import (
    Appendable,
    Capacity,
    ClaimResult,
    Expire,
    PublishAdmission,
    Record,
)
from nereus.kernel.timing import Decision, decide
from nereus.runtime.claim import Claim
from nereus.runtime.claims import ClaimTable
from nereus.runtime.clock import ClockReading
from nereus.runtime.config import RuntimeConfig
from nereus.runtime.destination import Destination, accepts, capability_for, fence_id_for
from nereus.runtime.drr import DeficitRoundRobin
from nereus.runtime.log import Logger
from nereus.runtime.prepare import PrepareFailure, prepare
from nereus.storage.base import StoreView

LaneKey = tuple[str, str]  # (tenant, queue)


def still_matches(message: Message, generation: int, version: int, action_at_ms: int) -> bool:
    """Whether the message row is still the one a timeline row or a claim was made from:
    the same generation and version, due at the same time. Anything else (superseded,
    rescheduled, cancelled, admitted since) is left for the next look."""
    return (
        message.generation == generation
        and message.version == version
        and message.action_at_ms == action_at_ms
    )


# Enum members the per-row loops compare against, as module globals: an Enum class attribute
# goes through EnumType.__getattr__ on Python 3.11 (see kernel/step.py).
_LANES: Final = Table.LANES
_MESSAGES: Final = Table.MESSAGES
_TIMELINE: Final = Table.TIMELINE
_SCHEDULED: Final = Status.SCHEDULED
_UNCERTAIN: Final = Status.UNCERTAIN
_ADMIT: Final = Decision.ADMIT
_WAIT: Final = Decision.WAIT
_EXPIRE: Final = Decision.EXPIRE


@dataclass
class Found:
    """What one discovery pass proposes, and what it learnt on the way."""

    proposals: list[Appendable] = field(default_factory=list)
    admissions: int = 0  # Admissions proposed
    oldest_action_ms: int | None = None  # the earliest action time among them
    ran: bool = False  # the clock was bounded and discovery looked
    # The earliest trusted-clock reading (interval.earliest_ms) at which discovery has
    # something new to do: claim a row ahead, or take a row that becomes due.
    next_ms: int | None = None
    # Messages something was proposed for (claims, expiries, claim results): a lane visited
    # twice in one pass must not propose the same thing twice.
    proposed: set[str] = field(default_factory=set)
    # Per lane, the last timeline key examined: a second visit continues there.
    lane_cursor: dict[LaneKey, bytes] = field(default_factory=dict)
    lane_scanned: dict[LaneKey, int] = field(default_factory=dict)
    # Lanes whose due work the pass went through to the first row not yet due.
    lane_future: set[LaneKey] = field(default_factory=set)
    # Lanes to claim ahead on, in order.
    ahead_lanes: list[LaneKey] = field(default_factory=list)

    def admitted(self, action_at_ms: int) -> None:
        self.admissions += 1
        if self.oldest_action_ms is None or action_at_ms < self.oldest_action_ms:
            self.oldest_action_ms = action_at_ms

    def note_next(self, at_ms: int) -> None:
        if self.next_ms is None or at_ms < self.next_ms:
            self.next_ms = at_ms


class Discovery:
    def __init__(
        self,
        config: RuntimeConfig,
        claims: ClaimTable,
        destination: Destination,
        retry_checked: Callable[[StoreView, Message], bool],
        log: Logger,
    ) -> None:
        self.config = config
        self.claims = claims
        self.destination = destination
        # Whether an UNCERTAIN message's retry may be claimed (runtime.recovery).
        self._retry_checked = retry_checked
        self.log = log
        self.drr = DeficitRoundRobin(config.tenant_quantum, config.lane_quantum)
        self._lane_unready_until: dict[LaneKey, int] = {}

    def lane_unavailable(self, lane: LaneKey, now_ms: int) -> None:
        """The destination said the lane cannot take records: not READY for a while."""
        self._lane_unready_until[lane] = now_ms + self.config.lane_unready_ms

    def propose(self, view: StoreView, now: ClockReading) -> Found:
        found = Found()
        if not now.interval.bounded:
            return found  # no trusted time: nothing is due, nothing expires
        found.ran = True
        earliest = now.interval.earliest_ms
        ahead_ms = self.config.claim_ahead_ms
        budget = self.config.max_admissions_per_tick - self._admit_ahead(view, now, found)
        due: list[LaneKey] = []
        soon: list[LaneKey] = []
        for tenant, queue, head in view.lanes():
            action_at_ms = parse_timeline_key(head)[0]
            if action_at_ms <= earliest:
                due.append((tenant, queue))
            elif action_at_ms <= earliest + ahead_ms:
                soon.append((tenant, queue))
            else:
                found.note_next(action_at_ms - ahead_ms)
        self.drr.sync(due)
        served = 0
        if budget > 0:
            served = self.drr.run(budget, lambda lane, n: self._take(view, lane, n, now, found))
        if served >= budget:
            found.note_next(earliest)  # more due work may be waiting: come back at once
        else:
            found.ahead_lanes = [lane for lane in due if lane in found.lane_future] + soon
        if found.admissions == 0:
            for lane in found.ahead_lanes:
                if not self._claim_ahead(view, lane, now, found):
                    break
        elif found.ahead_lanes:
            found.note_next(earliest)  # claim ahead in the next tick
        return found

    def _lane_open(self, view: StoreView, lane: LaneKey, now: ClockReading) -> bool:
        """The lane's gate is open and the lane is READY."""
        gate = view.get(_LANES, str_key(lane_id(*lane)))
        if isinstance(gate, Lane) and gate.gate == "CLOSED":
            return False
        return now.now_ms >= self._lane_unready_until.get(lane, 0)

    def _admit_ahead(self, view: StoreView, now: ClockReading, found: Found) -> int:
        """Admissions for claims made ahead whose action time the clock now proves. A claim
        whose work changed, closed or is no longer certainly admissible is released; the due
        pass then treats its row like any other. Returns how many were proposed."""
        earliest = now.interval.earliest_ms
        ready = sorted(
            (c for c in self.claims.ahead() if c.action_at_ms <= earliest),
            key=lambda c: c.action_at_ms,
        )
        budget = self.config.max_admissions_per_tick
        gates: dict[LaneKey, bool] = {}
        proposed = 0
        for claim in ready:
            if proposed >= budget:
                found.note_next(earliest)
                break
            lane = (claim.tenant, claim.queue)
            if lane not in gates:
                gates[lane] = self._lane_open(view, lane, now)
            message = view.get(_MESSAGES, str_key(claim.message_id))
            if not (
                gates[lane]
                and isinstance(message, Message)
                and message.status is _SCHEDULED
                and message.has_work
                and still_matches(message, claim.generation, claim.version, claim.action_at_ms)
                and decide(now.interval, message.action_at_ms, message.expire_at_ms) is _ADMIT
            ):
                self.claims.release(claim.message_id, claim.claim_id)
                continue
            self.claims.propose(claim)
            found.proposed.add(claim.message_id)
            found.proposals.append((self._admission(claim, message, now), None))
            found.admitted(claim.action_at_ms)
            proposed += 1
        return proposed

    def _claim_ahead(self, view: StoreView, lane: LaneKey, now: ClockReading, found: Found) -> bool:
        """Claim the lane's rows that are due within `claim_ahead_ms` but not yet, after
        what the due pass examined. Only plain SCHEDULED work is claimed ahead; anything
        else is left for the due pass. False when no more claims may be made ahead."""
        earliest = now.interval.earliest_ms
        ahead_ms = self.config.claim_ahead_ms
        lane_open: bool | None = None
        scanned = found.lane_scanned.get(lane, 0)
        for key in view.lane_keys(*lane, after=found.lane_cursor.get(lane)):
            action_at_ms, mid, generation = parse_timeline_key(key)
            if action_at_ms > earliest + ahead_ms:
                found.note_next(action_at_ms - ahead_ms)
                return True
            if action_at_ms <= earliest:
                found.note_next(earliest)  # due after all: the due pass takes it
                continue
            if scanned >= self.config.lane_scan_limit:
                found.note_next(action_at_ms)
                return True
            scanned += 1
            if mid in self.claims or mid in found.proposed:
                continue
            if self.claims.ahead_count() >= self.config.max_claims_ahead:
                found.note_next(action_at_ms)
                return False
            if lane_open is None:
                lane_open = self._lane_open(view, lane, now)
            if not lane_open:
                found.note_next(action_at_ms)
                return True
            found.note_next(action_at_ms)  # when it is due (if it is not claimed now)
            work = view.get(_TIMELINE, key)
            assert isinstance(work, TimelineWork)
            if decide(now.interval, action_at_ms, work.expire_at_ms) is not _WAIT:
                continue
            message = view.get(_MESSAGES, str_key(mid))
            if not (
                isinstance(message, Message)
                and message.status is _SCHEDULED
                and still_matches(message, generation, work.version, action_at_ms)
                and accepts(
                    self.destination, message.queue, message.capability, tenant=message.tenant
                )
            ):
                continue
            if not self.claims.permits.available(lane, message.payload_size):
                return True
            prepared = prepare(
                message, view.payload(message.payload_digest), self.destination, self.config.owner
            )
            if isinstance(prepared, PrepareFailure):
                continue  # the due pass records the failure when the row is due
            self.claims.claim_ahead(message, prepared, now.now_ms)
        return True

    def _take(
        self, view: StoreView, lane: LaneKey, want: int, now: ClockReading, found: Found
    ) -> int:
        """Serve up to `want` due rows of the lane (the DRR's turn); returns how many."""
        earliest = now.interval.earliest_ms
        lane_open = self._lane_open(view, lane, now)
        served = 0
        if not lane_open:
            found.note_next(earliest)  # as before: due work stays due
        for key in view.lane_keys(*lane, after=found.lane_cursor.get(lane)):
            scanned = found.lane_scanned.get(lane, 0)
            if served >= want or scanned >= self.config.lane_scan_limit:
                found.note_next(earliest)  # due work may be left
                break
            action_at_ms, mid, generation = parse_timeline_key(key)
            if action_at_ms > earliest:
                found.lane_future.add(lane)
                break  # this and everything after it is not due yet
            if mid in self.claims or mid in found.proposed:
                found.lane_cursor[lane] = key
                found.lane_scanned[lane] = scanned + 1
                continue
            work = view.get(_TIMELINE, key)
            assert isinstance(work, TimelineWork)
            decision = decide(now.interval, action_at_ms, work.expire_at_ms)
            admit = decision is _ADMIT and lane_open
            message: Message | None = None
            if admit:
                row = view.get(_MESSAGES, str_key(mid))
                assert isinstance(row, Message)
                message = row
                if not self.claims.permits.available(lane, message.payload_size):
                    found.note_next(earliest)
                    break  # not examined: the next visit (or tick) starts here
            found.lane_cursor[lane] = key
            found.lane_scanned[lane] = scanned + 1
            if decision is _EXPIRE:
                found.proposed.add(mid)
                found.proposals.append((Expire(mid, generation, work.version, now.interval), None))
                served += 1
            elif admit:
                assert message is not None  # read above: the same snapshot, not read twice
                if not still_matches(message, generation, work.version, action_at_ms):
                    continue  # the index and the row disagree only inside a stale view
                proposal = self._propose_due(view, message, now)
                if proposal is None:
                    continue  # the search for its UNKNOWN attempts wakes the loop
                found.proposed.add(mid)
                found.proposals.append((proposal, None))
                if isinstance(proposal, PublishAdmission):
                    found.admitted(action_at_ms)
                served += 1
            else:
                found.note_next(earliest)  # due and left: as before
        else:
            found.lane_future.add(lane)  # no rows left in the lane
        return served

    def _propose_due(self, view: StoreView, message: Message, now: ClockReading) -> Record | None:
        """The proposal for a due message: its Admission, or a claim result proving a
        permanent pre-send error. None while an uncertain retry waits for its look."""
        if message.status is _UNCERTAIN and not self._retry_checked(view, message):
            return None
        tenant = message.tenant
        if not accepts(self.destination, message.queue, message.capability, tenant=tenant):
            offered = capability_for(self.destination, message.queue, tenant=tenant)
            return ClaimResult(
                message.message_id,
                message.generation,
                message.version,
                self.claims.next_claim_id(),
                "capability_mismatch",
                f"destination offers {offered}",
            )
        prepared = prepare(
            message, view.payload(message.payload_digest), self.destination, self.config.owner
        )
        if isinstance(prepared, PrepareFailure):
            claim_id = self.claims.next_claim_id()
            self.log.warning(
                "claim_failed",
                message_id=message.message_id,
                error=prepared.error_code,
                detail=prepared.detail,
            )
            return ClaimResult(
                message.message_id,
                message.generation,
                message.version,
                claim_id,
                prepared.error_code,
                prepared.detail,
            )
        claim = self.claims.claim(message, prepared, now.now_ms)
        return self._admission(claim, message, now)

    def _admission(self, claim: Claim, message: Message, now: ClockReading) -> PublishAdmission:
        """The Admission of a claim, carrying this tick's clock reading as its evidence."""
        return PublishAdmission(
            message_id=message.message_id,
            generation=message.generation,
            version=message.version,
            attempt_id=claim.attempt_id,
            claim_id=claim.claim_id,
            owner=self.config.owner,
            descriptor_hash=claim.descriptor_hash,
            capability=message.capability,
            interval=now.interval,
            capacity=Capacity(True, lane_permits=1, bytes_reserved=claim.size_bytes),
            fence_id=fence_id_for(self.destination, claim.prepared.topic),
        )
