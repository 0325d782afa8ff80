"""The HTTP edge of a composed service: the timer API over a backend, and its server.

Theory of operation: every mode (embedded, Kafka, one of `--processes` N) serves the same
HTTP API; only the `TimerService` it calls differs (the embedded `Nereus.service`, or
`KafkaService`). This module is the one place that constructs the API and its server, so a
change of what the API is given is made here once. A configuration the API refuses (a
queue key, a limit) and an address that cannot be bound are logged as `refused`; the caller
then exits 2 without serving.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

from nereus.adapters.http.api import TimerApi
from nereus.adapters.http.server import HttpServer
from nereus.adapters.tenancy import ConfigError, Tenancy
from nereus.runtime.log import Logger

if TYPE_CHECKING:
    from nereus.service.port import TimerService


def http_api(
    service: TimerService,
    tenancy: Tenancy,
    log: Logger,
    address: tuple[str, int],
    *,
    sock: socket.socket | None = None,
) -> tuple[TimerApi, HttpServer] | None:
    """The API over `service` and its server on `address` (or the inherited `sock`), not
    started; None when refused (logged)."""
    host, port = address
    try:
        api = TimerApi(service, tenancy=tenancy, logger=log)
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
