"""The reducer's immutable configuration.

Theory of operation: every number the reducer's decisions depend on lives here, so a replay
with the same config reproduces every decision. The store records `fingerprint()` and refuses
to fold a log with a different one (a silent config change would make replay disagree with
what the live system decided).
"""

from __future__ import annotations

import hashlib

import msgspec

from nereus.kernel.timing import TimingLimits

DAY_MS = 24 * 3600 * 1000


class KernelConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    limits: TimingLimits = TimingLimits()
    # Used when a schedule gives no expiry: deliverAt (or bp, if later) plus this grace,
    # clipped to the maximum lifetime.
    default_expiry_grace_ms: int = 7 * DAY_MS
    max_payload_bytes: int = 1024 * 1024
    max_attempts: int = 5
    # Retries of an UNCERTAIN message (its last attempt is UNKNOWN): each may duplicate the
    # unknown one, which stays an obligation. 0 = wait for evidence only.
    max_uncertain_retries: int = 3
    backoff_base_ms: int = 250
    backoff_max_ms: int = 60_000
    max_handoff_lead_ms: int = 60_000
    max_clock_ahead_bound_ms: int = 60_000
    max_headers: int = 32
    max_header_bytes: int = 16 * 1024
    # Per part of (tenant, queue, timer_key). Storage keys are built from them (a lane is
    # tenant+queue, a per-queue listing is tenant+queue+key) and must fit LMDB's 511-byte key
    # limit; storage refuses a configuration that would not.
    max_identity_bytes: int = 150
    max_txn_bytes: int = 256

    def __post_init__(self) -> None:
        if self.default_expiry_grace_ms < self.limits.min_delivery_window_ms:
            raise ValueError("default_expiry_grace_ms must be >= min_delivery_window_ms")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        if self.max_uncertain_retries < 0:
            raise ValueError("max_uncertain_retries must be >= 0")
        if not 0 < self.backoff_base_ms <= self.backoff_max_ms:
            raise ValueError("need 0 < backoff_base_ms <= backoff_max_ms")
        if self.max_payload_bytes < 0:
            raise ValueError("max_payload_bytes must be >= 0")

    def fingerprint(self) -> str:
        return hashlib.sha256(msgspec.msgpack.encode(self)).hexdigest()[:16]

    def backoff_ms(self, failures: int) -> int:
        """Deterministic exponential backoff after the `failures`-th failure (1-based):
        base, 2*base, 4*base, ... capped at backoff_max_ms. No jitter: replay must compute
        the same next actionAt, and the spread comes from distinct failure times."""
        exponent = min(max(failures - 1, 0), 40)
        return min(self.backoff_base_ms << exponent, self.backoff_max_ms)
