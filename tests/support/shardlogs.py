"""The shard logs of the `ShardLog` contract (tests/runtime/test_shardlog_contract.py), each
behind one small kit, so that every contract test runs unchanged over all of them.

Theory of operation: a `Kit` makes owners of one shard (an `Owner`: a `ShardLog` over a
`ShardStore`, opened), feeds a client command into the shard's log the way its deployment
does, reads the log back without any owner's store, and plays a crash. Everything else a test
does goes through the port's own methods. An `Owner` keeps what its log folded, call by call,
and drives its log the way the runtime's tick does (`runtime/shard.py`): commit, and while
the log is not settled, wait for it and commit again.

* `EmbeddedKit`: `EmbeddedLog`, the log in the store's own LMDB environment. A client command
  is committed like the runtime's intake commits it; the log read back is the store's, opened
  read-only; a second owner of the shard is a second opener of the same directory.
* `KafkaKit`: `KafkaLog` on partition 0 of a commands topic of its own on the real broker,
  each owner with a store directory of its own. A client command is an envelope produced to
  the partition, as the command RPC produces it; the log read back is the partition as every
  owner counts it (`kafka_cluster.read_shard_log`).
"""

from __future__ import annotations

import abc
import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from nereus.adapters.kafka.log import KafkaLog, KafkaLogConfig
from nereus.adapters.kafka.wire import Envelope, encode_envelope
from nereus.kernel.effects import Effect
from nereus.kernel.records import Appendable, LogEntry, Record
from nereus.runtime.shardlog import EmbeddedLog, ShardLog
from nereus.storage.store import ShardStore
from tests.support.kafka_cluster import read_shard_log
from tests.support.kafka_env import create_topic, unique_topic

Folded = tuple[LogEntry, tuple[Effect, ...]]
# How long a log may take to fold what it was given (the Kafka log: a round trip through the
# broker per commit, on two shared cores).
FOLD_TIMEOUT_S = 30.0
LOG_APPEND = {"message.timestamp.type": "LogAppendTime"}


def now_ms() -> int:
    return int(time.time() * 1000)


def no_rows(_txn: Any) -> None:
    """The `also` of a commit that has no runtime rows to write."""


@dataclass
class Call:
    """One `commit` call: what it was given, and its two answers."""

    items: list[Appendable]
    entries: list[LogEntry]
    folded: list[Folded]


@dataclass
class Owner:
    name: str
    log: ShardLog
    store: ShardStore
    calls: list[Call] = field(default_factory=list)
    written: list[Record] = field(default_factory=list)
    store_open: bool = True

    @property
    def folded(self) -> list[Folded]:
        return [applied for call in self.calls for applied in call.folded]

    def commit(self, *items: Appendable) -> Call:
        entries, folded = self.log.commit(list(items), now_ms(), no_rows)
        call = Call(list(items), entries, folded)
        self.calls.append(call)
        self.written.extend(record for record, _payload in items)
        return call

    def drive(self, until: Callable[[], bool] = lambda: True) -> None:
        """Commit nothing new until the log is settled and `until` holds, as the runtime's
        tick does: fold what the log has, else wait for it."""
        wake = threading.Event()
        deadline = time.monotonic() + FOLD_TIMEOUT_S
        while not (self.log.settled() and until()):
            assert time.monotonic() < deadline, f"{self.name}: nothing folded in time"
            if not self.log.pending():
                self.log.wait(0.05, wake)
            self.commit()

    def drive_to(self, count: int) -> None:
        """Drive until `count` entries were folded by this owner."""
        self.drive(lambda: len(self.folded) >= count)


