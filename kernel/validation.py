"""Field checks for client commands, in the fixed order the codes list gives.

Theory of operation: each check returns a rejection code or None, and a command runs them in
order and stops at the first failure, so the same bad input always gets the same code.
Timing is resolved here too: relative times are measured from the entry's persistence time,
never from a clock reading, so replay recomputes identical absolute times.
"""

from __future__ import annotations

from nereus.kernel.codes import Code
from nereus.kernel.config import KernelConfig
from nereus.kernel.native import is_sha256_hex, sha256_hex
from nereus.kernel.records import Capability, Schedule
from nereus.kernel.timing import MAX_INSTANT_MS

# Header names the destination adapters write themselves; a client may not forge them.
RESERVED_HEADER_PREFIX = "nereus-"


def check_identity(tenant: str, queue: str, timer_key: str, config: KernelConfig) -> Code | None:
    limit = config.max_identity_bytes
    for part in (tenant, queue, timer_key):
        if not part or "\x00" in part or len(part.encode()) > limit:
            return Code.INVALID_IDENTITY
    # The queue is a URL path segment and part of lane ids; the key is a catch-all path.
    if "/" in queue or "/" in tenant:
        return Code.INVALID_IDENTITY
    return None


def check_txn(txn: str, config: KernelConfig) -> Code | None:
    if not txn or len(txn.encode()) > config.max_txn_bytes:
        return Code.INVALID_TXN
    return None


def check_payload(digest: str, size: int, config: KernelConfig) -> Code | None:
    if size < 0 or not is_sha256_hex(digest):
        return Code.INVALID_PAYLOAD_REF
    if size > config.max_payload_bytes:
        return Code.PAYLOAD_TOO_LARGE
    return None


def payload_matches(record: Schedule, payload: bytes) -> bool:
    """Whether `payload` is the bytes the schedule names (size, then SHA-256)."""
    return len(payload) == record.payload_size and sha256_hex(payload) == record.payload_digest


def check_headers(headers: tuple[tuple[str, str], ...], config: KernelConfig) -> Code | None:
    if len(headers) > config.max_headers:
        return Code.INVALID_HEADERS
    total = 0
    for name, value in headers:
        if not name or name.lower().startswith(RESERVED_HEADER_PREFIX):
            return Code.INVALID_HEADERS
        total += len(name.encode()) + len(value.encode())
    if total > config.max_header_bytes:
        return Code.INVALID_HEADERS
    return None


def check_capability(capability: Capability, config: KernelConfig) -> Code | None:
    if capability.kind == "immediate":
        if capability.lead_ms != 0 or capability.clock_ahead_bound_ms != 0:
            return Code.INVALID_CAPABILITY
        return None
    if not 0 <= capability.lead_ms <= config.max_handoff_lead_ms:
        return Code.INVALID_CAPABILITY
    if not 0 <= capability.clock_ahead_bound_ms <= config.max_clock_ahead_bound_ms:
        return Code.INVALID_CAPABILITY
    return None


def resolve_timing(
    bp_ms: int,
    *,
    deliver_at_ms: int | None,
    delay_ms: int | None,
    expire_at_ms: int | None,
    lifetime_ms: int | None,
    config: KernelConfig,
) -> tuple[int, int] | Code:
    """(deliver_at_ms, expire_at_ms), or INVALID_TIMING. Limits are checked afterwards by
    `timing.validate_timing`, against the same bp."""
    if (deliver_at_ms is None) == (delay_ms is None):
        return Code.INVALID_TIMING
    if expire_at_ms is not None and lifetime_ms is not None:
        return Code.INVALID_TIMING
    for value in (deliver_at_ms, delay_ms, expire_at_ms, lifetime_ms):
        if value is not None and not 0 <= value < MAX_INSTANT_MS:
            return Code.INVALID_TIMING
    deliver = deliver_at_ms if deliver_at_ms is not None else bp_ms + (delay_ms or 0)
    if expire_at_ms is not None:
        expire = expire_at_ms
    elif lifetime_ms is not None:
        expire = bp_ms + lifetime_ms
    else:
        expire = min(
            max(deliver, bp_ms) + config.default_expiry_grace_ms,
            bp_ms + config.limits.max_message_lifetime_ms,
        )
    return deliver, expire


def action_at(deliver_at_ms: int, capability: Capability) -> int:
    """The earliest instant the destination action may start."""
    if capability.kind == "delayed_handoff":
        return deliver_at_ms - capability.lead_ms
    return deliver_at_ms


def visible_at(deliver_at_ms: int, capability: Capability) -> int:
    """The reveal time asked of the target, pushed out by its clock-ahead bound."""
    if capability.kind == "delayed_handoff":
        return deliver_at_ms + capability.clock_ahead_bound_ms
    return deliver_at_ms
