"""Runtime bounds. Everything the runtime queues, holds or scans has a limit here."""

from __future__ import annotations

import msgspec


class RuntimeConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    owner: str = "nereus"
    # Attempt and claim ids end in "<namespace>-<claim sequence>" when set (a Kafka shard
    # owner uses one per ownership tenure), else in the bare sequence.
    claim_namespace: str = ""
    # Per tick: commands taken from the intake queue, and admissions proposed.
    max_commands_per_tick: int = 4096
    max_admissions_per_tick: int = 512
    # Timeline rows examined per lane per tick (a lane full of PAUSEd work cannot stall
    # discovery of the others).
    lane_scan_limit: int = 256
    # Permits: claims in flight overall, per lane, and their payload bytes.
    max_inflight_claims: int = 4096
    max_inflight_per_lane: int = 1024
    max_inflight_bytes: int = 256 * 1024 * 1024
    # Deficit round robin quanta: messages per visit, for a tenant and for a lane.
    tenant_quantum: int = 64
    lane_quantum: int = 32
    claim_deadline_ms: int = 30_000
    # Due work is claimed, and its publish prepared, up to this long before its action time
    # (at most `max_claims_ahead` claims at once), so that when the trusted clock proves the
    # action time only the Admission is left to commit. The Admission and the send still
    # wait for that proof. 0: claim only work already due.
    claim_ahead_ms: int = 50
    max_claims_ahead: int = 256
    # Admissions go first: a tick with Admissions to commit leaves queued commands to the
    # next tick (which follows at once), and a tick does not start committing commands when
    # claimed work comes due within the time such a tick has been taking, up to this long.
    # 0: commands and Admissions share every tick.
    command_hold_max_ms: int = 10
    # The loop sleeps until the next due time, but never longer than this, and wakes at
    # once when a command arrives.
    idle_sleep_max_ms: int = 50
    reconcile_interval_ms: int = 5_000
    # An evidence search that failed or could not finish (an unreachable destination, a
    # bound) is followed by the next one after base * 2^(n-1) ms, at most max.
    evidence_retry_ms: int = 1_000
    evidence_retry_max_ms: int = 30_000
    # After a lane_unavailable outcome the lane is not READY for this long.
    lane_unready_ms: int = 1_000
    # Commands waiting in the intake queue before submit() pushes back.
    max_queued_commands: int = 65_536
    # A dead-letter copy whose write failed (or whose fate is unknown) is written again after
    # base * 2^(n-1) ms, at most max, for its n-th consecutive failure.
    dead_letter_backoff_base_ms: int = 500
    dead_letter_backoff_max_ms: int = 60_000

    def dead_letter_backoff_ms(self, failures: int) -> int:
        exponent = min(max(failures - 1, 0), 40)
        return min(self.dead_letter_backoff_base_ms << exponent, self.dead_letter_backoff_max_ms)
