"""The derived indexes: kept in step by every fold, audited at open.

Theory of operation: two tables are derived from the kernel's rows, never decided by it:

* the **lane timeline** (`lane_timeline`): one empty-valued key per timeline row, prefixed
  with the row's tenant and queue, so a scheduler finds each lane's head without walking
  other lanes' work (`StoreView.lanes`, `lane_keys`);
* the **timer index** (`timer_index`): a queue's live timers in timer-key order, each naming
  its message's key, for listing without walking other queues (`StoreView.list_timers`).

`index_lane` and `index_timer` are called by the fold (`storage.fold`) for each timeline or
message row it writes, BEFORE the row itself is written, so a deletion can still read the
row it removes to find the index key. They share the fold's transaction: the indexes can
never disagree with the tables after a commit. `check_indexes` rebuilds both from the
tables and compares, naming the first key that differs: anything else writing the store
shows up there, as a refusal to open.
"""

from __future__ import annotations

from typing import Any, Final

from nereus.kernel.model import LIVE_STATUSES, Message, Table, TimelineWork, Value
from nereus.storage.base import LmdbBase
from nereus.storage.codec import decode_value, lane_index_key, timer_index_key
from nereus.storage.env import Env
from nereus.storage.errors import StoreError

# As module globals for the same reason as in storage.fold: these are compared per row.
_TIMELINE: Final = Table.TIMELINE
_MESSAGES: Final = Table.MESSAGES


def index_lane(env: Env, txn: Any, key: bytes, value: Value | None) -> None:
    """Keep the per-lane timeline index in step with the timeline row `key` becoming
    `value` (None: deleted)."""
    if value is None:
        raw = txn.get(key, None, env.tables[_TIMELINE])
        if raw is None:
            return
        old = decode_value(_TIMELINE, raw, env.data_file, key)
        assert isinstance(old, TimelineWork)
        unindex_lane(env, txn, old.tenant, old.queue, key)
    else:
        assert isinstance(value, TimelineWork)
        txn.put(lane_index_key(value.tenant, value.queue, key), b"", db=env.lane_timeline)


def index_timer(env: Env, txn: Any, key: bytes, value: Value | None) -> None:
    """Keep the timer index in step with the message row `key` becoming `value` (None:
    deleted): a live timer is indexed, any other status is not."""
    if value is None:
        raw = txn.get(key, None, env.tables[_MESSAGES])
        if raw is None:
            return
        value = decode_value(_MESSAGES, raw, env.data_file, key)
        assert isinstance(value, Message)
        unindex_timer(env, txn, value.tenant, value.queue, value.timer_key)
        return
    assert isinstance(value, Message)
    if value.status in LIVE_STATUSES:
        index_live_timer(env, txn, value.tenant, value.queue, value.timer_key, message_key=key)
    else:
        unindex_timer(env, txn, value.tenant, value.queue, value.timer_key)


def unindex_lane(env: Env, txn: Any, tenant: str, queue: str, key: bytes) -> None:
    """The timeline row `key` of the lane (tenant, queue) is gone: so is its index entry."""
    txn.delete(lane_index_key(tenant, queue, key), db=env.lane_timeline)


def index_live_timer(
    env: Env, txn: Any, tenant: str, queue: str, timer_key: str, *, message_key: bytes
) -> None:
    """A live timer names its message in the timer index."""
    index_key = timer_index_key(tenant, queue, timer_key)
    # A live timer changing state keeps its entry: rewriting it would still copy and sync
    # its page.
    if txn.get(index_key, None, env.timer_index) != message_key:
        txn.put(index_key, message_key, db=env.timer_index)


def unindex_timer(env: Env, txn: Any, tenant: str, queue: str, timer_key: str) -> None:
    """A timer that is not live (or whose message row is gone) leaves the timer index."""
    txn.delete(timer_index_key(tenant, queue, timer_key), db=env.timer_index)


def check_indexes(env: Env) -> None:
    """Raise StoreError unless the derived indexes (lane timeline, timer index) hold
    exactly what the tables imply. O(timeline + messages): an audit, run at open."""
    with env.env.begin() as txn:
        base = LmdbBase(txn, env.tables, env.data_file)
        lanes = {
            lane_index_key(work.tenant, work.queue, key): b""
            for key, work in base.items(Table.TIMELINE)
            if isinstance(work, TimelineWork)
        }
        timers = {
            timer_index_key(m.tenant, m.queue, m.timer_key): m.message_id.encode()
            for _key, m in base.items(Table.MESSAGES)
            if isinstance(m, Message) and m.status in LIVE_STATUSES
        }
        indexed: list[dict[bytes, bytes]] = []
        for db in (env.lane_timeline, env.timer_index):
            with txn.cursor(db=db) as cursor:
                indexed.append(dict(cursor.iternext()))
    for name, expected, found in (
        ("lane timeline index", lanes, indexed[0]),
        ("timer index", timers, indexed[1]),
    ):
        if expected == found:
            continue
        key, problem = min(
            (key, "a stray row" if key not in expected else
             "a missing row" if key not in found else "a row naming another message")
            for key in expected.keys() | found.keys()
            if expected.get(key) != found.get(key)
        )  # fmt: skip
        raise StoreError(
            env.data_file,
            f"the {name} disagrees with the tables ({problem}): it is derived data every "
            "fold writes in the same transaction, so something else changed the store",
            f"{name}, key {key.hex()}",
        )
