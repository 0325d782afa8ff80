"""Fail-closed time rules.

Theory of operation: nobody knows the exact time. A clock source gives a *trusted interval*
`[earliest_ms, latest_ms]` that certainly contains true UTC. Every time decision is made
against the pessimistic end of that interval:

* a message may be admitted for publishing only when even the earliest possible "now" has
  reached its action time and even the latest possible "now" is still before `expireAt`;
* a message may be declared expired only when even the earliest possible "now" is at or past
  `expireAt`;
* in between the answer is to wait (not due yet) or pause (too close to `expireAt` to tell).

So clock uncertainty can only make delivery later; it can never authorize an early publish or
a premature expiry. An unknown clock is the widest interval, which always answers PAUSE.
"""

from __future__ import annotations

from enum import StrEnum

import msgspec

from nereus.kernel.codes import Code

# Bounds of an "unbounded" interval; far outside any plausible epoch-millisecond value but
# still exact integers everywhere (msgpack, JSON, LMDB keys).
MIN_TIME_MS = -(2**62)
MAX_TIME_MS = 2**62
# Valid instants and durations in records: [0, 2^53), exact in JSON doubles too, and far
# enough inside the key range that sums of two of them still encode.
MAX_INSTANT_MS = 2**53


class TrustedInterval(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    earliest_ms: int
    latest_ms: int

    def __post_init__(self) -> None:
        if self.earliest_ms > self.latest_ms:
            raise ValueError(
                f"trusted interval is empty: earliest_ms={self.earliest_ms} "
                f"> latest_ms={self.latest_ms}"
            )

    @property
    def width_ms(self) -> int:
        return self.latest_ms - self.earliest_ms

    @property
    def bounded(self) -> bool:
        """Whether the clock said anything: both ends are readings, not the limits of the
        unbounded interval an unsynchronised clock gives (which no time decision can use)."""
        return self.earliest_ms > MIN_TIME_MS and self.latest_ms < MAX_TIME_MS


UNBOUNDED = TrustedInterval(MIN_TIME_MS, MAX_TIME_MS)


class Decision(StrEnum):
    EXPIRE = "EXPIRE"
    PAUSE = "PAUSE"
    ADMIT = "ADMIT"
    WAIT = "WAIT"


def decide(interval: TrustedInterval, action_at_ms: int, expire_at_ms: int) -> Decision:
    """The one place that turns clock evidence into permission. Order matters: expiry is
    checked first so a message past its boundary is never admitted, then the pause band."""
    if interval.earliest_ms >= expire_at_ms:
        return Decision.EXPIRE
    if interval.latest_ms >= expire_at_ms:
        return Decision.PAUSE
    if interval.earliest_ms >= action_at_ms:
        return Decision.ADMIT
    return Decision.WAIT


class TimingLimits(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Bounds a schedule's timing must satisfy at its persistence time `bp`."""

    min_delivery_window_ms: int = 1_000
    max_delay_horizon_ms: int = 90 * 24 * 3600 * 1000
    max_message_lifetime_ms: int = 97 * 24 * 3600 * 1000

    def __post_init__(self) -> None:
        if self.min_delivery_window_ms < 0:
            raise ValueError("min_delivery_window_ms must be >= 0")
        if self.max_delay_horizon_ms < 0:
            raise ValueError("max_delay_horizon_ms must be >= 0")
        if self.max_message_lifetime_ms < self.max_delay_horizon_ms + self.min_delivery_window_ms:
            # Otherwise a timer scheduled at the horizon could never satisfy the window.
            raise ValueError(
                "max_message_lifetime_ms must be >= max_delay_horizon_ms + min_delivery_window_ms"
            )


def validate_timing(
    bp_ms: int, deliver_at_ms: int, expire_at_ms: int, limits: TimingLimits
) -> Code | None:
    """V1 timing rules, evaluated against the command's own persistence time, never a
    later reading of any clock. Returns the first violated rule, or None."""
    if deliver_at_ms > bp_ms + limits.max_delay_horizon_ms:
        return Code.HORIZON_EXCEEDED
    if expire_at_ms > bp_ms + limits.max_message_lifetime_ms:
        return Code.LIFETIME_EXCEEDED
    if expire_at_ms < max(deliver_at_ms, bp_ms) + limits.min_delivery_window_ms:
        return Code.EXPIRE_BEFORE_WINDOW
    return None
