"""Reads in Kafka mode: what this process can answer from the shards it owns.

Theory of operation: a peek needs the timer's shard owned here and caught up; a queue
listing needs every shard (`ShardNotLocal` otherwise), each read in its own snapshot, one
after the other, and merged in key order: the same part and merge as a listing gathered from
the processes of one supervisor (`adapters.kafka.siblings`), with every part here. Tenant
usage for quotas is the sum over the shards this process owns right now, so with shards
spread over processes a quota sees part of the usage. Each shard is read under its lock, so
a shard being closed is never read.

`cancels_nothing` judges a rate-limited caller's cancels (specs/http.md, "Rate limit"): True
only when every cancel's shard is owned here and caught up, and the kernel's own verdict on
a snapshot of its store changes nothing (`runtime.absent.committed_verdict`): no pending
timer is cancelled, so the edge may refuse the unit. Every command answered before the
request arrived is in that snapshot (its owner folded it before answering, and a new owner
catches up past its predecessor's answers before it is recovered); one not yet answered is
concurrent with the cancel, which may be ordered before it.
"""

from __future__ import annotations

from nereus.adapters.kafka.ownership import OwnedShard
from nereus.adapters.kafka.siblings import Part, merge_parts
from nereus.adapters.kafka.wire import shard_for
from nereus.kernel.model import Message, TenantUsage
from nereus.kernel.records import Cancel
from nereus.runtime.absent import committed_verdict
from nereus.service.embedded import peek_store
from nereus.service.errors import ShardNotLocal
from nereus.service.results import Peek


def peek(
    owned: dict[int, OwnedShard], shards: int, queue: str, timer_key: str, *, tenant: str
) -> Peek:
    partition = shard_for(tenant, queue, timer_key, shards)
    shard = owned.get(partition)
    if shard is None:
        raise ShardNotLocal(f"shard {partition} is not owned by this process")
    with shard.lock:
        if shard.closed or not shard.runtime.is_recovered():
            raise ShardNotLocal(f"shard {partition} is still catching up here")
        return peek_store(shard.store, shard.runtime, queue, timer_key, tenant=tenant)


def list_timers(
    owned: dict[int, OwnedShard],
    shards: int,
    queue: str,
    after: str | None,
    limit: int,
    *,
    tenant: str,
) -> tuple[list[Message], bool]:
    """Up to `limit` live timers of the queue with timer keys strictly after `after`, in
    UTF-8 byte order, and whether more follow (see `StoreView.list_timers`)."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    missing = [p for p in range(shards) if p not in owned]
    if not shards or missing:
        raise ShardNotLocal(
            f"listing a queue reads every shard; shards {missing} are not owned by this process"
        )
    part = local_part(owned, tenant, queue, after, limit)
    unread = [p for p in range(shards) if p not in part.shards]
    if unread:
        raise ShardNotLocal(f"shard {unread[0]} is not readable here right now")
    return merge_parts([part], shards, limit)


def local_part(
    owned: dict[int, OwnedShard], tenant: str, queue: str, after: str | None, limit: int
) -> Part:
    """This process's part of a listing: every shard it owns and has caught up (a shard
    closing or still catching up is left out, for the merge to find missing)."""
    shards: list[int] = []
    rows: list[Message] = []
    more = False
    for partition, shard in sorted(owned.items()):
        with shard.lock:
            if shard.closed or not shard.runtime.is_recovered():
                continue
            with shard.store.read() as view:
                page, truncated = view.list_timers(tenant, queue, after, limit)
        shards.append(partition)
        rows.extend(page)
        more = more or truncated
    return Part(shards, rows, more)


def tenant_usage(owned: dict[int, OwnedShard], tenant: str) -> TenantUsage:
    live = size = 0
    for shard in owned.values():
        with shard.lock:
            if shard.closed:
                continue
            with shard.store.read() as view:
                usage = view.tenant_usage(tenant)
        live += usage.live
        size += usage.bytes
    return TenantUsage(live=live, bytes=size)


def map_usage(owned: dict[int, OwnedShard]) -> float:
    """The fullest owned shard store's fraction of its LMDB map in use (0.0 if none)."""
    fullest = 0.0
    for shard in owned.values():
        with shard.lock:
            if not shard.closed:
                fullest = max(fullest, shard.store.map_usage())
    return fullest


def cancels_nothing(owned: dict[int, OwnedShard], shards: int, cancels: list[Cancel]) -> bool:
    """Whether these cancels, judged on the stores owned here, would change nothing (False
    when any of their shards cannot be judged here)."""
    by_shard: dict[int, list[Cancel]] = {}
    for c in cancels:
        by_shard.setdefault(shard_for(c.tenant, c.queue, c.timer_key, shards), []).append(c)
    for partition, group in by_shard.items():
        shard = owned.get(partition)
        if shard is None:
            return False
        with shard.lock:
            if shard.closed or not shard.runtime.is_recovered():
                return False
            if not isinstance(committed_verdict(shard.store, group), list):
                return False
    return True
