"""How an embedded program receives its timers: a consumer of the local destination.

    with nereus.consumer("reminders", group="mailer") as consumer:
        for record in consumer.records(idle_timeout_s=30):
            send_mail(record.payload)          # committed when the loop asks for the next

    nereus.consumer("reminders", group="mailer").run(handle)   # the handler form

Theory of operation: a tenant's queue's deliveries are a topic of the local destination with
dense offsets from 0 (`adapters.tenant_topics.local_topic`; the consumer reads the default
tenant's unless given `tenant`), so a consumer sees its own tenant's records and no
other's. A consumer group has one durable position per topic, kept in the destination's own
LMDB environment: the offset of the first record the group has not handled. A consumer
starts there and hands records out in offset order, a batch at a time
(what is there, up to `max_batch`); committing moves the position past what was handled, in
one synced write. Delivery is at least once: a record handed out but not committed (a crash,
an exception, a `break`) is handed out again by the group's next consumer, and the position
never moves past a record that was not handled, so nothing is skipped.

With `auto_commit` (the default) a record counts as handled when its handler returns
(`run`) or when the loop asks for the next one (`records()`), and the handled records are
committed in one write when the batch is done, before the consumer waits for more, and when
the handler raises or the loop is left (then up to the record before). So a crash hands out
again at most one batch; a handler that raises or a loop left by `break` sees only its own
record again. `poll()` with auto commit commits what the previous poll returned. Without
auto commit the program calls `commit()` itself.

One consumer per group and topic at a time, in any process (a lock file beside the
environment): two would hand out the same records. Waiting for records blocks without
polling: on a condition the destination's sends notify when the records are written by this
process (the embedded runtime), on a FIFO the writer's sends wake when they are written by
another (`adapters.local.wake`).

`open_consumer(data_dir, queue, group=...)` is the way in from another process than the one
that runs the service: it opens the data directory's local destination for reading (no lock
on the directory: the service keeps it) and closes it with the consumer. `AsyncConsumer`
(`adapters.local.async_consumer`) is the same consumer for asyncio.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
from collections.abc import Callable, Iterator

from nereus.adapters.local.destination import LocalDestination, LocalRecord
from nereus.adapters.tenant_topics import LOCAL_SEPARATOR, name_ok
from nereus.kernel.keys import DEFAULT_TENANT
from nereus.service.arguments import integer, text
from nereus.storage import files
from nereus.storage.errors import StoreError

# Where `Nereus.open(DIR)` and `nereus serve --data DIR` keep the local destination.
DESTINATION_DIR = "destination"

# A group name is part of an LMDB key beside the topic (511 bytes at most).
MAX_GROUP_BYTES = 150
# Records handed out at once: what a crash may hand out again under auto commit.
DEFAULT_MAX_BATCH = 100


class ConsumerBusy(RuntimeError):
    """Another consumer of the same group and topic is open (in this or another process)."""


class LocalConsumer:
    """Reads one tenant's queue (one topic) of a `LocalDestination` for one consumer group."""

    def __init__(
        self,
        destination: LocalDestination,
        queue: str,
        *,
        group: str,
        tenant: str = DEFAULT_TENANT,
        auto_commit: bool = True,
        max_batch: int = DEFAULT_MAX_BATCH,
    ) -> None:
        self.queue = text("queue", queue)
        self.tenant = text("tenant", tenant)
        # A name with '/' could spell another tenant's topic ("acme/orders" as a queue).
        if not self.queue or LOCAL_SEPARATOR in self.queue or "\x00" in self.queue:
            raise ValueError("queue must be a queue name: not empty, without '/' or NUL")
        if not name_ok(self.tenant):
            raise ValueError("tenant must be a tenant name: 1..150 bytes without '/' or NUL")
        self.topic = destination.topic_for(self.queue, tenant=self.tenant)
        self.group = text("group", group)
        if not self.group or "\x00" in self.group or len(self.group.encode()) > MAX_GROUP_BYTES:
            raise ValueError(f"group must be 1..{MAX_GROUP_BYTES} bytes without NUL")
        if not isinstance(auto_commit, bool):
            raise TypeError(f"auto_commit must be a bool, not {type(auto_commit).__name__}")
        self.auto_commit = auto_commit
        self.max_batch = _count("max_batch", max_batch)
        self._destination = destination
        # Run at close, after the last commit (an `AsyncConsumer` frees its FIFO).
        self._on_close: list[Callable[[], None]] = []
        self._lock_fd = _lock(destination.path, self.group, self.topic)
        self._closed = threading.Event()
        try:
            self._committed = destination.committed(self.group, self.topic) or 0
        except BaseException:
            os.close(self._lock_fd)
            raise
        self._next = self._committed  # the next offset to hand out
        self._handled = self._committed  # auto commit: handled below this, maybe not written
        self._polled: int | None = None  # auto commit: the end of the last poll's batch

    @property
    def committed(self) -> int:
        """The group's durable position: the first offset it has not handled."""
        return self._committed

    @property
    def position(self) -> int:
        """The next offset this consumer hands out."""
        return self._next

    def poll(
        self, timeout_s: float | None = 0.0, max_records: int | None = None
    ) -> list[LocalRecord]:
        """Up to `max_records` (default `max_batch`) records from the position on, waiting
        up to `timeout_s` (None: until there are some, or `close()`) when there are none
        yet. With auto commit, what the previous poll returned is committed first."""
        self._check_open()
        if self.auto_commit and self._polled is not None:
            self._handled = max(self._handled, self._polled)
            self._polled = None
            self._flush()
        batch = self._fetch(timeout_s, self.max_batch if max_records is None else max_records)
        if batch:
            self._next = batch[-1].offset + 1
            if self.auto_commit:
                self._polled = self._next
        return batch

    def commit(self, record: LocalRecord | None = None) -> None:
        """Durably mark handled every record handed out up to `record` (default: all handed
        out so far). The position never moves back, nor past what was handed out."""
        self._check_open()
        if record is None:
            offset = self._next
        else:
            if not self._own(record):
                raise ValueError(f"commit takes a record of {self.topic!r} from this consumer")
            if record.offset >= self._next:
                raise ValueError(f"record {record.offset} was not handed out by this consumer")
            offset = record.offset + 1
        self._handled = max(self._handled, offset)
        self._flush()

    def rewind(self) -> None:
        """Hand out again, from the committed position, every record handed out and not
        committed (a program that could not handle them wants them back)."""
        self._check_open()
        self._next = self._committed
        self._handled = self._committed
        self._polled = None

    def records(
        self, *, limit: int | None = None, idle_timeout_s: float | None = None
    ) -> Iterator[LocalRecord]:
        """Each record in turn, waiting for more as they are delivered; ends after `limit`
        records (None: no limit), after `idle_timeout_s` without a new record (None: never),
        or at `close()`. With auto commit a record is handled when the loop asks for the
        next one; one whose loop body raised or left the loop (unless committed with
        `commit(record)` first) is handed out again, by this consumer too."""
        left = None if limit is None else _count("limit", limit)
        while left is None or left > 0:
            batch = self._fetch(
                idle_timeout_s, self.max_batch if left is None else min(left, self.max_batch)
            )
            if not batch:
                return
            for record in batch:
                self._next = record.offset + 1
                finished = False
                try:
                    yield record
                    finished = True
                finally:
                    if not finished:
                        self._leave(record)
                if self._closed.is_set():
                    return
                if self.auto_commit:
                    self._handled = record.offset + 1
            if left is not None:
                left -= len(batch)
            self._flush_handled()

    def __iter__(self) -> Iterator[LocalRecord]:
        return self.records()

    def run(
        self,
        handler: Callable[[LocalRecord], object],
        *,
        limit: int | None = None,
        idle_timeout_s: float | None = None,
    ) -> int:
        """Call `handler(record)` for each record in turn until `limit` records were handled
        (None: no limit), `idle_timeout_s` passes without a record (None: never) or the
        consumer is closed (from another thread, say); with auto commit each batch is
        committed once its handlers returned. A handler that raises ends the run with its
        exception, what was handled before it committed and its own record handed out
        again. Returns how many records were handled."""
        left = None if limit is None else _count("limit", limit)
        handled = 0
        while left is None or handled < left:
            want = self.max_batch if left is None else min(left - handled, self.max_batch)
            batch = self._fetch(idle_timeout_s, want)
            if not batch:
                break
            for record in batch:
                self._next = record.offset + 1
                try:
                    handler(record)
                except BaseException:
                    self._leave(record)
                    raise
                handled += 1
                if self._closed.is_set():
                    return handled
                if self.auto_commit:
                    self._handled = record.offset + 1
            self._flush_handled()
        return handled

    def close(self) -> None:
        """Stop: a blocked `poll`, `records()` or `run` returns. With auto commit, what was
        handled is committed first; a record handed out and not handled is handed out again
        to the group's next consumer."""
        if self._closed.is_set():
            return
        try:
            if self.auto_commit:
                self._flush()
        finally:
            self._closed.set()
            self._destination.wake()
            os.close(self._lock_fd)
            for hook in self._on_close:
                hook()

    def __enter__(self) -> LocalConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _fetch(self, timeout_s: float | None, max_records: int) -> list[LocalRecord]:
        """Records from the position on (not yet handed out), waiting for some; what was
        handled is committed before waiting."""
        max_records = _count("max_records", max_records)
        check_timeout_s(timeout_s)
        if self._closed.is_set():
            return []
        batch = self._destination.read(self.topic, self._next, max_records)
        if batch:
            return batch
        self._flush_handled()
        if not self._destination.wait_for(self.topic, self._next, timeout_s, self._closed.is_set):
            return []
        return self._destination.read(self.topic, self._next, max_records)

    def _leave(self, record: LocalRecord) -> None:
        """The handler of `record` raised or its loop was left: commit what came before and
        (with auto commit) hand `record` out again."""
        if self.auto_commit:
            # Unless the program committed it itself before it left.
            self._next = max(record.offset, self._committed)
        if not self._closed.is_set():
            self._flush_handled()

    def _flush_handled(self) -> None:
        if self.auto_commit and not self._closed.is_set():
            self._flush()

    def _flush(self) -> None:
        if self._handled > self._committed:
            self._destination.commit(self.group, self.topic, self._handled)
            self._committed = self._handled

    def _own(self, record: object) -> bool:
        """A record of this consumer's topic (one written before records carried their
        tenant has none: it is in a default tenant's topic)."""
        return (
            isinstance(record, LocalRecord)
            and record.queue == self.queue
            and (record.tenant or DEFAULT_TENANT) == self.tenant
        )

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise RuntimeError(f"the consumer of {self.topic!r} for {self.group!r} is closed")


