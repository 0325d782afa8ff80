"""`nereus serve`: run the service (`nereus tail`, in `tail.py`, reads what it delivered).

`nereus serve --data DIR` runs the embedded default (one shard, LMDB log, local
destination). `--config FILE` (TOML, `specs/http.md`) gives the tenants, their credentials,
limits and queue encryption keys, and the listen address; without it the service has one
tenant `default`, no authentication, and binds loopback only.

`nereus serve --kafka BOOTSTRAP --data DIR` runs Kafka mode
(`adapters.kafka.service`): the shards are the partitions of the commands topic, shared by
every process in the group, and timers are published to Kafka topics (`--topic
[TENANT/]QUEUE=TOPIC` and the config's `[kafka_destination]`; a queue not listed publishes to
`<tenant>.<queue>`, the default tenant's to the topic of the queue's own name:
`adapters.tenant_topics`).

`nereus serve --pulsar URL --data DIR` runs the embedded default with timers published to
Apache Pulsar (every queue, ordinary managed delivery, `--topic QUEUE=TOPIC` as for Kafka);
the config's `[pulsar]` section (`adapters.pulsar.config`) instead routes chosen queues to
named Pulsar targets, with a certified delayed handoff where a target is configured for it.

In every mode a host clock that cannot bound true time is refused at start (exit 2), after
the configuration is checked and before anything is opened or contacted, unless
`--assume-clock-error-ms N` or `--allow-unbounded-clock` says how (`serve_clock.py`).
`GET /readyz` says whether the process serves every shard it should (`service.readiness`).
"""

from __future__ import annotations

import argparse
import gc
import ipaddress
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from nereus.adapters.cli.destinations import kafka_topics, pulsar_destination
from nereus.adapters.cli.lifeline import EXIT_MARGIN_S, follow_supervisor, wait_for_stop
from nereus.adapters.cli.modes import add_file_mode
from nereus.adapters.cli.processes import inherited_socket, join_siblings, supervise
from nereus.adapters.cli.serve_clock import add_clock_flags, serve_clock
from nereus.adapters.http.api import TimerApi
from nereus.adapters.http.server import HttpServer
from nereus.adapters.local.embedded import Nereus
from nereus.adapters.tenancy import ConfigError, Tenancy, load_tenancy
from nereus.runtime import compiled
from nereus.runtime.config import RuntimeConfig
from nereus.runtime.log import Logger, configure_json_logging
from nereus.storage.errors import StoreError

if TYPE_CHECKING:
    from nereus.adapters.kafka.service import KafkaService

