"""The fire path to Pulsar: timers published per second, and lag by capability.

Needs a broker (`./scripts/pulsar start`; NEREUS_PULSAR_URL / NEREUS_PULSAR_ADMIN_URL or
--url / --admin-url). One embedded shard (LMDB log) with the Pulsar destination, on fresh
topics of the broker. Measurements:

1. throughput: N timers with one absolute deliverAt T0 are scheduled ahead of time; from T0
   the shard fires them all (claim, Admission durable in LMDB, send, outcome).
   Rate = N / (last publish timestamp - T0). Beside it, in the same run, the raw rate: one
   pulsar-client producer with the same settings writing the same payloads and properties
   to another fresh topic, send_async + flush;
   The schedules are committed before the runtime starts, as in `bench.kafka_fire`, so the
   fire is measured alone;
2. lag by capability: timers scheduled at a steady rate R for D seconds, 200 ms ahead, on a
   Shared subscription: ordinary managed delivery, and the certified delayed handoff (lead
   2 s, bound 20 ms). `visible` = the consumer's receive time - deliverAt; `sent` = the
   record's publish time - deliverAt (negative: handed off ahead, the send is off the
   critical path). A handoff's visible lag is the broker's doing: its push-out includes the
   non-strict tick, and the broker's delayed-delivery timer runs at the broker's tick
   (`delayedDeliveryTickTimeMillis`, 1 s from `scripts/pulsar`; a topic policy's smaller
   tick narrows the early reveal but not the timer), so the result records the broker's
   tick and strictness;
3. early deliveries, by the consumer's clock (must be 0).

    .venv/bin/python -m bench.pulsar_fire [--timers 20000] [--rate 500] [--seconds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from typing import Any

import pulsar

from bench.common import say
from nereus import Nereus
from nereus.adapters.pulsar.admin import PulsarAdmin
from nereus.adapters.pulsar.config import PulsarTargetConfig
from nereus.adapters.pulsar.destination import PulsarDestination
from nereus.runtime.destination import H_ATTEMPT_ID, H_DELIVER_AT, H_GENERATION, H_MESSAGE_ID, H_TXN
from nereus.service.arguments import schedule_record

PAYLOAD = b'{"kind":"bench","pad":"' + b"x" * 64 + b'"}'
LEAD_MS, BOUND_MS = 2_000, 20


def _now_ms() -> int:
    return int(time.time() * 1000)


def _topic(prefix: str) -> str:
    return f"persistent://public/default/{prefix}-{os.urandom(5).hex()}"


def _quiet() -> Any:
    import logging  # noqa: PLC0415

    log = logging.getLogger("bench.pulsar")
    log.setLevel(logging.ERROR)
    return log


def _publish_times(client: Any, topic: str, want: int, timeout_s: float) -> list[int]:
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    out: list[int] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < want and time.monotonic() < deadline:
            try:
                out.append(reader.read_next(500).publish_timestamp())
            except pulsar.Timeout:
                continue
    finally:
        reader.close()
    return out


def raw_produce(client: Any, timers: int) -> float:
    producer = client.create_producer(
        _topic("raw"), batching_enabled=True, batching_max_publish_delay_ms=1,
        max_pending_messages=10_000, block_if_queue_full=True,
    )  # fmt: skip
    props = {H_MESSAGE_ID: "m" * 32, H_GENERATION: "1", H_TXN: "t", H_DELIVER_AT: "0"}
    started = time.monotonic()
    for i in range(timers):
        producer.send_async(
            PAYLOAD, lambda _r, _m: None, properties={**props, H_ATTEMPT_ID: str(i)}
        )
    producer.flush()
    elapsed = time.monotonic() - started
    producer.close()
    return timers / elapsed


def _open(
    url: str, admin: str, topic: str, data: str, start: bool = True, **options: Any
) -> Nereus:
    target = PulsarTargetConfig(service_url=url, admin_url=admin, topics={"q": topic}, **options)
    n = Nereus.open(data, destination=PulsarDestination(target), assume_clock_error_ms=5)
    if start:
        n.start()
    return n


def throughput(url: str, admin: str, client: Any, timers: int) -> dict[str, Any]:
    topic = _topic("fire")
    with tempfile.TemporaryDirectory() as data:
        n = _open(url, admin, topic, data, start=False)
        try:
            t0 = _now_ms() + 3_000 + timers // 10
            for start in range(0, timers, 2_000):
                items = [
                    schedule_record("q", f"k{i}", PAYLOAD, deliver_at_ms=t0, txn=f"t{i}")
                    for i in range(start, min(start + 2_000, timers))
                ]
                n.store.commit(n.pin(items), _now_ms())
            if _now_ms() >= t0:
                raise RuntimeError("intake took longer than the lead: raise the lead")
            n.start()
            stamps = _publish_times(client, topic, timers, 60 + timers / 500)
        finally:
            n.close()
    last = max(stamps) if stamps else t0
    return {
        "timers": timers,
        "published": len(stamps),
        "fired_per_s": round(len(stamps) / max((last - t0) / 1000, 1e-3)),
        "early": sum(1 for s in stamps if s < t0),
    }


def lag(
    url: str, admin: str, client: Any, *, handoff: bool, rate: int, seconds: float
) -> dict[str, Any]:
    topic = _topic("lag-handoff" if handoff else "lag")
    consumer = client.subscribe(topic, "bench", consumer_type=pulsar.ConsumerType.Shared)
    options: dict[str, Any] = {"clock_ahead_bound_ms": BOUND_MS}
    if handoff:
        options.update(delivery="handoff", handoff_lead_ms=LEAD_MS)
    count = int(rate * seconds)
    visible: list[int] = []
    sent: list[int] = []
    stop = threading.Event()

    def consume() -> None:
        while not stop.is_set() and len(visible) < count:
            try:
                msg = consumer.receive(200)
            except pulsar.Timeout:
                continue
            deliver = int(msg.properties()[H_DELIVER_AT])
            visible.append(_now_ms() - deliver)
            sent.append(msg.publish_timestamp() - deliver)
            consumer.acknowledge(msg)

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    ahead_ms = 200 + (LEAD_MS if handoff else 0)
    with tempfile.TemporaryDirectory() as data:
        n = _open(url, admin, topic, data, **options)
        try:
            started = time.monotonic()
            for i in range(count):
                wait = started + i / rate - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                n.schedule("q", f"k{i}", PAYLOAD, delay_ms=ahead_ms, txn=f"t{i}")
            reader.join(30 + seconds)
        finally:
            stop.set()
            n.close()
            consumer.close()
    return {
        "capability": "delayed_handoff" if handoff else "immediate",
        "rate_per_s": rate,
        "scheduled": count,
        "received": len(visible),
        "visible_ms_p50": _pct(visible, 0.5),
        "visible_ms_p99": _pct(visible, 0.99),
        "sent_ms_p50": _pct(sent, 0.5),
        "sent_ms_p99": _pct(sent, 0.99),
        "early": sum(1 for v in visible if v < 0),
    }


def _delay_settings(admin: str) -> dict[str, Any]:
    broker = PulsarAdmin(admin).broker()
    return {
        "tick_ms": broker.number("delayedDeliveryTickTimeMillis", 1000),
        "strict": broker.flag("isDelayedDeliveryDeliverAtTimeStrict", False),
    }


def _pct(values: list[int], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return float(ordered[min(int(q * len(ordered)), len(ordered) - 1)])


def run(url: str, admin: str, timers: int, rate: int, seconds: float) -> dict[str, Any]:
    client = pulsar.Client(url, logger=_quiet())
    try:
        raw = raw_produce(client, timers)
        say(f"pulsar_fire: raw produce {raw:,.0f}/s")
        tp = throughput(url, admin, client, timers)
        tp["raw_produce_per_s"] = round(raw)
        say(f"pulsar_fire: fired {tp['fired_per_s']:,}/s of {timers:,}")
        out: dict[str, Any] = {"throughput": tp, "broker": _delay_settings(admin)}
        for name, handoff in (("lag_ordinary", False), ("lag_handoff", True)):
            out[name] = lag(url, admin, client, handoff=handoff, rate=rate, seconds=seconds)
            say(f"pulsar_fire: {name} {out[name]}")
    finally:
        client.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--url", default=os.environ.get("NEREUS_PULSAR_URL", "pulsar://127.0.0.1:16650")
    )
    parser.add_argument(
        "--admin-url", default=os.environ.get("NEREUS_PULSAR_ADMIN_URL", "http://127.0.0.1:18080")
    )
    parser.add_argument("--timers", type=int, default=20_000)
    parser.add_argument("--rate", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    print(json.dumps(run(args.url, args.admin_url, args.timers, args.rate, args.seconds), indent=2))


if __name__ == "__main__":
    main()
