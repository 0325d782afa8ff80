"""`nereus serve` and `nereus tail`: run the service, and read what it delivered.

`nereus serve --data DIR` runs the embedded default (one shard, LMDB log, local
destination). `nereus serve --kafka BOOTSTRAP --data DIR` runs Kafka mode
(`adapters.kafka_service`): the shards are the partitions of the commands topic, shared by
every process in the group, and timers are published to Kafka topics (`--topic QUEUE=TOPIC`;
a queue not listed publishes to the topic of its own name).
"""

from __future__ import annotations

import argparse
import base64
import ipaddress
import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
from typing import Any

from confluent_kafka import KafkaException

from adapters.clock import SystemClock
from adapters.embedded import Nereus
from adapters.http_api import HttpServer, TimerApi
from adapters.kafka_service import KafkaService, KafkaServiceConfig
from adapters.local_destination import LocalDestination, LocalRecord
from runtime.config import RuntimeConfig
from runtime.log import Logger
from storage.errors import StoreError


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("serve", help="run one shard with the HTTP API")
    p.add_argument("--data", required=True, help="data directory (shard store + local topics)")
    p.add_argument("--http", default="127.0.0.1:6632", metavar="HOST:PORT")
    p.add_argument(
        "--assume-clock-error-ms",
        type=float,
        default=None,
        help="error bound to assume when the host clock reports no synchronisation "
        "(without it, an unsynchronised host fires nothing)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    k = p.add_argument_group("Kafka mode")
    k.add_argument("--kafka", metavar="BOOTSTRAP", help="run the Kafka-partitioned shard log")
    k.add_argument(
        "--shards", type=int, default=None, help="partitions of the commands topic if created"
    )
    k.add_argument("--commands-topic", default="nereus.commands")
    k.add_argument("--replies-topic", default="nereus.replies")
    k.add_argument("--group", default="nereus-shards", help="consumer group of the owners")
    k.add_argument(
        "--topic",
        action="append",
        default=[],
        metavar="QUEUE=TOPIC",
        help="destination topic of a queue (repeatable)",
    )
    k.add_argument("--session-timeout-ms", type=int, default=6_000)
    k.add_argument(
        "--destination-linger-ms",
        type=int,
        default=5,
        help="how long the destination producer batches records before sending",
    )
    p.set_defaults(handler=serve)

    t: argparse.ArgumentParser = sub.add_parser("tail", help="print delivered records of a queue")
    t.add_argument("queue")
    t.add_argument("--data", required=True, help="data directory of `nereus serve`")
    t.add_argument("--from", dest="from_offset", type=int, default=0, metavar="OFFSET")
    t.add_argument("--follow", action="store_true", help="keep printing new records")
    t.add_argument("--limit", type=int, default=None, help="stop after this many records")
    t.set_defaults(handler=tail)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _listen_address(args: argparse.Namespace, log: Logger) -> tuple[str, int] | None:
    host, _, port_text = args.http.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not _is_loopback(host):
        log.error(
            "refused",
            detail="without a tenant configuration the service has no authentication and "
            "binds loopback only",
            http=args.http,
        )
        return None
    return host, int(port_text)


def serve(args: argparse.Namespace) -> int:
    log = Logger(level=args.log_level)
    address = _listen_address(args, log)
    if address is None:
        return 2
    host, port = address
    if args.kafka:
        return serve_kafka(args, log, host, port)
    try:
        nereus = Nereus.open(
            args.data,
            assume_clock_error_ms=args.assume_clock_error_ms,
            runtime_config=RuntimeConfig(owner=f"{socket.gethostname()}:{os.getpid()}"),
            logger=log,
        )
    except StoreError as exc:
        log.error("refused", detail=str(exc))
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server = HttpServer(TimerApi(nereus), host, port)
    except OSError as exc:
        log.error("refused", detail=f"cannot listen on {args.http}: {exc}")
        nereus.close()
        return 2
    nereus.start()
    server.start()
    log.warning(
        "no_authentication",
        detail="no tenant configuration: one default tenant, no credentials, loopback only",
    )
    log.info(
        "serving",
        url=f"http://{host}:{server.port}",
        data=os.path.abspath(args.data),
        applied_position=nereus.store.meta.position,
    )
    try:
        while not stop.wait(0.5):
            if nereus.runtime.halted is not None:
                log.error("halted", error=repr(nereus.runtime.halted))
                return 1
    finally:
        server.stop()
        nereus.close()
        log.info("stopped")
    return 0


def serve_kafka(args: argparse.Namespace, log: Logger, host: str, port: int) -> int:
    topics: dict[str, str] = {}
    for spec in args.topic:
        queue, sep, topic = spec.partition("=")
        if not sep or not queue or not topic:
            log.error("refused", detail=f"--topic wants QUEUE=TOPIC, not {spec!r}")
            return 2
        topics[queue] = topic
    config = KafkaServiceConfig(
        bootstrap=args.kafka,
        data_dir=args.data,
        commands_topic=args.commands_topic,
        replies_topic=args.replies_topic,
        group=args.group,
        shards=args.shards,
        destination_topics=topics,
        session_timeout_ms=args.session_timeout_ms,
        destination_linger_ms=args.destination_linger_ms,
        process_id=f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}",
    )
    clock = SystemClock(assumed_error_ms=args.assume_clock_error_ms)
    status = clock.describe()
    if status.error_bound_ms is None:
        log.warning(
            "clock_unbounded",
            detail="the host clock reports no synchronisation: nothing will be admitted or "
            "expired until it does, or until --assume-clock-error-ms is given",
        )
    elif status.assumed:
        log.warning("clock_error_assumed", error_bound_ms=status.error_bound_ms)
    service = KafkaService(config, clock=clock, logger=log)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        service.start()
    except (KafkaException, ValueError, TimeoutError, OSError) as exc:
        log.error("refused", detail=f"Kafka mode cannot start: {exc}")
        service.close()
        return 2
    try:
        server = HttpServer(TimerApi(service), host, port)
    except OSError as exc:
        log.error("refused", detail=f"cannot listen on {args.http}: {exc}")
        service.close()
        return 2
    server.start()
    log.warning(
        "no_authentication",
        detail="no tenant configuration: one default tenant, no credentials, loopback only",
    )
    log.info(
        "serving",
        url=f"http://{host}:{server.port}",
        data=os.path.abspath(args.data),
        mode="kafka",
        process=config.process_id,
        commands_topic=config.commands_topic,
        shards=service.shards,
    )
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
        service.close()
        log.info("stopped")
    return 0


def record_json(r: LocalRecord) -> dict[str, Any]:
    return {
        "queue": r.queue,
        "offset": r.offset,
        "partition": r.partition,
        "messageId": r.message_id,
        "attemptId": r.attempt_id,
        "txn": r.txn,
        "deliverAt": r.deliver_at_ms,
        "deliveredAt": r.delivered_at_ms,
        "headers": dict(r.headers),
        "payload": base64.b64encode(r.payload).decode(),
    }


def tail(args: argparse.Namespace) -> int:
    path = os.path.join(args.data, "destination")
    if not os.path.isdir(path):
        print(f"nereus tail: no local destination under {args.data}", file=sys.stderr)
        return 2
    dest = LocalDestination(path)
    offset = args.from_offset
    printed = 0
    try:
        while True:
            for record in dest.read(args.queue, offset):
                print(json.dumps(record_json(record)), flush=True)
                offset = record.offset + 1
                printed += 1
                if args.limit is not None and printed >= args.limit:
                    return 0
            if not args.follow:
                return 0
            time.sleep(0.1)
    except KeyboardInterrupt:
        return 0
    finally:
        dest.close()