def open_consumer(
    data_dir: str | os.PathLike[str],
    queue: str,
    *,
    group: str,
    tenant: str = DEFAULT_TENANT,
    auto_commit: bool = True,
    max_batch: int = DEFAULT_MAX_BATCH,
) -> LocalConsumer:
    """A consumer of `tenant`'s `queue` for `group` in the local destination of `data_dir`
    (the directory of `Nereus.open` or `nereus serve --data`), for a process other than
    the one that has the directory open: it reads beside the running service and takes
    no lock on the directory. Same rules as `Nereus.consumer`; closing it closes what it
    opened. Raises `FileNotFoundError` when `data_dir` has no local destination (the
    service never ran there, or it delivers to Kafka or Pulsar), `ValueError` when this
    process itself has `data_dir` open (use that `Nereus`'s `consumer()`: LMDB allows
    one environment per file and process) and `ConsumerBusy` when the group already has
    a consumer of the queue."""
    path = os.path.realpath(destination_path(data_dir))
    destination = _open_reader(path)
    try:
        consumer = LocalConsumer(
            destination,
            queue,
            group=group,
            tenant=tenant,
            auto_commit=auto_commit,
            max_batch=max_batch,
        )
    except BaseException:
        _close_reader(path)
        raise
    consumer._on_close.append(lambda: _close_reader(path))
    return consumer


