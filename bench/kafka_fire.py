"""The fire path in Kafka mode: timers published per second to Kafka, and fire lag.

Needs a broker (`./scripts/kafka start`; NEREUS_KAFKA_BOOTSTRAP or --bootstrap). One
`KafkaService` in this process owns every shard of a fresh commands topic; the destination is
a fresh LogAppendTime topic on the same broker. Three measurements:

1. throughput: N timers with one absolute deliverAt T0 are scheduled through Kafka ahead of
   time (on one shard, then again on `--shards` shards); from T0 the service fires them all
   (claim, Admission transaction, read back and fold, send, outcome transaction).
   Rate = N / (last broker timestamp - T0). Beside it, in the same run, the raw rate: one
   idempotent confluent-kafka producer (acks=all) writing the same payloads and Nereus
   headers to another fresh topic of the same broker, produce + flush. And the library's
   shape: one shard with the embedded LMDB log and `KafkaDestination` (the Admission
   durable in LMDB before each produce) firing the same number of timers;
2. lateness: a thread schedules timers due `--ahead-ms` later (default 2 s) at a steady rate
   R for D seconds while a `read_committed` consumer reads the destination: fire lag = the
   record's broker timestamp - deliverAt, visible lag = when the consumer got it -
   deliverAt (after the send's transaction committed), p50/p99/max;
3. early deliveries (must be 0).

    .venv/bin/python -m bench.kafka_fire [--timers 20000] [--shards 4] [--rate 200] [--seconds 5]
        [--ahead-ms 2000]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import threading
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from bench.common import say, write_json
from nereus.adapters.clock import SystemClock
from nereus.adapters.kafka.destination import KafkaDestination, KafkaDestinationConfig
from nereus.adapters.kafka.service import KafkaService, KafkaServiceConfig
from nereus.runtime.destination import H_ATTEMPT_ID, H_DELIVER_AT, H_GENERATION, H_MESSAGE_ID, H_TXN
from nereus.runtime.shard import ShardRuntime
from nereus.service.arguments import schedule_record
from nereus.storage.store import ShardStore

PAYLOAD = b'{"kind":"bench","pad":"' + b"x" * 64 + b'"}'
DEST_PARTITIONS = 2


def _topic(bootstrap: str, prefix: str, partitions: int) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(name, partitions, 1, config={"message.timestamp.type": "LogAppendTime"})
    admin.create_topics([topic])[name].result(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        meta = admin.list_topics(name, timeout=5).topics.get(name)
        if meta and meta.error is None and all(p.leader >= 0 for p in meta.partitions.values()):
            return name
        time.sleep(0.05)
    raise TimeoutError(name)


def _destination_reader(bootstrap: str, topic: str, **settings: Any) -> Any:
    """A `read_committed` consumer of every partition of the destination, from the start."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            **settings,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(DEST_PARTITIONS)])
    return consumer


def _read(bootstrap: str, topic: str, want: int, timeout_s: float) -> list[tuple[int, int]]:
    """(broker timestamp, deliverAt) of every record, once `want` are there."""
    consumer = _destination_reader(bootstrap, topic)
    out: list[tuple[int, int]] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < want and time.monotonic() < deadline:
        for m in consumer.consume(1000, 0.2):
            err = m.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    raise RuntimeError(str(err))
                continue
            headers: dict[str, Any] = dict(m.headers() or ())
            out.append((m.timestamp()[1], int(headers[H_DELIVER_AT])))
    consumer.close()
    return out


def _pct(values: list[int], q: float) -> int:
    return values[min(len(values) - 1, int(len(values) * q))] if values else 0


def _service(bootstrap: str, root: str, shards: int, dest: str) -> KafkaService:
    tag = uuid.uuid4().hex[:10]
    service = KafkaService(
        KafkaServiceConfig(
            bootstrap=bootstrap,
            data_dir=os.path.join(root, f"data-{tag}"),
            commands_topic=f"bench-cmd-{tag}",
            replies_topic=f"bench-rep-{tag}",
            group=f"bench-{tag}",
            shards=shards,
            destination_topics={"q": dest},
        ),
        clock=SystemClock(assumed_error_ms=1.0),
    )
    service.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        states = service.shard_states()
        if len(states) == shards and set(states.values()) == {"active"}:
            return service
        time.sleep(0.05)
    raise TimeoutError("shards not active")


