"""Local destination records as earlier builds wrote them, to check that they still read.

Written out field by field on purpose: they stand for what is already on disk, so they must
not follow `LocalRecord` when it changes.
"""

from __future__ import annotations

import msgspec


class RecordBeforeTenants(msgspec.Struct, frozen=True):
    """A local record as written before records carried their tenant."""

    queue: str
    offset: int
    partition: str | None
    message_id: str
    generation: int
    attempt_id: str
    txn: str
    deliver_at_ms: int
    delivered_at_ms: int
    headers: list[tuple[str, str]]
    payload: bytes
    producer_sub: str | None
    encrypted: bool


class RecordBeforeKeys(RecordBeforeTenants, frozen=True):
    """A local record as written after records carried their tenant, before their key."""

    tenant: str | None
