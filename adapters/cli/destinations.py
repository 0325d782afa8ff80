"""Where `nereus serve` delivers: the Pulsar routing of the embedded mode, and Kafka mode's
destination topics, each checked against the configured tenants before anything starts.

Theory of operation: the configuration file (`[pulsar]`, `[kafka_destination]`) is checked
when it is loaded (`adapters.tenancy`); what the command line adds (`--pulsar URL`,
`--topic [TENANT/]QUEUE=TOPIC`) is merged here and the whole is checked again with
`adapters.tenant_topics.topic_problem`, which also refuses tenants whose derived topic names
could meet. A refusal is a `ConfigError` naming the file and key, or the flag.
"""

from __future__ import annotations

import argparse

from nereus.adapters.tenancy import ConfigError, Tenancy
from nereus.adapters.tenant_topics import parse_topic_specs, topic_problem
from nereus.runtime.destination import Destination
from nereus.runtime.log import Logger


def pulsar_destination(
    args: argparse.Namespace, tenancy: Tenancy, log: Logger
) -> Destination | None:
    """The destination `--pulsar` and the config's `[pulsar]` section choose, or None for
    the local destination alone. Raises ConfigError / ValueError when refused."""
    if not args.pulsar and not tenancy.pulsar:
        return None
    try:
        # An extra: the embedded default runs without the Pulsar client.
        from nereus.adapters.pulsar.build import routed_destination  # noqa: PLC0415
        from nereus.adapters.pulsar.config import (  # noqa: PLC0415
            check_tenant_topics,
            routing_for_url,
        )
    except ImportError:
        raise ValueError(
            "the Pulsar destination needs pulsar-client: pip install 'nereus[pulsar]'"
        ) from None
    routing = tenancy.pulsar_routing(args.pulsar)
    if routing is None:
        return None
    if not tenancy.pulsar:
        # `--pulsar URL` alone: every queue to one target, mapped by `--topic`.
        routing = routing_for_url(args.pulsar, parse_topic_specs(args.topic))
        flag = "--topic" if args.topic else "--pulsar"
        check_tenant_topics(routing, tenancy.tenants, lambda _k, p: ConfigError(flag, None, p))
    log.info(
        "pulsar_routing",
        targets={n: t.service_url for n, t in routing.targets.items()},
        queues=routing.queues,
        default=routing.default,
    )
    return routed_destination(routing, args.data, logger=log)


def kafka_topics(tenancy: Tenancy, specs: list[str]) -> dict[str, str]:
    """Kafka mode's destination topics: `[kafka_destination]` and `--topic` (which wins).
    Raises ConfigError where two tenants would share a topic not declared shared, ValueError
    for a malformed `--topic`."""
    flags = parse_topic_specs(specs)
    section = tenancy.kafka_destination
    topics = {**section.topics, **flags}
    problem = topic_problem(topics, tenancy.tenants, shared=section.shared_topics)
    if problem is None:
        return topics
    if problem.key in flags:
        raise ConfigError("--topic", f"{problem.key}={flags[problem.key]}", problem.problem)
    key = f"kafka_destination.topics.{problem.key}" if problem.key else "tenants"
    raise ConfigError(tenancy.source, key, problem.problem)