def throughput(bootstrap: str, root: str, timers: int, shards: int) -> dict[str, Any]:
    dest = _topic(bootstrap, "bench-dest", DEST_PARTITIONS)
    service = _service(bootstrap, root, shards, dest)
    try:
        # Every timer is due at T0, far enough ahead for the intake to finish first.
        say(f"kafka_fire: scheduling {timers:,} timers through {shards} shards")
        t_intake = time.perf_counter()
        t0_ms = int(time.time() * 1000) + max(4000, timers // 2)
        batch = 500
        for start in range(0, timers, batch):
            items = [
                schedule_record("q", f"t{i}", PAYLOAD, deliver_at_ms=t0_ms, txn="tx")
                for i in range(start, min(start + batch, timers))
            ]
            service.execute(items, 60)
        intake_s = time.perf_counter() - t_intake
        if int(time.time() * 1000) >= t0_ms:
            raise RuntimeError("intake took longer than the lead: raise the lead")
        say("kafka_fire: waiting for them to fire")
        records = _read(bootstrap, dest, timers, 600)
    finally:
        service.close()
    last_ms = max(ts for ts, _ in records)
    fire_s = (last_ms - t0_ms) / 1000
    early = sum(1 for ts, deliver_at in records if ts < deliver_at)

    say("kafka_fire: raw produce of the same payloads")
    raw_topic = _topic(bootstrap, "bench-raw", DEST_PARTITIONS)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
        }
    )
    t = time.perf_counter()
    for i in range(timers):
        headers: list[tuple[str, str | bytes | None]] = [
            (H_MESSAGE_ID, uuid.uuid4().hex.encode()),
            (H_GENERATION, b"1"),
            (H_TXN, b"tx"),
            (H_DELIVER_AT, str(t0_ms).encode()),
            (H_ATTEMPT_ID, f"{i}.1.1".encode()),
        ]
        while True:
            try:
                producer.produce(raw_topic, PAYLOAD, key=str(i % 5).encode(), headers=headers)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    producer.flush(120)
    raw_s = time.perf_counter() - t
    return {
        "timers": timers,
        "shards": shards,
        "intake_commands_per_s": round(timers / intake_s),
        "fire_s": round(fire_s, 3),
        "fired_per_s": round(timers / fire_s) if fire_s > 0 else None,
        "records_seen": len(records),
        "raw_produce_per_s": round(timers / raw_s),
        "early": early,
    }


def embedded_throughput(bootstrap: str, root: str, timers: int) -> dict[str, Any]:
    """The library's shape: one shard whose log is the embedded LMDB store, publishing to a
    Kafka topic through `KafkaDestination` (the Admission is durable in LMDB before each
    produce). The runtime's own thread fires N timers due at T0; rate as for Kafka mode."""
    dest = _topic(bootstrap, "bench-emb", DEST_PARTITIONS)
    store = ShardStore.open(os.path.join(root, f"embedded-{uuid.uuid4().hex[:10]}"))
    destination = KafkaDestination(KafkaDestinationConfig(bootstrap=bootstrap, topics={"q": dest}))
    runtime = ShardRuntime(store, destination, SystemClock(assumed_error_ms=1.0))
    try:
        say(f"kafka_fire: embedded log, {timers:,} timers to Kafka")
        t0_ms = int(time.time() * 1000) + 3000
        batch = 2000
        for start in range(0, timers, batch):
            items = [
                schedule_record("q", f"e{i}", PAYLOAD, deliver_at_ms=t0_ms, txn="tx")
                for i in range(start, min(start + batch, timers))
            ]
            store.commit(items, int(time.time() * 1000))
        if int(time.time() * 1000) >= t0_ms:
            raise RuntimeError("intake took longer than the lead: raise the lead")
        runtime.start()
        records = _read(bootstrap, dest, timers, 600)
    finally:
        runtime.stop()
        destination.close()
        store.close()
    last_ms = max(ts for ts, _ in records)
    fire_s = (last_ms - t0_ms) / 1000
    return {
        "timers": timers,
        "fire_s": round(fire_s, 3),
        "fired_per_s": round(timers / fire_s) if fire_s > 0 else None,
        "records_seen": len(records),
        "early": sum(1 for ts, deliver_at in records if ts < deliver_at),
    }


def lateness(
    bootstrap: str, root: str, rate: int, seconds: float, shards: int, *, ahead_ms: int
) -> dict[str, Any]:
    say(f"kafka_fire: steady {rate}/s for {seconds:g} s, each due {ahead_ms} ms ahead")
    dest = _topic(bootstrap, "bench-lag", DEST_PARTITIONS)
    service = _service(bootstrap, root, shards, dest)
    try:
        return steady_lag(service, bootstrap, dest, rate, seconds, ahead_ms=ahead_ms)
    finally:
        service.close()


