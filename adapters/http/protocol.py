"""One HTTP/1.1 connection: h11 parses, this protocol bounds, and the ASGI app answers.

uvicorn runs the server (the listening socket and its backlog, the event loop, graceful
shutdown) and accepts any `asyncio.Protocol` class as its HTTP implementation; this is ours.
uvicorn 0.54's own h11 protocol, serving this same ASGI app, was measured against the hostile
inputs of issue 16 first: a partial head, a declared body that never arrives and a connection
that sends nothing were all still open with no answer (it arms no deadline before a first
response); a request line or header of 70 KB and 200 headers were served 200 (h11 bounds a
head only while it is incomplete, and one read brought it whole); HTTP/2.0 was served 200 as
HTTP/1.x; `GARBAGE`, HTTP/1.1.1, `Content-Length: 1_08` and a raw byte in the target all got
the same `text/plain` 400 (the cause is gone before the answer is written); two identical
Content-Length headers were merged by h11 and passed on; and its connection limit answers a
plain-text 503. Closing those gaps in a subclass would mean copying its event loop, so the
connection is driven here, on h11 directly (the sans-IO parser), and every answer the server
can still write is JSON with a code from `contract.ERRORS`. httptools was not needed: the
durable commit, not parsing, bounds the request rate.

Theory of operation, per connection, one phase at a time with one timer:

* **idle**: no byte of a request yet, or the next request's bytes wait while the client
  does not take its answers. After `keep_alive_timeout_s` the connection is closed (there
  is no request being answered).
* **head**: the first byte arrived; the request line and headers must be complete within
  `header_timeout_s` (else `408 request_timeout`). The head is bounded while it arrives:
  a request line longer than `max_request_line_bytes` is `414`, a header block over
  `max_header_bytes` or with more than `max_headers` lines is `431`.
* **checks** on the complete head (`adapters.http.head`), in order: HTTP/1.0 or 1.1
  (else `505`); no obsolete line folding (a header line that starts with a space or tab
  is `400`: h11 would join it to the line before); Content-Length exactly one run of
  digits, given once (h11 refuses signs, underscores and conflicting values; a repeated or
  comma-listed one is refused there: a proxy that reads another value would smuggle a
  request past it); no Transfer-Encoding (bodies need a length); the declared length at
  most `max_body_bytes` (`413`, before a byte of the body is read); a free slot for the
  connection and the request (`503 server_busy` with `Retry-After`).
* **body**: the declared body must arrive within `body_timeout_s` (else `408`). The app
  task starts at once and awaits the body through ASGI `receive`.
* The app's response is written in one `write`; then the connection goes back to idle, or
  is closed if either side asked for that. A refusal is always followed by a lingering
  close: our answer is written, the write side shut, and whatever the client still sends is
  read and dropped for a moment, so the kernel does not reset the connection (and discard
  the answer) because of unread input.

Backpressure: the socket's bytes are read into the connection's `Inbox`, never more than
`max_read_ahead_bytes` of them (the transport reads into a buffer no larger than the room
left, so not even one read overshoots), and h11 is given one request at a time from it.
Reading pauses while the inbox is full, and while the transport's write buffer is above its
high-water mark (`pause_writing`): a client that does not take its answers gets no new
request started and none of its input read until it does. A pipelining client therefore
holds one request being answered, the inbox and about one transport buffer of answers; one
that takes none of them for `keep_alive_timeout_s` (after its last answer, or since it last
took some) is dropped: a close would wait, holding them, for it to take them first.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.config import Config
from uvicorn.server import ServerState

from nereus.adapters.http.cycle import Cycle, Shared, reason
from nereus.adapters.http.head import Refusal, check_head, classify, size_refusal
from nereus.adapters.http.inbox import Inbox
from nereus.adapters.http.phases import ConnectionPhases


def protocol_class(shared: Shared) -> type[asyncio.BufferedProtocol]:
    """The protocol class uvicorn instantiates per connection (`Config(http=...)`)."""

    class BoundProtocol(NereusProtocol):
        SHARED = shared

    return BoundProtocol


class NereusProtocol(ConnectionPhases):
    SHARED: Shared

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        if not config.loaded:
            config.load()
        self.app = config.loaded_app
        self.loop = _loop or asyncio.get_event_loop()
        self.state = server_state
        self.limits = self.SHARED.limits
        limits = self.limits
        # h11's own bound on a buffered head: our limits plus the line ends between them.
        self.conn = h11.Connection(
            h11.SERVER,
            max_incomplete_event_size=limits.max_request_line_bytes + limits.max_header_bytes + 4,
        )
        self.transport: asyncio.Transport | None = None
        self.client: tuple[str, int] | None = None
        self.server: tuple[str, int] | None = None
        self.phase = "idle"
        self.inbox = Inbox(self.SHARED.read_ahead_bytes)
        self.head = b""  # the head of the request being handled, as it came
        self.body_left = 0  # bytes of its declared body not yet given to h11
        self.write_paused = False
        self.unsent_bytes = 0  # answers not yet written when writing paused, or last seen
        self.timer: asyncio.TimerHandle | None = None
        self.cycle: Cycle | None = None
        self.keep_alive = True
        self.over_capacity = False

    # Connection events --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.state.connections.add(self)  # type: ignore[arg-type]
        self.over_capacity = len(self.state.connections) > self.limits.max_connections
        peer = transport.get_extra_info("peername")
        self.client = (str(peer[0]), int(peer[1])) if isinstance(peer, tuple) else None
        sock = transport.get_extra_info("sockname")
        self.server = (str(sock[0]), int(sock[1])) if isinstance(sock, tuple) else None
        self._arm(self.limits.keep_alive_timeout_s, self._idle_expired)

    def connection_lost(self, exc: Exception | None) -> None:
        self.state.connections.discard(self)
        self._disarm()
        self.phase = "closed"
        cycle = self.cycle
        if cycle is not None and not cycle.disconnected:
            cycle.disconnected = True
            cycle.event.set()

    def eof_received(self) -> bool:
        # The client shut its write side. A request being answered still gets its answer;
        # otherwise nothing more can come, and the connection is closed.
        if self.cycle is not None and self.phase in ("app", "body"):
            self.keep_alive = False
            return True
        return False

    def get_buffer(self, sizehint: int) -> memoryview:
        buffer = memoryview(self.SHARED.read_buffer)
        if self.phase in ("linger", "closed"):
            return buffer  # read and dropped
        # Reading is paused whenever the inbox is full, so there is room here.
        return buffer[: self.inbox.room()]

    def buffer_updated(self, nbytes: int) -> None:
        if self.phase in ("linger", "closed"):
            return  # a refused connection's remaining input: read and dropped
        self.inbox.append(memoryview(self.SHARED.read_buffer)[:nbytes])
        self._pump()
        self._flow()

    def pause_writing(self) -> None:
        # The client is not taking its answers as fast as they come: start no new request
        # and read nothing more until the transport has written most of them.
        self.write_paused = True
        if self.transport is not None:
            self.unsent_bytes = self.transport.get_write_buffer_size()
        self._flow()

    def resume_writing(self) -> None:
        self.write_paused = False
        self._pump()
        self._flow()

    def shutdown(self) -> None:
        """uvicorn's graceful shutdown: close when idle, else after the current answer."""
        self.keep_alive = False
        if self.cycle is None and self.transport is not None:
            self.transport.close()

    # Input --------------------------------------------------------------------------------

    def _pump(self) -> None:
        """Give h11 what the current phase takes from the inbox: a whole head, then the
        declared body; nothing while a request is being answered, and no new request while
        the client is not taking its answers. Called on input, after each answer and when
        writing resumes."""
        if self.phase == "idle":
            if not self.inbox or self.write_paused:
                return
            self.phase = "head"
            self._arm(self.limits.header_timeout_s, self._head_expired)
        if self.phase == "head":
            self._feed_head()
        if self.phase == "body":
            self._feed_body()

    def _feed_head(self) -> None:
        end = self.inbox.head_end()
        if end < 0:
            # Sizes first: an incomplete head over its limits will not get better.
            refusal = size_refusal(self.inbox.peek(), self.limits)
            if refusal is not None:
                self._refuse(refusal)
            elif self.inbox.starts_with_a_control():
                self.head = self.inbox.take(len(self.inbox))
                self.conn.receive_data(self.head)
                self._drive()  # h11 refuses it at once, and names the fault
                self._framed()
            return
        self.head = self.inbox.take(end)
        # Sizes before h11: it parses a complete head of any size, and would report some
        # other fault of an oversized one (a missing Host) instead of its size.
        refusal = size_refusal(self.head, self.limits)
        if refusal is not None:
            self._refuse(refusal)
            return
        self.conn.receive_data(self.head)
        self._drive()
        self._framed()

    def _framed(self) -> None:
        # h11 was handed a whole head (or bytes it refuses at once): were it still waiting
        # for more, it would take the start of the next request as the rest of this one.
        assert self.phase != "head", "h11 and the inbox disagree where a head ends"

    def _feed_body(self) -> None:
        count = min(self.body_left, len(self.inbox))
        if count:
            self.body_left -= count
            self.conn.receive_data(self.inbox.take(count))
            self._drive()

    def _drive(self) -> None:
        while self.phase in ("head", "body"):
            try:
                event = self.conn.next_event()
            except h11.RemoteProtocolError as exc:
                self._refuse(classify(exc, self.head, self.limits))
                return
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Request):
                try:
                    self._start(event)
                except Refusal as refusal:
                    self._refuse(refusal)
                    return
            elif isinstance(event, h11.Data):
                if self.cycle is not None:
                    self.cycle.body += event.data
                    self.cycle.event.set()
            elif isinstance(event, h11.EndOfMessage):
                self._disarm()
                if self.cycle is not None:
                    self.cycle.more_body = False
                    self.cycle.event.set()
                self.phase = "app"
                return

    def _start(self, event: h11.Request) -> None:
        self._disarm()
        length = check_head(event, self.head, self.limits)
        shared = self.SHARED
        if self.over_capacity or shared.inflight >= self.limits.max_inflight:
            raise Refusal(
                "server_busy",
                "the server is at its connection or request limit: retry shortly",
                (("Retry-After", "1"),),
            )
        target = event.target
        raw_path, _, query = target.partition(b"?")
        scope: dict[str, Any] = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": event.http_version.decode("ascii"),
            "server": self.server,
            "client": self.client,
            "scheme": "http",
            "method": event.method.decode("ascii"),
            "root_path": "",
            # The path as ASGI wants it (decoded) is not used by the app, which matches the
            # raw path and decodes each parameter strictly; the raw one is kept for that.
            "path": raw_path.decode("ascii"),
            "raw_path": raw_path,
            "query_string": query,
            "headers": [(name, value) for name, value in event.headers],
        }
        cycle = Cycle(scope, more_body=length > 0)
        self.cycle = cycle
        shared.inflight += 1
        # Until h11's EndOfMessage (at once for a request without a body) the connection
        # reads the body; only a declared body can be late.
        self.phase = "body"
        self.body_left = length
        if length > 0:
            self._arm(self.limits.body_timeout_s, self._body_expired)
        task = self.loop.create_task(self._run(cycle))
        self.state.tasks.add(task)
        task.add_done_callback(self.state.tasks.discard)

    # The app ------------------------------------------------------------------------------

    async def _run(self, cycle: Cycle) -> None:
        try:
            await self.app(
                cycle.scope, lambda: self._receive(cycle), lambda m: self._send(cycle, m)
            )
        except Exception as exc:
            self.SHARED.log.error("http_app_failed", error=repr(exc))
            if self.cycle is cycle and not cycle.response_started and not cycle.disconnected:
                self._refuse(Refusal("internal_error", "internal error (logged)"))
        finally:
            self.SHARED.inflight -= 1

    async def _receive(self, cycle: Cycle) -> dict[str, Any]:
        if self.conn.they_are_waiting_for_100_continue and self.transport is not None:
            self.transport.write(
                self.conn.send(h11.InformationalResponse(status_code=100, headers=[]))
            )
        while not cycle.disconnected and cycle.more_body and not cycle.body:
            cycle.event.clear()
            await cycle.event.wait()
        if cycle.disconnected or (cycle.delivered and not cycle.more_body):
            # After the whole body, ASGI's receive waits for the disconnect.
            while not cycle.disconnected:
                cycle.event.clear()
                await cycle.event.wait()
            return {"type": "http.disconnect"}
        chunk = bytes(cycle.body)
        cycle.body.clear()
        cycle.delivered = not cycle.more_body
        return {"type": "http.request", "body": chunk, "more_body": cycle.more_body}

    async def _send(self, cycle: Cycle, message: dict[str, Any]) -> None:
        if cycle.disconnected or self.transport is None or self.cycle is not cycle:
            return
        if message["type"] == "http.response.start":
            cycle.response_started = True
            cycle.status = int(message["status"])
            cycle.response = list(message.get("headers", []))
            return
        if message["type"] != "http.response.body" or not cycle.response_started:
            raise RuntimeError(f"unexpected ASGI message {message['type']!r}")
        if message.get("more_body", False):
            raise RuntimeError("this server writes whole responses only")
        body = b"" if cycle.method == "HEAD" else bytes(message.get("body", b""))
        headers = [*self.state.default_headers, *cycle.response]
        if not self.keep_alive:
            headers.append((b"connection", b"close"))
        phrase = reason(cycle.status)
        out = self.conn.send(h11.Response(status_code=cycle.status, headers=headers, reason=phrase))
        if body:
            out += self.conn.send(h11.Data(data=body))
        out += self.conn.send(h11.EndOfMessage())
        self.transport.write(out)
        self._answered(cycle, cycle.status)
        self._next_cycle()

    def _next_cycle(self) -> None:
        self.cycle = None
        if self.transport is None:
            return
        if (
            not self.keep_alive
            or self.conn.our_state is not h11.DONE
            or self.conn.their_state is not h11.DONE
        ):
            # Either side asked to close, or the app answered before reading the body.
            self._linger()
            return
        # h11 holds nothing of a next request (it is given one at a time): the next one, if
        # it came, waits in the inbox.
        self.conn.start_next_cycle()
        self.phase = "idle"
        self._arm(self.limits.keep_alive_timeout_s, self._idle_expired)
        self._pump()
        self._flow()
