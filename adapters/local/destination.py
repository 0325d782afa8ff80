"""The embedded default destination: durable local topics in their own LMDB environment.

Theory of operation: each tenant's queue is a topic with dense offsets from 0, named by
`adapters.tenant_topics.local_topic`: the queue's name for the default tenant,
`<tenant>/<queue>` for any other (no name holds '/', so two tenants never share a topic).
Every record names its tenant, queue and timer key. A batch of sends is written in one LMDB write
transaction committed with sync, so after `submit` returns each record is either durably
there with its offset or not there at all. An index from attempt id
to (topic, offset) gives exact evidence lookup. Consumers (`adapters.local.consumer`, and
`nereus tail --group`) keep their positions here too, one per consumer group and topic,
and are woken by the sends: those of their own process through a condition, those of
another process through a FIFO per waiting consumer (`adapters.local.wake`).

The destination is a separate environment from the shard store on purpose: it stands for a
broker. The shard store never writes here and this never writes there, so "the PUBLISHING
record was durable before the send" is a checkable fact, not an accident of one transaction.

One writer at a time, and proofs of absence. A writer (`open`, called by the runtime before
recovery; `submit` takes it too if nobody called `open`) holds an exclusive `flock` on the
directory's `LOCK` (`storage.lock`) until `close`; a second writer, in this process or
another, is refused with `StoreLocked` naming the holder. Readers (consumers, `nereus tail`)
take no lock. Holding the lock is the local destination's fence: every earlier writer has
closed or died, and LMDB committed each of its batches whole or not at all, so nothing it
sent can still appear. The fence id is the directory's own (`local:<id>`, the id written into
the environment by its first writer), so every Admission the shard store recorded against
this directory names it, whichever process made it. A search made with the lock held is
complete and carries `Fence(fence_id, fenced_at_ms)`, `fenced_at_ms` being the wall-clock
time at which this instance took the lock, and proves absent exactly the attempts whose send
cannot still land:

* a search and a submit of this instance never overlap (`_writing`): every send begun before
  the search has committed or failed by the time the index is read;
* an attempt admitted at or after `fenced_at_ms` (its lookup's `since_ms`, the Admission's
  persistence time) may be this instance's own, whose send may still come: the search lists
  it `unfenced` and proves nothing about it. The runtime never sends an attempt it found
  PUBLISHING at start (no send gate survives a restart), so everything admitted before this
  instance locked the directory was sent, if at all, by a writer that is gone.

Both times are the host's wall clock. A clock stepped back across a restart can only make an
earlier writer's attempt look admitted after the lock: it is then left unproven (UNKNOWN, as
without a fence), never proven wrongly.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import lmdb
import msgspec

from nereus.adapters.local.arrivals import Arrivals
from nereus.adapters.local.wake import notify
from nereus.adapters.tenant_topics import local_topic, split_local_topic
from nereus.kernel.keys import DEFAULT_TENANT
from nereus.kernel.records import IMMEDIATE, Capability, Evidence, NotPublished, Published
from nereus.runtime.destination import (
    H_TENANT,
    H_TIMER_KEY,
    Fence,
    FinishedSearch,
    Lookup,
    Search,
    SearchOutcome,
    Send,
    SendResult,
)
from nereus.runtime.timer_key_header import decode_timer_key
from nereus.storage import files
from nereus.storage.codec import decode_struct, encode_value
from nereus.storage.errors import StoreError
from nereus.storage.lmdbcheck import check_data_file
from nereus.storage.lock import DirectoryLock, lock_directory

DEFAULT_MAX_RECORD_BYTES = 1024 * 1024 + 64 * 1024
# Where the environment keeps the directory's identity (the fence id's), written once.
_IDENTITY_KEY = b"identity"
FENCE_PREFIX = "local:"


class LocalRecord(msgspec.Struct, frozen=True):
    """One delivered record. `queue` is the queue it was scheduled to (a dead-letter copy's
    is `<queue>.dlq`), `tenant` the tenant whose timer it is and `timer_key` the timer's key
    (decoded from the `nereus-timer-key` header); each None on a record written before
    records carried it (`specs/destinations.md`)."""

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
    tenant: str | None = None
    timer_key: str | None = None


def _record_key(topic: str, offset: int) -> bytes:
    return topic.encode() + b"\x00" + offset.to_bytes(8, "big")


class LocalDestination:
    """A `runtime.destination.Destination` over local LMDB topics."""

    name = "local"
    capability: Capability = IMMEDIATE
    # None until this instance holds the directory's lock (`open`): only then is it fenced.
    fence_id: str | None = None

    def __init__(
        self,
        path: str,
        *,
        sync: bool = True,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
        before_send: Callable[[Sequence[Send]], None] | None = None,
        map_size_bytes: int = 64 * 1024**3,
    ) -> None:
        files.make_dirs(path)
        check_data_file(os.path.join(path, "data.mdb"))
        self.path = path
        self._max_record_bytes = max_record_bytes
        # A test hook: runs inside submit, before the write, to check what the sender knew.
        self._before_send = before_send
        try:
            # Address space, not disk (as the shard store's): LMDB grows the file as used.
            self._env: Any = lmdb.open(
                path, map_size=map_size_bytes, max_dbs=8, sync=sync, mode=files.file_mode()
            )
            self._records = self._env.open_db(b"records")
            self._offsets = self._env.open_db(b"offsets")
            self._attempts = self._env.open_db(b"attempts")
            self._positions = self._env.open_db(b"positions")
        except lmdb.Error as exc:
            raise StoreError(path, f"cannot open the local destination: {exc}") from exc
        self._results: list[SendResult] = []
        # Consumers waiting in `wait_for`, woken after every committed batch of sends.
        self._arrivals = Arrivals(path, self)
        # The directory's lock while this instance is its writer, and the fence it makes.
        self._lock: DirectoryLock | None = None
        self._fence: Fence | None = None
        # Held by every submit across its write, and by every search across its read.
        self._writing = threading.Lock()

    def open(self, store_id: str) -> None:
        """Become the directory's writer: take its lock (`StoreLocked` if another writer
        holds it) and fence every earlier one."""
        self._take_lock()
        # Every record of the directory is now written by this process: its consumers are
        # woken by its sends, without a FIFO.
        self._arrivals.writer = True

    def _take_lock(self) -> None:
        if self._lock is not None:
            return
        lock = lock_directory(self.path)
        try:
            # Opened by the writer only: a reader never creates a database here.
            meta = self._env.open_db(b"meta")
            with self._env.begin(write=True) as txn:
                identity = txn.get(_IDENTITY_KEY, db=meta)
                if identity is None:
                    identity = uuid.uuid4().hex.encode()
                    txn.put(_IDENTITY_KEY, identity, db=meta)
        except lmdb.Error as exc:
            lock.release()
            raise StoreError(self.path, f"cannot record the destination's id: {exc}") from exc
        self._lock = lock
        self.fence_id = FENCE_PREFIX + identity.decode()
        # Taken once the lock is held: every writer before it has gone.
        self._fence = Fence(self.fence_id, time.time_ns() // 1_000_000)

    @property
    def fence(self) -> Fence | None:
        """The fence this instance made when it took the directory's lock, while it holds it."""
        return self._fence if self._lock is not None and self._lock.held else None

    def max_record_bytes(self, topic: str) -> int:
        return self._max_record_bytes

    def topic_for(self, queue: str, *, tenant: str = DEFAULT_TENANT) -> str:
        return local_topic(tenant, queue)

    def submit(self, sends: Sequence[Send], now_ms: int) -> None:
        if not sends:
            return
        self._take_lock()  # records are written by the directory's one writer only
        with self._writing:
            self._submit(sends, now_ms)

    def _submit(self, sends: Sequence[Send], now_ms: int) -> None:
        if self._before_send is not None:
            self._before_send(sends)
        written: list[SendResult] = []
        try:
            with self._env.begin(write=True) as txn:
                next_offsets: dict[str, int] = {}
                for send in sends:
                    p = send.prepared
                    if p.size_bytes() > self._max_record_bytes:
                        written.append(
                            SendResult(
                                send.attempt_id,
                                p.message_id,
                                p.generation,
                                NotPublished("permanent", "record_too_large"),
                            )
                        )
                        continue
                    offset = next_offsets.get(p.topic)
                    if offset is None:
                        raw = txn.get(p.topic.encode(), db=self._offsets)
                        offset = 0 if raw is None else int.from_bytes(raw, "big")
                    record = _record(send, offset, now_ms)
                    txn.put(_record_key(p.topic, offset), encode_value(record), db=self._records)
                    txn.put(
                        send.attempt_id.encode(),
                        _record_key(p.topic, offset),
                        db=self._attempts,
                    )
                    next_offsets[p.topic] = offset + 1
                    written.append(
                        SendResult(
                            send.attempt_id,
                            p.message_id,
                            p.generation,
                            Published(Evidence(p.topic, 0, offset, now_ms)),
                        )
                    )
                for topic, offset in next_offsets.items():
                    txn.put(topic.encode(), offset.to_bytes(8, "big"), db=self._offsets)
            if next_offsets:
                self.wake()
                # Consumers in other processes: after the commit, so none misses it.
                notify(self.path)
        except lmdb.Error as exc:
            # The transaction did not commit: every record of the batch is definitely absent.
            written = [
                SendResult(
                    s.attempt_id,
                    s.prepared.message_id,
                    s.prepared.generation,
                    NotPublished("retriable", "local_destination_error", str(exc)),
                )
                for s in sends
            ]
        self._results.extend(written)

    def poll(self, timeout_s: float) -> list[SendResult]:
        results, self._results = self._results, []
        return results

    def search(self, lookups: Sequence[Lookup], wake: Callable[[], None]) -> Search:
        """Every lookup is an index read: the search is over when it is made. With the lock
        held it is fenced, and proves absent what it misses among the attempts admitted
        before the fence (see the module's docstring)."""
        found: dict[str, Evidence] = {}
        with self._writing:  # no send of this instance is half done while the index is read
            fence = self.fence
            for lookup in lookups:
                evidence = self.find(lookup.attempt_id, lookup.topic, lookup.since_ms)
                if evidence is not None:
                    found[lookup.attempt_id] = evidence
        unfenced: frozenset[str] = frozenset()
        if fence is not None:
            unfenced = frozenset(
                lk.attempt_id for lk in lookups if lk.since_ms >= fence.fenced_at_ms
            )
        outcome = SearchOutcome(
            found, complete=True, fence=fence, searched="attempt index", unfenced=unfenced
        )
        return FinishedSearch(outcome)

    def find(self, attempt_id: str, topic: str, since_ms: int) -> Evidence | None:
        with self._env.begin() as txn:
            key = txn.get(attempt_id.encode(), db=self._attempts)
            if key is None:
                return None
            raw = txn.get(key, db=self._records)
        if raw is None:
            return None
        record = decode_struct(LocalRecord, raw, self.path, f"record {key!r}")
        topic = key.partition(b"\x00")[0].decode()
        return Evidence(topic, 0, record.offset, record.delivered_at_ms)

    def read(self, topic: str, from_offset: int = 0, limit: int = 1000) -> list[LocalRecord]:
        out: list[LocalRecord] = []
        prefix = topic.encode() + b"\x00"
        with self._env.begin() as txn, txn.cursor(db=self._records) as cursor:
            if not cursor.set_range(_record_key(topic, from_offset)):
                return out
            for key, raw in cursor:
                if not key.startswith(prefix) or len(out) >= limit:
                    break
                out.append(decode_struct(LocalRecord, raw, self.path, f"record {key!r}"))
        return out

    def iter_all(self, topic: str) -> Iterator[LocalRecord]:
        offset = 0
        while True:
            batch = self.read(topic, offset)
            if not batch:
                return
            yield from batch
            offset = batch[-1].offset + 1

    def end_offset(self, topic: str) -> int:
        with self._env.begin() as txn:
            raw = txn.get(topic.encode(), db=self._offsets)
        return 0 if raw is None else int.from_bytes(raw, "big")

    # Consumers ----------------------------------------------------------------------------

    def wake(self) -> None:
        """Wake every consumer of this instance waiting in `wait_for` (new records, or a
        consumer closing)."""
        self._arrivals.wake()

    def wait_for(
        self, topic: str, offset: int, timeout_s: float | None, stop: Callable[[], bool]
    ) -> bool:
        """Block until `topic` holds a record at `offset` (True), `timeout_s` passed or
        `stop()` says so (False); see `adapters.local.arrivals`."""
        return self._arrivals.wait_for(topic, offset, timeout_s, stop)

    def topics(self) -> list[str]:
        """Every topic that ever held a record, in byte order."""
        with self._env.begin() as txn, txn.cursor(db=self._offsets) as cursor:
            return [bytes(key).decode() for key, _ in cursor]

    def committed(self, group: str, topic: str) -> int | None:
        """The next offset `group` is to read from `topic`, or None if it never committed."""
        with self._env.begin() as txn:
            raw = txn.get(_position_key(group, topic), db=self._positions)
        return None if raw is None else int.from_bytes(raw, "big")

    def commit(self, group: str, topic: str, offset: int) -> None:
        """Durably record that `group` has handled `topic` below `offset` (one synced
        write transaction)."""
        with self._env.begin(write=True) as txn:
            txn.put(_position_key(group, topic), offset.to_bytes(8, "big"), db=self._positions)

    def close(self) -> None:
        self._arrivals.close(self._env.close)
        if self._lock is not None:
            self._lock.release()  # last: nothing of the directory is open any more