def steady_lag(
    service: KafkaService,
    bootstrap: str,
    dest: str,
    rate: int,
    seconds: float,
    *,
    prefix: str = "l",
    ahead_ms: int = 200,
) -> dict[str, Any]:
    """Schedule `rate` timers a second due `ahead_ms` later for `seconds` through `service`
    (whose queue "q" publishes to `dest`) while a `read_committed` consumer reads `dest`:
    fire lag = the record's broker timestamp - deliverAt (when it was appended), visible lag
    = when the consumer received it - deliverAt (the append, the transaction's commit and the
    read; what a reader of the destination sees). Timer keys start with `prefix`."""
    sent = 0
    tick_s = 0.05
    per_tick = max(1, int(rate * tick_s))
    errors: list[BaseException] = []
    reader = _Reader(bootstrap, dest)
    reader.start()
    start = time.perf_counter()

    def feed() -> None:
        nonlocal sent
        n = 0
        while time.perf_counter() - start < seconds:
            items = [
                schedule_record("q", f"{prefix}{n + j}", PAYLOAD, delay_ms=ahead_ms, txn="tx")
                for j in range(per_tick)
            ]
            n += per_tick
            try:
                service.execute(items, 60)
            except BaseException as exc:
                errors.append(exc)
                return
            sent += per_tick
            behind = start + (n / per_tick) * tick_s - time.perf_counter()
            if behind > 0:
                time.sleep(behind)

    # Each execute waits for its outcomes, as an HTTP client would.
    feeder = threading.Thread(target=feed)
    feeder.start()
    feeder.join()
    records = reader.stop_after(sent, 120)
    if errors:
        raise errors[0]
    lags = sorted(ts - deliver_at for _received, ts, deliver_at in records)
    visible = sorted(received - deliver_at for received, _ts, deliver_at in records)
    return {
        "rate_per_s": rate,
        "seconds": seconds,
        "ahead_ms": ahead_ms,
        "scheduled": sent,
        "published": len(records),
        "lag_ms_p50": _pct(lags, 0.50),
        "lag_ms_p99": _pct(lags, 0.99),
        "lag_ms_max": lags[-1] if lags else None,
        "visible_lag_ms_p50": _pct(visible, 0.50),
        "visible_lag_ms_p99": _pct(visible, 0.99),
        "visible_lag_ms_max": visible[-1] if visible else None,
        "early": sum(1 for lag in lags if lag < 0),
    }


class _Reader:
    """A `read_committed` consumer of the destination in a process of its own (a reader in
    the service's process would wait for its interpreter lock and add that to the lag),
    noting when each record reached it (wall clock, ms) beside its broker timestamp and
    deliverAt."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_read_process, args=(bootstrap, topic, child))

    def start(self) -> None:
        self.process.start()
        if not self.conn.poll(60) or self.conn.recv() != "ready":
            raise TimeoutError("the destination reader did not reach the end of the topic")

    def stop_after(self, want: int, timeout_s: float) -> list[tuple[int, int, int]]:
        """The records, once `want` have arrived (or after `timeout_s`)."""
        self.conn.send((want, timeout_s))
        records: list[tuple[int, int, int]] = []
        if self.conn.poll(timeout_s + 30):
            answer = self.conn.recv()
            if isinstance(answer, str):
                raise RuntimeError(answer)
            records = answer
        self.process.join(10)
        return records


def _read_process(bootstrap: str, topic: str, conn: Any) -> None:
    consumer = _destination_reader(bootstrap, topic, **{"fetch.wait.max.ms": 10})
    records: list[tuple[int, int, int]] = []
    ready = False
    want: int | None = None
    deadline = float("inf")
    try:
        while (want is None or len(records) < want) and time.monotonic() < deadline:
            if want is None and conn.poll():
                want, timeout_s = conn.recv()
                deadline = time.monotonic() + timeout_s
            # poll, then take what else is there: consume(n, timeout) would wait the whole
            # timeout for n records, and that wait would count as lag.
            first = consumer.poll(0.05)
            if first is None:
                continue
            received_ms = int(time.time() * 1000)
            for m in [first, *consumer.consume(1000, 0)]:
                err = m.error()
                if err is not None:
                    if err.code() != KafkaError._PARTITION_EOF:
                        raise RuntimeError(str(err))
                    if not ready:
                        ready = True
                        conn.send("ready")
                    continue
                headers: dict[str, Any] = dict(m.headers() or ())
                records.append((received_ms, m.timestamp()[1], int(headers[H_DELIVER_AT])))
        conn.send(records)
    except BaseException as exc:
        conn.send(f"destination reader: {exc!r}")
    finally:
        consumer.close()


def run(
    bootstrap: str, timers: int, shards: int, rate: int, seconds: float, *, ahead_ms: int = 2000
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(
        prefix="nereus-bench-", dir=os.environ.get("NEREUS_BENCH_DIR")
    ) as root:
        # One shard per process is the fast shape on two cores: each shard pays a Kafka
        # transaction, a read-back and an LMDB sync per tick, and the shard threads of one
        # process share one interpreter lock. `shards` (more per process) is measured too.
        return {
            "bootstrap": bootstrap,
            "throughput": throughput(bootstrap, root, timers, 1),
            "throughput_shards": throughput(bootstrap, root, timers, shards),
            "embedded": embedded_throughput(bootstrap, root, timers),
            "lateness": lateness(bootstrap, root, rate, seconds, shards, ahead_ms=ahead_ms),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("NEREUS_KAFKA_BOOTSTRAP", ""))
    parser.add_argument("--timers", type=int, default=20_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--rate", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--ahead-ms", type=int, default=2000, help="steady timers' delay")
    parser.add_argument("--out", "--json", dest="out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    if not args.bootstrap:
        print("no broker: ./scripts/kafka start, then --bootstrap or NEREUS_KAFKA_BOOTSTRAP")
        return 2
    result = run(
        args.bootstrap, args.timers, args.shards, args.rate, args.seconds, ahead_ms=args.ahead_ms
    )
    print(json.dumps(result, indent=2))
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
