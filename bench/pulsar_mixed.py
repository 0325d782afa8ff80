"""Delayed and immediate sends on one Pulsar topic: what each way of keeping them apart costs.

Why: pulsar-client (3.13) never batches a message that has a `deliver_at`; it sends it at
once, ahead of the batch still open on the same producer, although that batch holds
messages with lower sequence ids. A deduplicating broker then takes the batch for a
duplicate and drops it whole, answering `Ok` with ledger and entry -1 for each of its
messages. Three ways of sending a mix, each measured here with the raw client on a fresh
topic per run, doing what `PulsarDestination`'s sender thread does (one `send_async` after
another, the answers collected by callbacks):

* `one_producer`: the mix through one batching producer (Nereus before the fix: counts the
  messages the broker dropped);
* `flush_first`: one batching producer, `flush()` (it blocks until the broker has answered
  every pending message) before a delayed send whenever a batched send came since the
  last flush;
* `two_producers`: a batching producer for immediate sends and a producer without batching
  for delayed ones, each with its own name and so its own sequence ids;
* `destination`: the same sends through `PulsarDestination` itself (what Nereus does now),
  handed over as one tick's `submit`; the answers are its outcomes (`vanished` counts
  UNKNOWN ones), and it has no per-send latency or hand-over figure.

Not measured: the client's non-blocking flush (`flush_async`, only on the binding under the
public `Producer`) deadlocks within seconds here: it waits for the producer's mutex holding
the GIL while the client's I/O thread holds that mutex and waits for the GIL to run a send
callback (seen with gdb, pulsar-client 3.13).

Workloads: every 2nd send delayed (the worst case for a flush), 1 in 10, 1 in 100, none.
Figures per cell (the median of `--repeats` runs): `handover_ms` (how long the sender
thread was busy handing the sends to the client: a flush blocks it, and with it every
other topic's sends), `done_ms` (first send to last answer), `per_s`, the answer latency
of immediate sends (p50, p99), `vanished` (answers `Ok` without a position) and `missing`
(sends a reader does not find in the topic).

    .venv/bin/python -m bench.pulsar_mixed [--sends 3000] [--repeats 3] [--window-ms 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import pulsar

from bench.common import PAYLOAD, say
from nereus.adapters.pulsar.config import PulsarTargetConfig
from nereus.adapters.pulsar.destination import PulsarDestination
from nereus.kernel.records import IMMEDIATE, Capability, Published, Unknown
from nereus.runtime.destination import H_MESSAGE_ID, PreparedPublish, Send

STRATEGIES = ("one_producer", "flush_first", "two_producers", "destination")
WORKLOADS = {"every_2nd": 2, "1_in_10": 10, "1_in_100": 100, "none": 0}
HELD_MS = 60_000  # delayed sends are held this long: a reader still sees them


def _quiet() -> Any:
    import logging  # noqa: PLC0415

    log = logging.getLogger("bench.pulsar_mixed")
    log.setLevel(logging.ERROR)
    return log


class _Answers:
    def __init__(self, total: int) -> None:
        self.total = total
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.latency_ms: dict[int, float] = {}
        self.vanished = 0
        self.failed = 0
        self.last_s = 0.0

    def callback(self, i: int, sent_s: float) -> Callable[[Any, Any], None]:
        def on_answer(result: Any, msg_id: Any) -> None:
            now = time.monotonic()
            with self.lock:
                if result != pulsar.Result.Ok:
                    self.failed += 1
                elif msg_id.ledger_id() < 0 or msg_id.entry_id() < 0:
                    self.vanished += 1
                self.latency_ms[i] = (now - sent_s) * 1000
                self.last_s = max(self.last_s, now)
                if len(self.latency_ms) == self.total:
                    self.done.set()

        return on_answer


def _producer(client: Any, topic: str, name: str, window_ms: int, batching: bool) -> Any:
    return client.create_producer(
        topic,
        producer_name=name,
        batching_enabled=batching,
        batching_max_publish_delay_ms=window_ms,
        max_pending_messages=10_000,
        block_if_queue_full=True,
    )


def one_run(
    client: Any, url: str, strategy: str, *, every: int, sends: int, window_ms: int
) -> dict[str, Any]:
    topic = f"persistent://public/default/mixed-{os.urandom(5).hex()}"
    if strategy == "destination":
        return _destination_run(client, url, topic, every=every, sends=sends, window_ms=window_ms)
    name = f"bench-mixed-{os.urandom(4).hex()}"
    immediate = _producer(client, topic, name, window_ms, batching=True)
    delayed = immediate
    if strategy == "two_producers":
        delayed = _producer(client, topic, name + ".handoff", window_ms, batching=False)
    answers = _Answers(sends)
    flushes = 0
    batched_since_flush = False
    reveal_ms = int(time.time() * 1000) + HELD_MS
    started = time.monotonic()
    for i in range(sends):
        is_delayed = every > 0 and i % every == every - 1
        props = {"nereus-attempt-id": str(i), "nereus-message-id": "m" * 32}
        if is_delayed and strategy == "flush_first" and batched_since_flush:
            immediate.flush()
            flushes += 1
            batched_since_flush = False
        producer = delayed if is_delayed else immediate
        producer.send_async(
            PAYLOAD,
            answers.callback(i, time.monotonic()),
            properties=props,
            deliver_at=reveal_ms if is_delayed else None,
        )
        batched_since_flush = batched_since_flush or not is_delayed
    handover_s = time.monotonic() - started
    answers.done.wait(60)
    done_s = answers.last_s - started
    found = _count(client, topic)
    for p in {id(immediate): immediate, id(delayed): delayed}.values():
        p.close()
    immediate_ms = [
        ms for i, ms in answers.latency_ms.items() if not (every > 0 and i % every == every - 1)
    ]
    return {
        "handover_ms": round(handover_s * 1000, 1),
        "done_ms": round(done_s * 1000, 1),
        "per_s": round(sends / max(done_s, 1e-6)),
        "immediate_p50_ms": _pct(immediate_ms, 0.5),
        "immediate_p99_ms": _pct(immediate_ms, 0.99),
        "flushes": flushes,
        "vanished": answers.vanished,
        "failed": answers.failed,
        "missing": sends - found,
    }


def _destination_run(
    client: Any, url: str, topic: str, *, every: int, sends: int, window_ms: int
) -> dict[str, Any]:
    config = PulsarTargetConfig(service_url=url, batching_max_publish_delay_ms=window_ms)
    dest = PulsarDestination(config)
    dest.open(f"bench-{os.urandom(4).hex()}")
    deliver_at = int(time.time() * 1000) + HELD_MS
    handoff = Capability("delayed_handoff", 0, 0)
    batch = [
        Send(
            str(i),
            PreparedPublish(
                destination="pulsar",
                topic=topic,
                key=None,
                value=PAYLOAD,
                headers=((H_MESSAGE_ID, b"m" * 32),),
                message_id=f"m{i}",
                generation=1,
                txn="t",
                deliver_at_ms=deliver_at,
                producer_sub=None,
                encrypted=False,
                capability=handoff if every > 0 and i % every == every - 1 else IMMEDIATE,
            ),
        )
        for i in range(sends)
    ]
    answers: list[Any] = []
    try:
        # The topic's ordinary producer is made before the clock starts, as in the others.
        dest.submit([_warm_up(topic)], int(time.time() * 1000))
        while not dest.poll(0):
            time.sleep(0.005)
        started = time.monotonic()
        dest.submit(batch, int(time.time() * 1000))
        deadline = started + 60
        while len(answers) < sends and time.monotonic() < deadline:
            answers.extend(dest.poll(0))
            time.sleep(0.001)
        done_s = time.monotonic() - started
    finally:
        dest.close()
    return {
        "handover_ms": None,
        "done_ms": round(done_s * 1000, 1),
        "per_s": round(sends / max(done_s, 1e-6)),
        "immediate_p50_ms": None,
        "immediate_p99_ms": None,
        "flushes": 0,
        "vanished": sum(1 for a in answers if isinstance(a.result, Unknown)),
        "failed": sum(1 for a in answers if not isinstance(a.result, Published | Unknown)),
        "missing": sends - _count(client, topic) + 1,  # less the warm-up record
    }


def _warm_up(topic: str) -> Send:
    prepared = PreparedPublish(
        "pulsar", topic, None, b"w", ((H_MESSAGE_ID, b"w"),), "w", 1, "t", 0, None, False
    )
    return Send("warm-up", prepared)


def _count(client: Any, topic: str) -> int:
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    seen: set[str] = set()
    try:
        while reader.has_message_available():
            seen.add(reader.read_next(5000).properties().get("nereus-attempt-id", ""))
    finally:
        reader.close()
    return len(seen)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(int(q * len(ordered)), len(ordered) - 1)], 2)


def _median_cell(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in runs[0]:
        values = [r[key] for r in runs if r[key] is not None]
        if key in ("vanished", "failed", "missing"):
            out[key] = max(values)  # any run losing anything counts
        else:
            out[key] = round(statistics.median(values), 2) if values else None
    return out


def run(url: str, sends: int, repeats: int, window_ms: int) -> dict[str, Any]:
    client = pulsar.Client(url, logger=_quiet())
    out: dict[str, Any] = {"sends": sends, "repeats": repeats, "window_ms": window_ms}
    try:
        for workload, every in WORKLOADS.items():
            runs: dict[str, list[dict[str, Any]]] = {s: [] for s in STRATEGIES}
            # Round robin over the strategies, so that a machine shared with other work
            # slows each of them alike.
            for _ in range(repeats):
                for strategy in STRATEGIES:
                    run_ = one_run(
                        client, url, strategy, every=every, sends=sends, window_ms=window_ms
                    )
                    runs[strategy].append(run_)
            for strategy in STRATEGIES:
                cell = _median_cell(runs[strategy])
                out[f"{workload}/{strategy}"] = cell
                say(f"pulsar_mixed: {workload:>9} {strategy:>13} {cell}")
    finally:
        client.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--url", default=os.environ.get("NEREUS_PULSAR_URL", "pulsar://127.0.0.1:16650")
    )
    parser.add_argument("--sends", type=int, default=3_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window-ms", type=int, default=1)
    args = parser.parse_args()
    print(json.dumps(run(args.url, args.sends, args.repeats, args.window_ms), indent=2))


if __name__ == "__main__":
    main()
