"""The embedded mode, composed: one shard in an LMDB log, the local destination or Pulsar
targets (or both), and the HTTP API over them.

Theory of operation: `serve_embedded` runs after the configuration and the listen address
were checked (`adapters.compose.serve`). It checks the host clock, builds the destination
(`adapters.compose.destinations`), opens the shard (`adapters.local.embedded.Nereus`), and
only then binds the HTTP server (`adapters.compose.http`), so a refusal at any step exits 2
with what was opened closed again. It serves until the stop event is set or the runtime
halts (exit 1), then stops the server before the shard.
"""

from __future__ import annotations

import argparse
import os
import socket
import threading

from nereus.adapters.clock import SystemClock
from nereus.adapters.compose.destinations import pulsar_destination
from nereus.adapters.compose.http import http_api
from nereus.adapters.compose.lifecycle import log_auth, stop_on_signals, stop_within, tune_gc
from nereus.adapters.compose.serve_clock import serve_clock
from nereus.adapters.local.embedded import Nereus
from nereus.adapters.tenancy import ConfigError, Tenancy
from nereus.runtime.config import RuntimeConfig
from nereus.runtime.log import Logger
from nereus.storage.errors import StoreError


def serve_embedded(
    args: argparse.Namespace,
    log: Logger,
    tenancy: Tenancy,
    address: tuple[str, int],
    *,
    stop: threading.Event,
) -> int:
    if tenancy.kafka_settings or tenancy.kafka_destination.topics:
        log.warning(
            "kafka_settings_unused",
            detail="[kafka] and [kafka_destination] apply to --kafka mode only",
        )
    clock = serve_clock(args, log)
    if clock is None:
        return 2
    nereus = _open(args, log, tenancy, clock)
    if nereus is None:
        return 2
    stop_on_signals(stop)
    made = http_api(nereus.service, tenancy, log, address)
    if made is None:
        nereus.close()
        return 2
    _, server = made
    tune_gc()
    nereus.start()
    server.start()
    log_auth(tenancy, log)
    log.info(
        "serving",
        url=f"http://{address[0]}:{server.port}",
        data=os.path.abspath(args.data),
        applied_position=nereus.store.meta.position,
    )
    code = 0
    while not stop.wait(0.5):
        if nereus.runtime.halted is not None:
            log.error("halted", error=repr(nereus.runtime.halted))
            code = 1
            break
    return stop_within(args.stop_timeout_s, log, code, server.stop, nereus.close)


def _open(
    args: argparse.Namespace, log: Logger, tenancy: Tenancy, clock: SystemClock
) -> Nereus | None:
    """The shard with its destination, not started; None when refused (logged)."""
    try:
        destination = pulsar_destination(args, tenancy, log)
    except (ConfigError, ValueError) as exc:
        log.error("refused", detail=str(exc))
        return None
    try:
        return Nereus.open(
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
        return None
