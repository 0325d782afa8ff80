"""Where a composed service delivers: the local destination, Pulsar targets, or both (the
embedded mode), and Kafka mode's destination topics, each checked against the configured
tenants before anything starts.

Theory of operation: the configuration file (`[pulsar]`, `[kafka_destination]`) is checked
when it is loaded (`adapters.tenancy`, `adapters.compose.config`); what the command line adds
(`--pulsar URL`, `--topic [TENANT/]QUEUE=TOPIC`) is merged here and the whole is checked
again with `adapters.tenant_topics.topic_problem`, which also refuses tenants whose derived
topic names could meet. A refusal is a `ConfigError` naming the file and key, or the flag.

`routed_destination` builds what a `PulsarRouting` describes. This is the one place that
joins two edges' destinations (Pulsar's and the local one), which is why it lives in the
composition root and not in either edge:

    routing = routing_for_url("pulsar://127.0.0.1:6650", {})   # every queue to Pulsar
    with Nereus.open("data", destination=routed_destination(routing, "data")) as nereus: ...

One target and no local queue: that `PulsarDestination` itself. Otherwise a
`RoutedDestination` of the targets (and the local destination in `DIR/destination` when a
queue, or the default, stays local).
"""

from __future__ import annotations

import argparse
import os
from importlib import import_module

from nereus.adapters.compose.config import pulsar_routing
from nereus.adapters.local.destination import LocalDestination
from nereus.adapters.pulsar.config import PulsarRouting, check_tenant_topics, routing_for_url
from nereus.adapters.routed import RoutedDestination
from nereus.adapters.tenancy import ConfigError, Tenancy
from nereus.adapters.tenant_topics import parse_topic_specs, topic_problem
from nereus.kernel.config import KernelConfig
from nereus.runtime.destination import Destination
from nereus.runtime.log import Logger

LOCAL = "local"


def pulsar_destination(
    args: argparse.Namespace, tenancy: Tenancy, log: Logger
) -> Destination | None:
    """The destination `--pulsar` and the config's `[pulsar]` section choose, or None for
    the local destination alone. Raises ConfigError / ValueError when refused."""
    if not args.pulsar and not tenancy.pulsar:
        return None
    try:
        # An extra: the embedded default runs without the Pulsar client.
        import_module("nereus.adapters.pulsar.destination")
    except ImportError:
        raise ValueError(
            "the Pulsar destination needs pulsar-client: pip install 'nereus[pulsar]'"
        ) from None
    routing = pulsar_routing(tenancy, args.pulsar)
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


def routed_destination(
    routing: PulsarRouting,
    data_dir: str,
    *,
    kernel_config: KernelConfig | None = None,
    logger: Logger | None = None,
) -> Destination:
    """The destination `routing` describes (see the module's docstring); ValueError when a
    target takes the local destination's name."""
    # The Pulsar client is an extra: imported only when a routing asks for it.
    from nereus.adapters.pulsar.destination import PulsarDestination  # noqa: PLC0415

    if LOCAL in routing.targets:
        raise ValueError(f"{LOCAL!r} names the local destination; give the target another name")
    targets: dict[str, Destination] = {}
    try:
        for name, target in routing.targets.items():
            targets[name] = PulsarDestination(target, kernel_config=kernel_config, logger=logger)
        used = {*routing.queues.values(), routing.default}
        if LOCAL in used:
            targets[LOCAL] = LocalDestination(os.path.join(data_dir, "destination"))
    except BaseException:
        for made in targets.values():
            made.close()
        raise
    if len(targets) == 1 and not routing.queues:
        return next(iter(targets.values()))
    return RoutedDestination(targets, routing.queues, routing.default)


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