# How long `nereus serve --kafka` waits for a first answer from a cluster before refusing.
CONTACT_TIMEOUT_S = 30.0


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
    add_clock_flags(p)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_file_mode(p)
    p.add_argument(
        "--stop-timeout-s",
        type=float,
        default=30.0,
        help="after SIGTERM/SIGINT, how long stopping may take before the process exits anyway "
        "(nothing durable is lost: whatever was still in flight is settled by the next start)",
    )
    pl = p.add_argument_group("Pulsar destination")
    pl.add_argument(
        "--pulsar",
        metavar="URL",
        help="publish timers to Apache Pulsar (pulsar://host:port): every queue, with ordinary "
        "managed delivery, unless the config's [pulsar] section routes queues to targets "
        "(delayed handoff included); the section's targets without a service_url take this one",
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
        metavar="[TENANT/]QUEUE=TOPIC",
        help="destination topic of every tenant's QUEUE, or of one tenant's (repeatable; "
        "two tenants on one topic are refused unless [kafka_destination] shared_topics "
        "lists it)",
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
        "--processes",
        type=int,
        default=1,
        help="run this many service processes sharing the shards and the HTTP address, "
        "supervised by this one (one interpreter lock each: more of the machine's cores)",
    )
    k.add_argument(
        "--snapshot-interval-ms",
        type=_non_negative_int,
        default=600_000,
        help="each owner writes a snapshot of its shard to <commands>.snapshots this often "
        "(0: never); a new owner without a store restores the newest (default 600000)",
    )
    k.add_argument(
        "--no-command-batches",
        dest="command_batches",
        action="store_false",
        help="send every command as a record of its own, not one COMMANDS_V1 record per shard "
        "and request: for a rolling upgrade from a build without COMMANDS_V1, until every "
        "process runs this one",
    )
    # Set by the supervisor for each of its processes.
    k.add_argument("--http-fd", type=int, default=None, help=argparse.SUPPRESS)
    k.add_argument("--sibling-dir", default=None, help=argparse.SUPPRESS)
    k.add_argument("--process-name", default=None, help=argparse.SUPPRESS)
    k.add_argument("--supervisor-fd", type=int, default=None, help=argparse.SUPPRESS)
    k.add_argument(
        "--destination-linger-ms",
        type=int,
        default=5,
        help="how long the destination producer batches records before sending",
    )
    p.set_defaults(handler=serve)


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
    backend: Nereus | KafkaService,
    tenancy: Tenancy,
    log: Logger,
    host: str,
    port: int,
    *,
    sock: socket.socket | None = None,
) -> tuple[TimerApi, HttpServer] | None:
    try:
        api = TimerApi(
            backend.service if isinstance(backend, Nereus) else backend, tenancy=tenancy, logger=log
        )
    except ConfigError as exc:
        log.error("refused", detail=str(exc), config=exc.source, key=exc.key)
        return None
    try:
        server = HttpServer(
            api,
            host,
            port,
            limits=tenancy.server,
            access_log=tenancy.server.access_log,
            sock=sock,
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


# The cyclic garbage collector's thresholds for the service's process. The fire path and the
# intake make and drop many small containers per timer, almost none of them in a cycle, so
# the default (a young-generation pass every 700 allocations) spends ~4 % of a fired timer's
# instructions walking objects that reference counting frees anyway (callgrind, bench.cost's
# fire: 758k -> 726k per timer). Cycles still get collected, a little later.
GC_THRESHOLDS = (100_000, 50, 100)


def _tune_gc() -> None:
    """Collect what start-up made, keep it out of later passes, and collect less often.
    Only the service does this: an embedding program owns its process's collector."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def serve(args: argparse.Namespace) -> int:
    configure_json_logging(level=args.log_level)
    log = Logger()
    # Made first: from here on a supervisor's end asks for the stop, as SIGTERM does later.
    stop = threading.Event()
    if args.supervisor_fd is not None:
        exit_after_s = args.stop_timeout_s + EXIT_MARGIN_S
        if not follow_supervisor(args.supervisor_fd, stop.set, exit_after_s, log):
            return 2
    tenancy = _tenancy(args, log)
    if tenancy is None:
        return 2
    log.info("kernel", compiled_modules=compiled.compiled_modules())
    address = _listen_address(args, tenancy, log)
    if address is None:
        return 2
    host, port = address
    if args.processes != 1 and not args.kafka:
        log.error("refused", detail="--processes needs Kafka mode (--kafka): it shares shards")
        return 2
    if args.kafka:
        if args.pulsar or tenancy.pulsar:
            log.error("refused", detail="the Pulsar destination runs in the embedded mode only")
            return 2
        if args.processes < 1:
            log.error("refused", detail=f"--processes must be at least 1, not {args.processes}")
            return 2
        if args.processes > 1:
            # Each process checks its clock too; the supervisor refuses once, before any.
            if serve_clock(args, log) is None:
                return 2
            return supervise(args, args.argv, log, (host, port), tenancy.server.backlog)
        return serve_kafka(args, log, tenancy, host, port, stop=stop)
    if tenancy.kafka_settings or tenancy.kafka_destination.topics:
        log.warning(
            "kafka_settings_unused",
            detail="[kafka] and [kafka_destination] apply to --kafka mode only",
        )
    clock = serve_clock(args, log)
    if clock is None:
        return 2
    try:
        destination = pulsar_destination(args, tenancy, log)
    except (ConfigError, ValueError) as exc:
        log.error("refused", detail=str(exc))
        return 2
    try:
        nereus = Nereus.open(
            args.data,
            destination=destination,
            clock=clock,
            # serve_clock decided: a clock that loses its bound later shows in /readyz.
            allow_unbounded_clock=True,
            runtime_config=RuntimeConfig(owner=f"{socket.gethostname()}:{os.getpid()}"),
            logger=log,
        )
    except StoreError as exc:
        log.error("refused", detail=str(exc))
        if destination is not None:
            destination.close()
        return 2
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    made = _api(nereus, tenancy, log, host, port)
    if made is None:
        nereus.close()
        return 2
    _, server = made
    _tune_gc()
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
    args: argparse.Namespace,
    log: Logger,
    tenancy: Tenancy,
    host: str,
    port: int,
    *,
    stop: threading.Event,
) -> int:
    try:
        # Kafka mode is an extra: the embedded default runs without librdkafka.
        from confluent_kafka import KafkaException  # noqa: PLC0415

        from nereus.adapters.kafka.service import KafkaService, KafkaServiceConfig  # noqa: PLC0415
        from nereus.adapters.kafka.settings import refusal, unreachable  # noqa: PLC0415
    except ImportError:
        log.error("refused", detail="Kafka mode needs confluent-kafka: pip install 'nereus[kafka]'")
        return 2
    try:
        # Before any connection: a mapping the tenants refuse needs no broker to refuse.
        topics = kafka_topics(tenancy, args.topic)
    except (ConfigError, ValueError) as exc:
        log.error("refused", detail=str(exc))
        return 2
    problem = refusal(tenancy.kafka_settings)
    if problem is not None:
        log.error(
            "refused",
            detail=f"librdkafka refuses the [kafka] settings: {problem}",
            config=tenancy.source,
            key="kafka",
        )
        return 2
    clock = serve_clock(args, log)
    if clock is None:
        return 2
    # The commands topic's cluster only: the service must start while a destination is
    # down (its sends wait; recovery settles them later).
    problem = unreachable(args.kafka, tenancy.kafka_settings, CONTACT_TIMEOUT_S)
    if problem is not None:
        log.error("refused", detail=f"Kafka mode cannot reach {problem}")
        return 2
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
        command_batches=args.command_batches,
        snapshot_interval_ms=args.snapshot_interval_ms,
        client_config=dict(tenancy.kafka_settings),
        process_id=f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}",
    )
    service = KafkaService(config, clock=clock, logger=log)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        service.start()
    except (KafkaException, ValueError, TimeoutError, OSError, StoreError) as exc:
        log.error("refused", detail=f"Kafka mode cannot start: {exc}")
        service.close()
        return 2
    sock = None if args.http_fd is None else inherited_socket(args.http_fd)
    made = _api(service, tenancy, log, host, port, sock=sock)
    if made is None:
        service.close()
        return 2
    api, server = made
    stopping: list[Callable[[], None]] = [server.stop, service.close]
    if args.sibling_dir is not None:
        stopping = [join_siblings(service, api, args.sibling_dir, args.process_name), *stopping]
    _tune_gc()
    server.start()
    _log_auth(tenancy, log)
    log.info(
        "serving",
        url=f"http://{host}:{server.port}",
        data=os.path.abspath(args.data),
        mode="kafka",
        process=config.process_id,
        process_name=args.process_name,
        pid=os.getpid(),
        commands_topic=config.commands_topic,
        shards=service.shards,
    )
    wait_for_stop(stop)
    return _stop_within(args.stop_timeout_s, log, 0, *stopping)


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


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value
