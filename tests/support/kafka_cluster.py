"""Helpers for the Kafka shard log tests: service processes, and an auditor reading Kafka.

`ServiceProc` runs `nereus serve --kafka ...` as a subprocess (its JSON log goes to a file
the test reads: the URL, the process id, and each shard tenure it opened), talks to it over
HTTP, and signals it. The auditor functions read the truth back from the broker, not from
any process: `read_shard_log` rebuilds a shard's log from its commands partition exactly as
an owner counts it (committed data records, LogAppendTime), `audit` folds every shard with
the kernel and checks the destination topic against the ledger.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, KafkaError, TopicPartition

from nereus.adapters.kafka.config import KafkaServiceConfig
from nereus.adapters.kafka.wire import Envelope, decode_envelope, shard_for
from nereus.kernel.config import KernelConfig
from nereus.kernel.digest import state_digest
from nereus.kernel.keys import message_id
from nereus.kernel.model import Attempt, AttemptStatus, Message, Status, Table
from nereus.kernel.records import (
    LogEntry,
    NotPublished,
    PublishAdmission,
    PublishOutcome,
    Schedule,
    Unknown,
    members,
)
from nereus.replay.fold import replay
from nereus.runtime.destination import H_ATTEMPT_ID, H_DELIVER_AT, H_MESSAGE_ID, H_PRODUCER
from nereus.storage.memory import MemoryStore
from nereus.storage.store import ShardStore
from tests.support.serve_process import json_events

ROOT = Path(__file__).resolve().parents[2]
TENANT = "default"
_OPEN = re.compile(r'^nereus_open_obligations\{shard="(\d+)"\} (\d+)', re.MULTILINE)


@dataclass
class Topics:
    commands: str
    replies: str
    group: str
    destination: str
    queue: str = "reminders"

    @classmethod
    def unique(cls, destination: str) -> Topics:
        tag = uuid.uuid4().hex[:10]
        return cls(f"cmd-{tag}", f"rep-{tag}", f"grp-{tag}", destination)


def service_config(
    bootstrap: str, topics: Topics, data: Path, *, shards: int = 1, **changes: Any
) -> KafkaServiceConfig:
    """An in-process service's configuration on `topics`, with `changes` to its defaults."""
    return KafkaServiceConfig(
        bootstrap=bootstrap,
        data_dir=str(data),
        commands_topic=topics.commands,
        replies_topic=topics.replies,
        group=topics.group,
        shards=shards,
        destination_topics={topics.queue: topics.destination},
        **changes,
    )


