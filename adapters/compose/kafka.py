"""Kafka mode, composed: the shards are the partitions of the commands topic, shared by every
process in the group (`adapters.kafka.service`), timers are published to Kafka topics, and
the HTTP API serves over them; one of `--processes` N also joins its siblings.

Theory of operation: every check that needs no broker runs first (the extra installed, the
destination topics against the tenants, the `[kafka]` settings as librdkafka judges them, the
host clock), then one contact with the commands topic's cluster only: the service must start
while a destination cluster is down (its sends wait; recovery settles them later). The
service is started before the HTTP server is bound, and stopped after it; a process of a
supervisor (`adapters.compose.processes`) leaves its siblings first.
"""

from __future__ import annotations

import argparse
import os
import socket
import threading
import uuid
from collections.abc import Callable
from importlib import import_module
from typing import TYPE_CHECKING

from nereus.adapters.clock import SystemClock
from nereus.adapters.compose.destinations import kafka_topics
from nereus.adapters.compose.http import http_api
from nereus.adapters.compose.lifecycle import log_auth, stop_on_signals, stop_within, tune_gc
from nereus.adapters.compose.lifeline import wait_for_stop
from nereus.adapters.compose.processes import inherited_socket, join_siblings
from nereus.adapters.compose.serve_clock import serve_clock
from nereus.adapters.tenancy import ConfigError, Tenancy
from nereus.runtime.log import Logger
from nereus.storage.errors import StoreError

if TYPE_CHECKING:
    from nereus.adapters.kafka.service import KafkaService, KafkaServiceConfig

# How long `nereus serve --kafka` waits for a first answer from a cluster before refusing.
CONTACT_TIMEOUT_S = 30.0


def serve_kafka(
    args: argparse.Namespace,
    log: Logger,
    tenancy: Tenancy,
    address: tuple[str, int],
    *,
    stop: threading.Event,
) -> int:
    try:
        # Kafka mode is an extra: the embedded default runs without librdkafka.
        import_module("confluent_kafka")
        from nereus.adapters.kafka.service import KafkaService  # noqa: PLC0415
    except ImportError:
        log.error("refused", detail="Kafka mode needs confluent-kafka: pip install 'nereus[kafka]'")
        return 2
    checked = _checked(args, log, tenancy)
    if checked is None:
        return 2
    config, clock = checked
    service = KafkaService(config, clock=clock, logger=log)
    stop_on_signals(stop)
    if not _start(service, log):
        return 2
    sock = None if args.http_fd is None else inherited_socket(args.http_fd)
    made = http_api(service, tenancy, log, address, sock=sock)
    if made is None:
        service.close()
        return 2
    api, server = made
    stopping: list[Callable[[], None]] = [server.stop, service.close]
    if args.sibling_dir is not None:
        stopping = [join_siblings(service, api, args.sibling_dir, args.process_name), *stopping]
    tune_gc()
    server.start()
    log_auth(tenancy, log)
    log.info(
        "serving",
        url=f"http://{address[0]}:{server.port}",
        data=os.path.abspath(args.data),
        mode="kafka",
        process=config.process_id,
        process_name=args.process_name,
        pid=os.getpid(),
        commands_topic=config.commands_topic,
        shards=service.shards,
    )
    wait_for_stop(stop)
    return stop_within(args.stop_timeout_s, log, 0, *stopping)


def _checked(
    args: argparse.Namespace, log: Logger, tenancy: Tenancy
) -> tuple[KafkaServiceConfig, SystemClock] | None:
    """The service's configuration and clock, every check made that needs no broker, then
    the commands topic's cluster reached; None when refused (logged)."""
    from nereus.adapters.kafka.settings import refusal, unreachable  # noqa: PLC0415

    try:
        # Before any connection: a mapping the tenants refuse needs no broker to refuse.
        topics = kafka_topics(tenancy, args.topic)
    except (ConfigError, ValueError) as exc:
        log.error("refused", detail=str(exc))
        return None
    problem = refusal(tenancy.kafka_settings)
    if problem is not None:
        log.error(
            "refused",
            detail=f"librdkafka refuses the [kafka] settings: {problem}",
            config=tenancy.source,
            key="kafka",
        )
        return None
    clock = serve_clock(args, log)
    if clock is None:
        return None
    # The commands topic's cluster only: the service must start while a destination is
    # down (its sends wait; recovery settles them later).
    problem = unreachable(args.kafka, tenancy.kafka_settings, CONTACT_TIMEOUT_S)
    if problem is not None:
        log.error("refused", detail=f"Kafka mode cannot reach {problem}")
        return None
    return _service_config(args, tenancy, topics), clock


def _service_config(
    args: argparse.Namespace, tenancy: Tenancy, topics: dict[str, str]
) -> KafkaServiceConfig:
    from nereus.adapters.kafka.service import KafkaServiceConfig  # noqa: PLC0415

    return KafkaServiceConfig(
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


def _start(service: KafkaService, log: Logger) -> bool:
    """Start the service (join the group, open its shards); False when refused (logged, the
    service closed)."""
    from confluent_kafka import KafkaException  # noqa: PLC0415

    try:
        service.start()
    except (KafkaException, ValueError, TimeoutError, OSError, StoreError) as exc:
        log.error("refused", detail=f"Kafka mode cannot start: {exc}")
        service.close()
        return False
    return True
