"""`nereus serve` and `nereus tail`: run the embedded service, and read what it delivered."""

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
from typing import Any

from adapters.embedded import Nereus
from adapters.http_api import HttpServer, TimerApi
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


def serve(args: argparse.Namespace) -> int:
    log = Logger(level=args.log_level)
    host, _, port_text = args.http.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not _is_loopback(host):
        log.error(
            "refused",
            detail="without a tenant configuration the service has no authentication and "
            "binds loopback only",
            http=args.http,
        )
        return 2
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
        server = HttpServer(TimerApi(nereus), host, int(port_text))
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
