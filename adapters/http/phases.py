"""The phases of one HTTP connection: when it reads, its one timer, and how it refuses.

Theory of operation: `ConnectionPhases` is the part of `adapters.http.protocol.NereusProtocol`
that decides what happens at the edges of a request rather than inside it. A connection is
in one phase at a time (idle, head, body, app, linger, closed) with at most one timer armed
(`_arm`/`_disarm`): idle waits `keep_alive_timeout_s` (and drops a client that takes none of
its answers), head `header_timeout_s` and body `body_timeout_s`, each expiring as a `408`.
`_flow` reads while the inbox has room and the client takes its answers. `_refuse` writes
a JSON error with a code from `contract.ERRORS` (unless half an answer is already out) and
closes lingering: the write side shut, the client's remaining input read and dropped for
`LINGER_S`, so the kernel does not reset the connection and discard the answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from uvicorn.server import ServerState

from nereus.adapters.config_file import HttpLimits
from nereus.adapters.http.contract import ERROR_STATUS
from nereus.adapters.http.cycle import Cycle, Shared, log_answer, reason
from nereus.adapters.http.errors import error_body
from nereus.adapters.http.head import Refusal
from nereus.adapters.http.inbox import Inbox

# How long a refused connection's remaining input is read and dropped before closing.
LINGER_S = 1.0


class ConnectionPhases(asyncio.BufferedProtocol):
    """The phases, the timer, flow control and refusals of a connection (see the module);
    the protocol sets the state declared here."""

    SHARED: Shared
    limits: HttpLimits
    loop: asyncio.AbstractEventLoop
    state: ServerState
    transport: asyncio.Transport | None
    client: tuple[str, int] | None
    phase: str
    inbox: Inbox
    write_paused: bool
    unsent_bytes: int
    timer: asyncio.TimerHandle | None
    cycle: Cycle | None

    def _flow(self) -> None:
        """Read while there is room for input and the client takes its answers; a lingering
        connection reads (and drops) everything."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        wanted = self.phase == "linger" or (not self.write_paused and self.inbox.room() > 0)
        if wanted and not transport.is_reading():
            transport.resume_reading()
        elif not wanted and transport.is_reading():
            transport.pause_reading()

    def _answered(self, cycle: Cycle, status: int) -> None:
        if self.SHARED.access is not None:
            log_answer(self.SHARED.access, cycle, status, self.client)

    # Refusals and timers ------------------------------------------------------------------

    def _refuse(self, refusal: Refusal) -> None:
        """Answer with a JSON error (when no answer was started) and close lingering."""
        transport = self.transport
        cycle = self.cycle
        if transport is None or transport.is_closing() or self.phase == "linger":
            return
        if cycle is not None and cycle.response_started:
            transport.close()  # half an answer is written: nothing honest can follow
            return
        status = ERROR_STATUS[refusal.code]
        body = error_body(refusal.code, str(refusal))
        lines = [f"HTTP/1.1 {status} {reason(status).decode()}"]
        lines += [f"{k.decode()}: {v.decode()}" for k, v in self.state.default_headers]
        lines += [
            "content-type: application/json",
            f"content-length: {len(body)}",
            "connection: close",
        ]
        lines += [f"{name}: {value}" for name, value in refusal.headers]
        transport.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        started = cycle.started if cycle is not None else time.perf_counter()
        self.SHARED.observe("other", status, started)
        if cycle is not None:
            cycle.disconnected = True
            cycle.event.set()
            self._answered(cycle, status)
        elif self.SHARED.access is not None:
            self.SHARED.access.info("http_refused", status=status, code=refusal.code)
        self._linger()

    def _linger(self) -> None:
        transport = self.transport
        self.phase = "linger"
        self.cycle = None
        if transport is None or transport.is_closing():
            return
        self._flow()
        if not transport.can_write_eof():
            transport.close()
            return
        try:
            transport.write_eof()
        except OSError:
            # The peer already reset the connection: nothing is left to linger for.
            transport.close()
            return
        self._arm(LINGER_S, transport.close)

    def _arm(self, delay_s: float, callback: Callable[[], None]) -> None:
        self._disarm()
        self.timer = self.loop.call_later(delay_s, callback)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _idle_expired(self) -> None:
        self.timer = None
        transport = self.transport
        if transport is None or self.phase != "idle":
            return
        if not self.write_paused:
            transport.close()
            return
        unsent = transport.get_write_buffer_size()
        if unsent < self.unsent_bytes:
            # It is taking its answers, slowly: another period to take more.
            self.unsent_bytes = unsent
            self._arm(self.limits.keep_alive_timeout_s, self._idle_expired)
            return
        # It took none of its answers all this time. close() would hold them, and the
        # connection, until it does, which may be never.
        transport.abort()

    def _head_expired(self) -> None:
        self.timer = None
        if self.phase == "head":
            self._refuse(
                Refusal(
                    "request_timeout",
                    f"the request line and headers took longer than "
                    f"{self.limits.header_timeout_s} s",
                )
            )

    def _body_expired(self) -> None:
        self.timer = None
        if self.phase == "body":
            self._refuse(
                Refusal(
                    "request_timeout",
                    f"the declared body took longer than {self.limits.body_timeout_s} s",
                )
            )
