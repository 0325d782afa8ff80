"""What the connections of one HTTP server share, and one request being answered.

Theory of operation: `adapters.http.protocol` runs one connection; what outlives a
connection or is common to all of them lives here. `Shared` holds the limits, the count of
requests in flight (checked against `max_inflight` before a request starts), the hooks that
count and log answers, and the one buffer every socket read of the server lands in before
it is copied into that connection's inbox. `Cycle` is one request between its head and its
answer: the ASGI scope, the body as it arrives, and the response as the app starts it.
`log_answer` writes the access line of an answered request, its target with credentials in
the query redacted (`adapters.http.redact`).
"""

from __future__ import annotations

import asyncio
import http
import time
from collections.abc import Callable
from typing import Any

from nereus.adapters.config_file import HttpLimits
from nereus.adapters.http.redact import redact_target
from nereus.runtime.log import Logger

# The longest a logged request target is (after its credentials are redacted).
LOGGED_TARGET_CHARS = 256


class Shared:
    def __init__(
        self,
        limits: HttpLimits,
        observe: Callable[[str, int, float], None],
        access_log: bool,
    ) -> None:
        self.limits = limits
        self.observe = observe
        self.inflight = 0
        self.log = Logger().child("http")
        self.access = Logger().child("http.access") if access_log else None
        # A head at its limits must fit, or it would wait for room that never comes.
        self.read_ahead_bytes = max(
            limits.max_read_ahead_bytes,
            limits.max_request_line_bytes + limits.max_header_bytes + 4,
        )
        # The transport reads into this and hands it straight to the connection
        # (`get_buffer` then `buffer_updated`, with nothing between them on the loop's
        # thread), so one buffer serves every connection of the server.
        self.read_buffer = bytearray(self.read_ahead_bytes)


class Cycle:
    """One request being answered by the app."""

    __slots__ = (
        "body",
        "delivered",
        "disconnected",
        "event",
        "method",
        "more_body",
        "response",
        "response_started",
        "scope",
        "started",
        "status",
    )

    def __init__(self, scope: dict[str, Any], more_body: bool) -> None:
        self.scope = scope
        self.method: str = scope["method"]
        self.body = bytearray()
        self.more_body = more_body
        self.delivered = False
        self.disconnected = False
        self.event = asyncio.Event()
        self.response_started = False
        self.status = 0
        self.response: list[tuple[bytes, bytes]] = []
        self.started = time.perf_counter()


def log_answer(access: Logger, cycle: Cycle, status: int, client: tuple[str, int] | None) -> None:
    scope = cycle.scope
    target = scope["raw_path"] + (b"?" + scope["query_string"] if scope["query_string"] else b"")
    logged = redact_target(target.decode("ascii", errors="replace"))
    access.info(
        "http_request",
        method=cycle.method,
        target=logged[:LOGGED_TARGET_CHARS],
        status=status,
        duration_ms=round((time.perf_counter() - cycle.started) * 1000, 3),
        client=f"{client[0]}:{client[1]}" if client else None,
    )


def reason(status: int) -> bytes:
    try:
        return http.HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""