class Kit(abc.ABC):
    """One implementation of the port, and everything the contract needs around it."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.owners: list[Owner] = []
        self._names = itertools.count()

    def owner(self, name: str | None = None) -> Owner:
        """A new owner of the shard under test, its log opened."""
        name = name or f"owner{next(self._names)}"
        store = self.open_store(name)
        try:
            log = self.make_log(store, name)
            log.open()
        except BaseException:
            store.close()
            raise
        made = Owner(name, log, store)
        self.owners.append(made)
        return made

    @abc.abstractmethod
    def open_store(self, name: str) -> ShardStore: ...

    @abc.abstractmethod
    def make_log(self, store: ShardStore, name: str) -> ShardLog: ...

    @abc.abstractmethod
    def rival(self, first: Owner) -> Owner:
        """Another process's owner of the shard `first` owns."""

    @abc.abstractmethod
    def heir(self, dead: Owner) -> Owner:
        """The owner that takes the shard over on the data `dead` left."""

    @abc.abstractmethod
    def command(self, owner: Owner, item: Appendable) -> None:
        """Put a client command into the shard's log the way this log's deployment does."""

    @abc.abstractmethod
    def durable_entries(self, owner: Owner) -> list[LogEntry]:
        """The shard's log as a reader of the log alone finds it."""

    def crash(self, owner: Owner) -> None:
        """The owner's process dies: its store is let go, its log is not closed."""
        owner.store.close()
        owner.store_open = False

    def close(self) -> None:
        for made in self.owners:
            made.log.close()
            if made.store_open:
                made.store.close()


class EmbeddedKit(Kit):
    def open_store(self, name: str) -> ShardStore:
        return ShardStore.open(str(self.tmp_path / name))

    def make_log(self, store: ShardStore, name: str) -> ShardLog:
        return EmbeddedLog(store)

    def rival(self, first: Owner) -> Owner:
        return self.owner(first.name)  # the log is the directory's

    def heir(self, dead: Owner) -> Owner:
        return self.owner(dead.name)

    def command(self, owner: Owner, item: Appendable) -> None:
        # The runtime's intake hands client commands to the log's commit.
        owner.commit(item)

    def durable_entries(self, owner: Owner) -> list[LogEntry]:
        # What LMDB committed (and synced) is the log; a live owner's open reads it, as a
        # second open in its process may not.
        if owner.store_open:
            return list(owner.store.iter_log())
        path = str(self.tmp_path / owner.name)
        with ShardStore.open(path, create=False, read_only=True) as reader:
            return list(reader.iter_log())


class KafkaKit(Kit):
    def __init__(self, tmp_path: Path, bootstrap: str) -> None:
        super().__init__(tmp_path)
        self.bootstrap = bootstrap
        self.topic = create_topic(bootstrap, unique_topic("contract"), config=LOG_APPEND)
        self.replies = create_topic(bootstrap, unique_topic("contract-rep"))

    def open_store(self, name: str) -> ShardStore:
        return ShardStore.open(str(self.tmp_path / name), shard_id=f"kafka:{self.topic}:0")

    def make_log(self, store: ShardStore, name: str) -> ShardLog:
        config = KafkaLogConfig(
            bootstrap=self.bootstrap,
            topic=self.topic,
            partition=0,
            replies_topic=self.replies,
            process_id=name,
        )
        return KafkaLog(store, config)

    def rival(self, first: Owner) -> Owner:
        return self.owner(f"{first.name}-rival")

    def heir(self, dead: Owner) -> Owner:
        return self.owner(dead.name)  # resumes from what the store folded

    def command(self, owner: Owner, item: Appendable) -> None:
        record, payload = item
        with _producer(self.bootstrap) as producer:
            envelope = Envelope(uuid.uuid4().hex, None, record, payload)
            producer.produce(self.topic, encode_envelope(envelope), partition=0)

    def durable_entries(self, owner: Owner) -> list[LogEntry]:
        return [logged.entry for logged in read_shard_log(self.bootstrap, self.topic, 0)]


@contextmanager
def _producer(bootstrap: str) -> Iterator[Any]:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    yield producer
    assert producer.flush(10) == 0, "a command was not delivered to the broker"


def records_of(folded: Sequence[Folded]) -> list[Record]:
    return [entry.record for entry, _effects in folded]
