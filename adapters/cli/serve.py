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
`--assume-clock-error-ms N` or `--allow-unbounded-clock` says how
(`adapters.compose.serve_clock`).
`GET /readyz` says whether the process serves every shard it should (`service.readiness`).

This module only parses: the service is built and run by the composition root
(`adapters.compose.serve`), the one package that joins the edges (HTTP, the local
destination, Kafka, Pulsar).
"""

from __future__ import annotations

import argparse
from typing import Any

from nereus.adapters.cli.modes import add_file_mode
from nereus.adapters.compose import serve as composed


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
    _add_clock_flags(p)
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_file_mode(p)
    p.add_argument(
        "--stop-timeout-s",
        type=float,
        default=30.0,
        help="after SIGTERM/SIGINT, how long stopping may take before the process exits anyway "
        "(nothing durable is lost: whatever was still in flight is settled by the next start)",
    )
    _add_pulsar(p)
    k = p.add_argument_group("Kafka mode")
    _add_kafka(k)
    _add_kafka_processes(k)
    p.set_defaults(handler=serve)


def serve(args: argparse.Namespace) -> int:
    """Run the service the options describe (`adapters.compose.serve`)."""
    return composed.serve(args)


def _add_pulsar(p: argparse.ArgumentParser) -> None:
    pl = p.add_argument_group("Pulsar destination")
    pl.add_argument(
        "--pulsar",
        metavar="URL",
        help="publish timers to Apache Pulsar (pulsar://host:port): every queue, with ordinary "
        "managed delivery, unless the config's [pulsar] section routes queues to targets "
        "(delayed handoff included); the section's targets without a service_url take this one",
    )


def _add_kafka(k: Any) -> None:
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


def _add_kafka_processes(k: Any) -> None:
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


def _add_clock_flags(p: Any) -> None:
    p.add_argument(
        "--assume-clock-error-ms",
        type=float,
        default=None,
        metavar="N",
        help="error bound (ms) to assume when the host clock reports no synchronisation "
        "(without it, or --allow-unbounded-clock, such a host is refused at start)",
    )
    p.add_argument(
        "--allow-unbounded-clock",
        action="store_true",
        help="start even when the host clock cannot bound true time: nothing fires and "
        "/readyz answers 503 (clock_unbounded) until it can",
    )


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value
