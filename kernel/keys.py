"""Identities and table keys.

Theory of operation: a timer's identity is (tenant, queue, timer_key); its message id is a
hash of that identity, so every process derives the same id without a lookup and a retry
lands on the same row. Table keys are bytes whose lexicographic order is the order storage
and scans need: the timeline key starts with actionAt as a big-endian integer shifted to be
non-negative, so an LMDB cursor walks work in due order.
"""

from __future__ import annotations

import struct

from nereus.kernel.native import blake2b_hex
from nereus.kernel.timing import MIN_TIME_MS

_TIMELINE = struct.Struct(">Q16sQ")
MESSAGE_ID_BYTES = 16

# The tenant of every command that names none: a single-tenant deployment (the library, a
# service without a tenants file) keeps all its timers under it.
DEFAULT_TENANT = "default"


# A message id is the 16-byte BLAKE2b of its identity, personalised so no other digest of
# the same bytes can pass for one (`kernel.native.blake2b_hex`: one call where Rust is built).
_PERSON = b"nereus.msgid.v1"


def message_id(tenant: str, queue: str, timer_key: str) -> str:
    """Stable across processes and versions: never change this function's output. The
    input is tenant, NUL, queue, NUL, timer_key as UTF-8 (hashed in one update: the same
    bytes, so the same digest as updating part by part)."""
    return blake2b_hex(f"{tenant}\x00{queue}\x00{timer_key}".encode(), MESSAGE_ID_BYTES, _PERSON)


def attempt_prefix(message_id_hex: str, generation: int) -> str:
    """Attempt ids must start with this, so one generation's attempts are one key range."""
    return f"{message_id_hex}.{generation}."


def dead_letter_key(message_id_hex: str, generation: int) -> bytes:
    """The dead-letters table's key: one owed copy per (message id, generation)."""
    return f"{message_id_hex}.{generation}".encode()


def lane_id(tenant: str, queue: str) -> str:
    return f"{tenant}\x00{queue}"


def str_key(value: str) -> bytes:
    return value.encode()


def usage_key(tenant: str) -> bytes:
    """The usage table's key: the tenant's name as UTF-8."""
    return tenant.encode()


def timeline_key(action_at_ms: int, message_id_hex: str, generation: int) -> bytes:
    return _TIMELINE.pack(action_at_ms - MIN_TIME_MS, bytes.fromhex(message_id_hex), generation)


def parse_timeline_key(key: bytes) -> tuple[int, str, int]:
    """(action_at_ms, message_id, generation)"""
    shifted, mid, generation = _TIMELINE.unpack(key)
    return shifted + MIN_TIME_MS, mid.hex(), generation