def _record(send: Send, offset: int, now_ms: int) -> LocalRecord:
    """The record a send writes at `offset` of its topic, delivered at `now_ms`."""
    p = send.prepared
    tenant, queue, timer_key = _names(send)
    return LocalRecord(
        queue=queue,
        offset=offset,
        partition=p.key.decode() if p.key is not None else None,
        message_id=p.message_id,
        generation=p.generation,
        attempt_id=send.attempt_id,
        txn=p.txn,
        deliver_at_ms=p.deliver_at_ms,
        delivered_at_ms=now_ms,
        headers=[(k, v.decode(errors="replace")) for k, v in send.headers()],
        payload=p.value,
        producer_sub=p.producer_sub,
        encrypted=p.encrypted,
        tenant=tenant,
        timer_key=timer_key,
    )


def _names(send: Send) -> tuple[str, str, str | None]:
    """The tenant, queue and timer key a send's record names: tenant and key from their
    headers (what the message says), the queue from its topic. A send without the key header
    (one built by hand, not by `runtime.prepare`) names no key."""
    tenant, queue = split_local_topic(send.prepared.topic)
    timer_key = None
    for name, value in send.prepared.headers:
        if name == H_TENANT:
            tenant = value.decode(errors="replace")
        elif name == H_TIMER_KEY:
            timer_key = decode_timer_key(value)
    return tenant, queue, timer_key


def _position_key(group: str, topic: str) -> bytes:
    return group.encode() + b"\x00" + topic.encode()
