"""Reads of the materialized state: consistent views, the kernel's state, payload bytes, the map.

Theory of operation: every read opens its own LMDB read transaction, a snapshot that no
commit can change under it, and lets it go when the caller is done; readers never block the
writer nor each other. `read_view` serves the runtime and the edges (peek, listing, tenant
usage, discovery's lane heads: `storage.base.StoreView`); `state_view` gives the kernel's
`State` over the same kind of snapshot, with the meta read in that snapshot (never the
store's in-memory copy, which a concurrent commit may move). A failure of LMDB itself is
refused naming the file (`storage.errors.lmdb_refusal`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from nereus.kernel.config import KernelConfig
from nereus.kernel.model import ShardMeta
from nereus.kernel.state import State
from nereus.storage.base import LmdbBase, StoreView
from nereus.storage.codec import decode_struct, key_position
from nereus.storage.env import Env
from nereus.storage.errors import lmdb_refusal
from nereus.storage.schema import SHARD_META_KEY, PayloadBlob


@contextmanager
def read_view(env: Env) -> Iterator[StoreView]:
    """A consistent read view of the materialized tables (peek, scans, audits)."""
    with lmdb_refusal(env.data_file), env.env.begin() as txn:
        yield StoreView(txn, env)


@contextmanager
def state_view(env: Env, config: KernelConfig) -> Iterator[State]:
    """The applied state as a kernel State over a read snapshot."""
    with lmdb_refusal(env.data_file), env.env.begin() as txn:
        yield _state(env, config, txn)


@contextmanager
def folded_state(env: Env, config: KernelConfig) -> Iterator[State | None]:
    """`state_view`, or None when the log holds an entry the state has not folded (an
    import's tail, appended and not yet applied): a verdict read from that state could miss
    a schedule the log already holds."""
    with lmdb_refusal(env.data_file), env.env.begin() as txn:
        state = _state(env, config, txn)
        with txn.cursor(db=env.log) as cursor:
            unfolded = cursor.last() and key_position(cursor.key()) != state.meta.position
        yield None if unfolded else state


def _state(env: Env, config: KernelConfig, txn: Any) -> State:
    # The meta is read in the snapshot, never the store's in-memory copy, which a concurrent
    # commit may move.
    meta = decode_struct(
        ShardMeta, txn.get(SHARD_META_KEY, db=env.meta), env.data_file, "shard meta"
    )
    return State(config, meta, LmdbBase(txn, env.tables, env.data_file))


def payload(env: Env, digest: str) -> bytes | None:
    """The payload bytes stored under `digest`, or None."""
    with env.env.begin() as txn:
        raw = txn.get(digest.encode(), db=env.payload_bytes)
    if raw is None:
        return None
    return decode_struct(PayloadBlob, raw, env.data_file, f"payload {digest}").data


def file_size_bytes(env: Env) -> int:
    return os.path.getsize(env.data_file)


def map_usage(env: Env) -> float:
    """The fraction of the LMDB map in use (highest page in use times the page size, over
    the map size): the "storage full" signal. Pages freed inside the file are reused before
    the map grows, so this is a high-water mark, not live data."""
    info = env.env.info()
    used = (int(info["last_pgno"]) + 1) * int(env.env.stat()["psize"])
    return used / int(info["map_size"])
