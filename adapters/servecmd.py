"""`nereus serve` and `nereus tail`: run the service, and read what it delivered.

`nereus serve --data DIR` runs the embedded default (one shard, LMDB log, local
destination). `--config FILE` (TOML, `specs/http.md`) gives the tenants, their credentials,
limits and queue encryption keys, and the listen address; without it the service has one
tenant `default`, no authentication, and binds loopback only.

`nereus serve --kafka BOOTSTRAP --data DIR` runs Kafka mode
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
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException

from adapters.clock import SystemClock
from adapters.embedded import Nereus
from adapters.http.api import TimerApi
from adapters.http.server import HttpServer
from adapters.kafka_service import KafkaService, KafkaServiceConfig
from adapters.local_destination import LocalDestination, LocalRecord
from adapters.tenancy import ConfigError, Tenancy, load_tenancy
from runtime import compiled
from runtime.config import RuntimeConfig
from runtime.log import Logger, configure_json_logging
from storage.errors import StoreError


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("serve", help="run one shard with the HTTP API")
    p.add_argument("--data", required=True, help="data directory (shard store + local topics)")
    p.add_argument(
        "--config", metavar="FILE", help="service configuration (TOML): tenants, tokens, limits"
    )
    p.add_argument(
        "--http",
        default=None,
        metavar="HOST:PORT",
        help="listen address (default: [server] host/port of the config, else 127.0.0.1:6632)",
    )
    p.add_argument(
        "--assume-clock-error-ms",
        type=float,
        default=None,
        help="error bound to assume when the host clock reports no synchronisation "
        "(without it, an unsynchronised host fires nothing)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument(
        "--stop-timeout-s",
        type=float,
        default=30.0,
        help="after SIGTERM/SIGINT, how long stopping may take before the process exits anyway "
        "(nothing durable is lost: whatever was still in flight is settled by the next start)",
    )
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
        "--destination-bootstrap",
        metavar="BOOTSTRAP",
        help="the cluster timers are published to (default: the one of --kafka)",
    )
    k.add_argument(
        "--delivery",
        choices=["transactional", "idempotent"],
        default="transactional",
        help="transactional: each shard's sends are Kafka transactions, and a restart or a "
        "takeover proves unfinished attempts absent (consumers must read with "
        "isolation.level=read_committed); idempotent: for clusters without transactions "
        "(an attempt in flight at a crash may be retried as a duplicate)",
    )
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


def _listen_address(
    args: argparse.Namespace, tenancy: Tenancy, log: Logger
) -> tuple[str, int] | None:
    if args.http is None:
        host, port = tenancy.server.host, tenancy.server.port
    else:
        host, _, port_text = args.http.rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
        try:
            port = int(port_text)
        except ValueError:
            log.error("refused", detail=f"--http wants HOST:PORT, not {args.http!r}")
            return None
    if tenancy.auth_disabled and not _is_loopback(host):
        log.error(
            "refused",
            detail=f"without --config the service has no authentication and binds loopback "
            f"only; {host!r} is not a loopback address (give a --config with tenants and "
            "tokens to listen elsewhere)",
            http=f"{host}:{port}",
        )
        return None
    return host, port


def _tenancy(args: argparse.Namespace, log: Logger) -> Tenancy | None:
    if args.config is None:
        return Tenancy.open_default()
    try:
        return load_tenancy(args.config)
    except ConfigError as exc:
        log.error("refused", detail=str(exc), config=exc.source, key=exc.key)
        return None


def _api(
    backend: Nereus | KafkaService, tenancy: Tenancy, log: Logger, host: str, port: int
) -> tuple[TimerApi, HttpServer] | None:
    try:
        api = TimerApi(backend, tenancy=tenancy, logger=log)
    except ConfigError as exc:
        log.error("refused", detail=str(exc), config=exc.source, key=exc.key)
        return None
    try:
        server = HttpServer(
            api, host, port, limits=tenancy.server, access_log=tenancy.server.access_log
        )
    except OSError as exc:
        log.error("refused", detail=f"cannot listen on {host}:{port}: {exc}")
        return None
    return api, server


def _log_auth(tenancy: Tenancy, log: Logger) -> None:
    if tenancy.auth_disabled:
        log.warning(
            "auth_disabled",
            detail="no --config: one tenant 'default', no credentials, every grant, loopback only",
        )
    else:
        log.info(
            "tenancy",
            config=tenancy.source,
            tenants=sorted(tenancy.tenants),
            tokens=len(tenancy.credentials),
        )


def serve(args: argparse.Namespace) -> int:
    configure_json_logging(level=args.log_level)
    log = Logger()
    tenancy = _tenancy(args, log)
    if tenancy is None:
        return 2
    log.info("kernel", compiled_modules=compiled.compiled_modules())
    address = _listen_address(args, tenancy, log)
    if address is None:
        return 2
    host, port = address
    if args.kafka:
        return serve_kafka(args, log, tenancy, host, port)
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
    made = _api(nereus, tenancy, log, host, port)
    if made is None:
        nereus.close()
        return 2
    _, server = made
    nereus.start()
    server.start()
    _log_auth(tenancy, log)
    log.info(
        "serving",
        url=f"http://{host}:{server.port}",
        data=os.path.abspath(args.data),
        applied_position=nereus.store.meta.position,
    )
    code = 0
    while not stop.wait(0.5):
        if nereus.runtime.halted is not None:
            log.error("halted", error=repr(nereus.runtime.halted))
            code = 1
            break
    return _stop_within(args.stop_timeout_s, log, code, server.stop, nereus.close)


def serve_kafka(
    args: argparse.Namespace, log: Logger, tenancy: Tenancy, host: str, port: int
) -> int:
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
        destination_delivery=args.delivery,
        destination_bootstrap=args.destination_bootstrap,
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
    made = _api(service, tenancy, log, host, port)
    if made is None:
        service.close()
        return 2
    _, server = made
    server.start()
    _log_auth(tenancy, log)
    log.info(
        "serving",
        url=f"http://{host}:{server.port}",
        data=os.path.abspath(args.data),
        mode="kafka",
        process=config.process_id,
        commands_topic=config.commands_topic,
        shards=service.shards,
    )
    stop.wait()
    return _stop_within(args.stop_timeout_s, log, 0, server.stop, service.close)


def _stop_within(timeout_s: float, log: Logger, code: int, *steps: Callable[[], None]) -> int:
    """Run the stopping steps, for at most `timeout_s`. A step still running then (a broker
    that does not answer, say) is abandoned and the process exits at once with code 1: what
    it held is durable or settled by the next start, never lost."""
    started = time.monotonic()
    done = threading.Event()

    def run() -> None:
        for step in steps:
            step()
        done.set()

    threading.Thread(target=run, name="nereus-stop", daemon=True).start()
    if done.wait(timeout_s):
        log.info("stopped", took_ms=int((time.monotonic() - started) * 1000))
        return code
    log.error("stop_timeout", timeout_s=timeout_s, detail="exiting with work still running")
    sys.stderr.flush()
    os._exit(1)


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
            batch = dest.read(args.queue, offset)
            for record in batch:
                print(json.dumps(record_json(record)), flush=True)
                offset = record.offset + 1
                printed += 1
                if args.limit is not None and printed >= args.limit:
                    return 0
            if batch:
                continue  # a read returns a page: read on until the topic's end
            if not args.follow:
                return 0
            time.sleep(0.1)
    except KeyboardInterrupt:
        return 0
    finally:
        dest.close()
