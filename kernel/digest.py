"""A content digest of a whole shard state.

Theory of operation: two states are equal iff their digests are equal (up to sha256). The
digest covers the meta value and every row of every table in key order, each length-prefixed
so no two different states can serialize to the same byte stream. It is independent of how
rows are split between base and overlay, so a live store and an in-memory replay compare.
"""

from __future__ import annotations

import hashlib

import msgspec

from nereus.kernel.model import TABLES
from nereus.kernel.state import State

_encode = msgspec.msgpack.Encoder().encode


def state_digest(state: State) -> str:
    h = hashlib.sha256()
    _feed(h, _encode(state.meta))
    for table in TABLES:
        _feed(h, table.value.encode())
        for key, value in state.items(table):
            _feed(h, key)
            _feed(h, _encode(value))
    return h.hexdigest()


def _feed(h: hashlib._Hash, data: bytes) -> None:
    h.update(len(data).to_bytes(8, "big"))
    h.update(data)