# The destinations `open_consumer` opened in this process, with how many consumers use each:
# LMDB (and py-lmdb, which refuses it) allows one environment per file and process, so the
# consumers of one directory share it, and the last one to close closes it.
_readers: dict[str, tuple[LocalDestination, int]] = {}
_readers_lock = threading.Lock()


def _open_reader(path: str) -> LocalDestination:
    with _readers_lock:
        known = _readers.get(path)
        if known is None:
            known = (_open_destination(path), 0)
        destination, users = known
        _readers[path] = (destination, users + 1)
        return destination


def _open_destination(path: str) -> LocalDestination:
    try:
        return LocalDestination(path)
    except StoreError as exc:
        # py-lmdb's own refusal, when this process's Nereus has the directory open. (Not
        # asked of the directory's lock: a probe of it could make a starting service fail.)
        if "already open in this process" in str(exc.__cause__):
            raise ValueError(
                f"this process has {os.path.dirname(path)!r} open (Nereus.open): use its "
                "consumer() or async_consumer() instead of opening the destination again"
            ) from exc
        raise


def _close_reader(path: str) -> None:
    with _readers_lock:
        destination, users = _readers[path]
        if users > 1:
            _readers[path] = (destination, users - 1)
            return
        del _readers[path]
        destination.close()


def destination_path(data_dir: str | os.PathLike[str]) -> str:
    """The local destination of a data directory (it must have one)."""
    directory = os.fspath(data_dir)
    path = os.path.join(directory, DESTINATION_DIR)
    if not os.path.isfile(os.path.join(path, "data.mdb")):
        raise FileNotFoundError(
            f"no local destination under {directory!r} (expected {path!r}): give the data "
            "directory of Nereus.open / nereus serve --data, after it started once; a "
            "service that delivers to Kafka or Pulsar is read with that broker's client"
        )
    return path


def check_timeout_s(timeout_s: object) -> None:
    """A wait's `timeout_s`: a number of seconds, or None for no limit (not a bool)."""
    if timeout_s is not None and (
        isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float)
    ):
        raise TypeError(f"timeout_s must be a number or None, not {type(timeout_s).__name__}")


def _count(name: str, value: object) -> int:
    number = integer(name, value)
    if number < 1:
        raise ValueError(f"{name} must be at least 1, not {number}")
    return number


def _lock(path: str, group: str, topic: str) -> int:
    folder = os.path.join(path, "consumers")
    files.make_dirs(folder)
    name = hashlib.sha256(f"{group}\x00{topic}".encode()).hexdigest()[:32]
    fd = files.create_file(os.path.join(folder, f"{name}.lock"), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise ConsumerBusy(
            f"group {group!r} already has a consumer of {topic!r} ({holder}): one at a "
            "time per group and queue"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}".encode(), 0)
    return fd