class ServiceProc:
    def __init__(
        self,
        name: str,
        bootstrap: str,
        topics: Topics,
        data: Path,
        *,
        shards: int,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        self.bootstrap = bootstrap
        self.topics = topics
        self.data = data
        self.shards = shards
        self.extra = extra
        self.log_path = data.parent / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.process_id = ""
        self.generation = 0
        self.token: str | None = None  # a bearer token for a service with a --config

    def start(self) -> ServiceProc:
        self.generation += 1
        self.log_path = self.data.parent / f"{self.name}-{self.generation}.log"
        t = self.topics
        cmd = [
            sys.executable,
            "-m",
            "nereus",
            "serve",
            "--kafka",
            self.bootstrap,
            "--shards",
            str(self.shards),
            "--commands-topic",
            t.commands,
            "--replies-topic",
            t.replies,
            "--group",
            t.group,
            "--topic",
            f"{t.queue}={t.destination}",
            "--data",
            str(self.data),
            "--http",
            "127.0.0.1:0",
            "--assume-clock-error-ms",
            "2",
            *self.extra,
        ]
        with open(self.log_path, "wb") as err:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err)
        return self

    def events(self) -> list[dict[str, Any]]:
        return json_events(self.log_path)

    def wait_serving(self, timeout_s: float = 60.0) -> ServiceProc:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for e in self.events():
                if e.get("event") == "serving":
                    self.url, self.process_id = e["url"], e["process"]
                    return self
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited: {self.log_tail()}")
            time.sleep(0.05)
        raise AssertionError(f"{self.name} never served: {self.log_tail()}")

    def log_tail(self, n: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""

    def http(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if self.token is not None:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def health(self) -> dict[str, Any]:
        try:
            return self.http("GET", "/healthz")[1] or {}
        except (OSError, json.JSONDecodeError):
            return {}

    def active_shards(self) -> set[int]:
        owned = self.health().get("owned", {})
        return {int(p) for p, state in owned.items() if state == "active"}

    def schedule(self, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
        status, doc = self.http("POST", "/api/v1/timers", {"operations": ops})
        assert status == 200, (self.name, status, doc)
        results: list[dict[str, Any]] = doc["results"]
        return results

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def stop(self, timeout_s: float = 60.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired as exc:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"{self.name} did not stop: {self.log_tail()}") from exc

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)  # a stopped process must die too
            self.proc.kill()
            self.proc.wait()

    def tenures(self) -> dict[str, int]:
        """tenure token -> partition, for every shard tenure this process opened."""
        return {
            e["tenure"]: int(e["partition"])
            for e in self.events()
            if e.get("event") == "shard_log_opened"
        }


def schedule_op(key: str, delay_ms: int, queue: str = "reminders") -> dict[str, Any]:
    return {
        "op": "schedule",
        "queue": queue,
        "timerKey": key,
        "delayMs": delay_ms,
        "txn": f"txn-{key}",
        "payload": base64.b64encode(f"payload-{key}".encode()).decode(),
        "partition": key[-1],
    }


def metric_sum(proc: ServiceProc, name: str, **labels: str) -> float:
    """A metric of the process's /metrics summed over its series (those with `labels`)."""
    try:
        with urllib.request.urlopen(proc.url + "/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return 0.0
    total = 0.0
    for m in re.finditer(rf"^{re.escape(name)}(?:{{([^}}]*)}})? (\S+)$", text, re.MULTILINE):
        found = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(m.group(2))
    return total


def open_obligations(proc: ServiceProc) -> int:
    """Attempts PUBLISHING or UNKNOWN over the process's shards."""
    return int(metric_sum(proc, "nereus_open_obligations"))


def schedule_many(proc: ServiceProc, keys: list[str], delay_ms: int, batch: int = 250) -> None:
    for i in range(0, len(keys), batch):
        ops = [schedule_op(k, delay_ms) for k in keys[i : i + batch]]
        results = proc.schedule(ops)
        assert all(r["status"] == "scheduled" for r in results), results


def keys_on_shards(
    prefix: str, n: int, shard_count: int, shards: set[int] | None = None
) -> list[str]:
    """n timer keys `prefix0`, `prefix1`, ... of the reminders queue whose shards are all in
    `shards` (None: any shard)."""
    keys: list[str] = []
    i = 0
    while len(keys) < n:
        key = f"{prefix}{i}"
        if shards is None or shard_for(TENANT, "reminders", key, shard_count) in shards:
            keys.append(key)
        i += 1
    return keys


def all_delivered(procs: list[ServiceProc], keys: list[str]) -> Callable[[], bool]:
    """A predicate for `wait_until`: every key DELIVERED, asked of whichever live process
    answers for its shard (keys found DELIVERED are not asked again)."""
    left = set(keys)

    def check() -> bool:
        for k in list(left):
            for proc in procs:
                if proc.proc is None or proc.proc.poll() is not None:
                    continue
                status, doc = proc.http("GET", f"/api/v1/timers/reminders/{k}")
                if status == 200 and doc.get("status") == "DELIVERED":
                    left.discard(k)
                    break
        return not left

    return check


def wait_until(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


# The auditor --------------------------------------------------------------------------------


@dataclass
class LoggedEntry:
    offset: int
    entry: LogEntry
    envelope: Envelope


def _read_all(bootstrap: str, tps: list[TopicPartition], timeout_s: float) -> list[Any]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"audit-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    out: list[Any] = []
    try:
        consumer.assign(tps)
        left = {tp.partition for tp in tps}
        deadline = time.monotonic() + timeout_s
        while left and time.monotonic() < deadline:
            for m in consumer.consume(1000, 0.2):
                err = m.error()
                if err is None:
                    out.append(m)
                elif err.code() == KafkaError._PARTITION_EOF:
                    left.discard(m.partition())
        assert not left, f"partitions {sorted(left)} not read to their end"
    finally:
        consumer.close()
    return out


def read_shard_log(bootstrap: str, topic: str, partition: int) -> list[LoggedEntry]:
    """The shard log as every owner counts it: committed data records in offset order,
    position = their count, persisted_at = the broker's LogAppendTime."""
    out: list[LoggedEntry] = []
    for m in _read_all(bootstrap, [TopicPartition(topic, partition, 0)], 30):
        ts_type, ts = m.timestamp()
        assert ts_type == TIMESTAMP_LOG_APPEND_TIME
        try:
            envelope = decode_envelope(m.value())
        except msgspec.DecodeError:
            continue
        out.append(LoggedEntry(m.offset(), LogEntry(len(out) + 1, ts, envelope.record), envelope))
    return out


@dataclass
class DestRecord:
    partition: int
    offset: int
    timestamp_ms: int
    headers: dict[str, bytes]

    @property
    def message_id(self) -> str:
        return self.headers[H_MESSAGE_ID].decode()

    @property
    def attempt_id(self) -> str:
        return self.headers[H_ATTEMPT_ID].decode()


def read_destination(bootstrap: str, topic: str, partitions: int) -> list[DestRecord]:
    tps = [TopicPartition(topic, p, 0) for p in range(partitions)]
    out: list[DestRecord] = []
    for m in _read_all(bootstrap, tps, 30):
        ts_type, ts = m.timestamp()
        assert ts_type == TIMESTAMP_LOG_APPEND_TIME
        out.append(DestRecord(m.partition(), m.offset(), ts, dict(m.headers() or ())))
    return out


@dataclass
class Audit:
    logs: dict[int, list[LoggedEntry]]
    states: dict[int, MemoryStore]
    digests: dict[int, str]
    records: list[DestRecord]
    by_message: dict[str, list[DestRecord]] = field(default_factory=dict)
    # (message id, generation) pairs that had an attempt recorded UNKNOWN at some point.
    unknown_generations: set[tuple[str, int]] = field(default_factory=set)
    # attempt id -> the tenure (request id prefix) that wrote its Admission / its outcome
    admitted_by: dict[str, str] = field(default_factory=dict)
    resolved_by: dict[str, str] = field(default_factory=dict)

    def message(self, key: str, queue: str = "reminders") -> Message | None:
        mid = message_id(TENANT, queue, key)
        shard = shard_for(TENANT, queue, key, len(self.states))
        value = self.states[shard].tables[Table.MESSAGES].get(mid.encode())
        return value if isinstance(value, Message) else None

    def attempt(self, attempt_id: str) -> Attempt | None:
        for state in self.states.values():
            value = state.tables[Table.ATTEMPTS].get(attempt_id.encode())
            if isinstance(value, Attempt):
                return value
        return None


def audit(
    bootstrap: str,
    topics: Topics,
    shards: int,
    dest_partitions: int,
    *,
    destination_bootstrap: str | None = None,
) -> Audit:
    config = KernelConfig()
    logs = {p: read_shard_log(bootstrap, topics.commands, p) for p in range(shards)}
    states: dict[int, MemoryStore] = {}
    digests: dict[int, str] = {}
    for p, logged in logs.items():
        store, result = replay([x.entry for x in logged], config)
        states[p], digests[p] = store, result.digest
    records = read_destination(
        destination_bootstrap or bootstrap, topics.destination, dest_partitions
    )
    a = Audit(logs, states, digests, records)
    for r in records:
        a.by_message.setdefault(r.message_id, []).append(r)
    for logged in logs.values():
        for x in logged:
            tenure = x.envelope.request_id.partition(":")[0]
            for record in members(x.entry.record):
                if isinstance(record, PublishAdmission):
                    a.admitted_by[record.attempt_id] = tenure
                elif isinstance(record, PublishOutcome):
                    a.resolved_by.setdefault(record.attempt_id, tenure)
                    if isinstance(record.result, Unknown):
                        a.unknown_generations.add((record.message_id, record.generation))
    return a


def check_delivery(a: Audit, keys: list[str], *, where: str) -> dict[str, int]:
    """Every timer DELIVERED; every destination record at or after its deliverAt (broker
    time), carrying the evidence headers, of an attempt the ledger holds as PUBLISHED or
    UNKNOWN; a generation published more than once had an attempt recorded UNKNOWN. Returns
    counts for the report."""
    counts: dict[str, int] = defaultdict(int)
    for key in keys:
        m = a.message(key)
        assert m is not None, f"{where}: {key} was never scheduled in the log"
        assert m.status is Status.DELIVERED, f"{where}: {key} is {m.status}"
        assert m.evidence is not None
    wanted = {message_id(TENANT, "reminders", k) for k in keys}
    for r in a.records:
        for name in (H_MESSAGE_ID, H_ATTEMPT_ID, H_DELIVER_AT, H_PRODUCER):
            assert r.headers.get(name), f"{where}: {name} missing on {r}"
        deliver_at = int(r.headers[H_DELIVER_AT])
        assert r.timestamp_ms >= deliver_at, (
            f"{where}: {r.attempt_id} published {deliver_at - r.timestamp_ms} ms early"
        )
        attempt = a.attempt(r.attempt_id)
        assert attempt is not None, f"{where}: {r.attempt_id} at the destination, not in a ledger"
        assert attempt.status in (AttemptStatus.PUBLISHED, AttemptStatus.UNKNOWN), (
            f"{where}: {r.attempt_id} is at the destination but recorded {attempt.status}"
        )
        counts["records"] += 1
    for mid in wanted:
        recs = a.by_message.get(mid, [])
        assert recs, f"{where}: {mid} never reached the destination"
        per_generation: dict[int, int] = defaultdict(int)
        for r in recs:
            attempt = a.attempt(r.attempt_id)
            assert attempt is not None
            per_generation[attempt.generation] += 1
        for generation, n in per_generation.items():
            if n > 1:
                counts["duplicates"] += n - 1
                assert (mid, generation) in a.unknown_generations, (
                    f"{where}: {mid}.{generation} published {n} times without an UNKNOWN"
                )
    return dict(counts)


def check_stores_are_prefixes(a: Audit, data_dirs: list[Path], *, where: str) -> int:
    """Every local shard store any process kept is the fold of a prefix of the Kafka log:
    same digest as replaying that many entries. Returns how many stores were checked."""
    config = KernelConfig()
    checked = 0
    for data in data_dirs:
        for p in a.logs:
            path = data / f"shard-{p}"
            if not path.exists():
                continue
            with ShardStore.open(str(path), create=False) as store:
                position = store.meta.position
                with store.state_view() as state:
                    digest = state_digest(state)
                if store.source is None:  # opened, nothing folded yet
                    assert position == 0, where
                elif position:
                    last_folded = a.logs[p][position - 1].offset
                    assert last_folded <= store.source.last_offset, where
            logged = a.logs[p][:position]
            _, result = replay([x.entry for x in logged], config)
            assert result.digest == digest, f"{where}: {path} differs from the Kafka log"
            checked += 1
    return checked


def writes_after_takeover(
    a: Audit, shards: set[int], old: set[str], new: set[str]
) -> list[LoggedEntry]:
    """Records a tenure in `old` wrote into one of `shards` after the first record a tenure
    in `new` wrote there (a deposed owner writing past its successor). Every shard must have
    a record of a `new` tenure."""
    late: list[LoggedEntry] = []
    for p in sorted(shards):
        logged = a.logs[p]
        first_new = next(
            (i for i, x in enumerate(logged) if _tenure(x) in new),
            None,
        )
        assert first_new is not None, f"no new tenure ever wrote to shard {p}"
        late.extend(x for x in logged[first_new:] if _tenure(x) in old)
    return late


def _tenure(x: LoggedEntry) -> str:
    return x.envelope.request_id.partition(":")[0]


def schedules_in_log(a: Audit) -> int:
    return sum(
        1 for logged in a.logs.values() for x in logged if isinstance(x.entry.record, Schedule)
    )


@dataclass
class RecoveryFigures:
    in_flight: int  # attempts the killed owner admitted that another tenure settled
    found: int
    absent: int  # proven absent (NOT_PUBLISHED with a proof)
    unknown: int
    first_new_delivery_s: float  # from `since` to the first record a new tenure published
    all_settled_s: float  # from `since` to the last outcome of a handed-over attempt

    def line(self, what: str) -> str:
        return (
            f"{what}: {self.in_flight} attempts in flight at the kill; settled "
            f"{self.found} found, {self.absent} proven absent, {self.unknown} UNKNOWN; first "
            f"new delivery {self.first_new_delivery_s:.2f} s, all settled "
            f"{self.all_settled_s:.2f} s after the restart"
        )


def recovery_figures(a: Audit, killed: set[str], since_ms: int) -> RecoveryFigures:
    """What the audit says about the attempts the killed tenures left open."""
    handed = [
        att
        for att, tenure in a.admitted_by.items()
        if tenure in killed and a.resolved_by.get(att) not in killed
    ]
    found = absent = unknown = 0
    last_ms = since_ms
    for logged in a.logs.values():
        for x in logged:
            if x.envelope.request_id.partition(":")[0] in killed:
                continue
            for record in members(x.entry.record):
                if not isinstance(record, PublishOutcome) or record.attempt_id not in handed:
                    continue
                last_ms = max(last_ms, x.entry.persisted_at_ms)
                if isinstance(record.result, Unknown):
                    unknown += 1
                elif isinstance(record.result, NotPublished):
                    assert record.result.proof is not None, record
                    absent += 1
                else:
                    found += 1
    new = [
        r.timestamp_ms
        for r in a.records
        if a.admitted_by.get(r.attempt_id) not in killed and r.timestamp_ms >= since_ms
    ]
    first_ms = min(new) if new else since_ms
    return RecoveryFigures(
        len(handed),
        found,
        absent,
        unknown,
        (first_ms - since_ms) / 1000,
        (last_ms - since_ms) / 1000,
    )
