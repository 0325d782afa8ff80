"""The destination a `PulsarRouting` describes: Pulsar targets, the local one, or both.

    routing = routing_for_url("pulsar://127.0.0.1:6650", {})   # every queue to Pulsar
    with Nereus.open("data", destination=routed_destination(routing, "data")) as nereus: ...

One target and no local queue: that `PulsarDestination` itself. Otherwise a
`RoutedDestination` of the targets (and the local destination in `DIR/destination` when a
queue, or the default, stays local).
"""

from __future__ import annotations

import os

from nereus.adapters.local.destination import LocalDestination
from nereus.adapters.pulsar.config import PulsarRouting
from nereus.adapters.pulsar.destination import PulsarDestination
from nereus.adapters.routed import RoutedDestination
from nereus.kernel.config import KernelConfig
from nereus.runtime.destination import Destination
from nereus.runtime.log import Logger

LOCAL = "local"


def routed_destination(
    routing: PulsarRouting,
    data_dir: str,
    *,
    kernel_config: KernelConfig | None = None,
    logger: Logger | None = None,
) -> Destination:
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
