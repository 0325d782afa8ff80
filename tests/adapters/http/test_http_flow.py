"""The connection's flow control, driven without sockets (issue 31, item 1): whatever the
order of reads and of the transport's write-pressure signals, the connection never holds
more unread input than its bound, never reads while the client is not taking its answers,
never starts a request then, and in the end answers every pipelined request, in order.

`NereusProtocol` runs here on a transport that records what the protocol asks of it; the
test plays the event loop's part (a read happens only while reading is on, and brings no
more than `get_buffer` offered) and the transport's (`pause_writing`, `resume_writing`).
The same rules against the real server over real sockets: `test_http_backpressure`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from hypothesis import given
from hypothesis import strategies as st
from uvicorn.config import Config
from uvicorn.server import ServerState

from nereus.adapters.config_file import HttpLimits
from nereus.adapters.http.cycle import Shared
from nereus.adapters.http.protocol import NereusProtocol, protocol_class
from tests.support.strategies import props

# The smallest read-ahead the head limits allow: 1 KiB holds ~25 pipelined requests.
LIMITS = HttpLimits(max_request_line_bytes=256, max_header_bytes=512, max_read_ahead_bytes=1024)
READ_AHEAD_BYTES = 1024


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.reading = True
        self.closing = False
        self.out = bytearray()

    def is_reading(self) -> bool:
        return self.reading

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def write(self, data: Any) -> None:
        self.out += data

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name in ("peername", "sockname") else default

    def get_write_buffer_size(self) -> int:
        return len(self.out)

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.closing = True

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True


async def _echo_path(scope: Any, receive: Any, send: Any) -> None:
    """Answers with the request's path, after reading its body."""
    while (await receive()).get("more_body"):
        pass
    body = scope["raw_path"]
    headers = [(b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _connection(paused: list[bool]) -> tuple[NereusProtocol, _Transport, list[bool]]:
    """A connection, its transport, and for each request it started whether the transport
    had said (`paused[0]`, kept by the test) that writing was paused at that moment."""
    started: list[bool] = []
    base: Any = protocol_class(Shared(LIMITS, lambda *_: None, access_log=False))

    class Recording(base):  # type: ignore[misc]
        def _start(self, event: h11.Request) -> None:
            started.append(paused[0])
            super()._start(event)

    config = Config(_echo_path, lifespan="off", interface="asgi3", log_config=None)
    proto: NereusProtocol = Recording(config, ServerState(), {})
    transport = _Transport()
    proto.connection_made(transport)
    return proto, transport, started


def _requests(n: int) -> tuple[bytes, list[bytes]]:
    paths = [b"/r%d" % i for i in range(n)]
    stream = b"".join(
        (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc" % p)
        if i % 3 == 0
        else (b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % p)
        for i, p in enumerate(paths)
    )
    return stream, paths


def _answers(out: bytes) -> list[bytes]:
    """The bodies of the 200 answers written, in the order written."""
    bodies: list[bytes] = []
    at = 0
    while at < len(out):
        end = out.index(b"\r\n\r\n", at)
        lines = out[at:end].split(b"\r\n")
        assert lines[0].startswith(b"HTTP/1.1 200 "), lines[0]
        (length,) = [
            int(x.split(b":")[1]) for x in lines if x.lower().startswith(b"content-length:")
        ]
        bodies.append(out[end + 4 : end + 4 + length])
        at = end + 4 + length
    return bodies


_action = st.one_of(
    st.tuples(st.just("read"), st.integers(1, 700)),
    st.tuples(st.just("pause"), st.just(0)),
    st.tuples(st.just("resume"), st.just(0)),
    st.tuples(st.just("run"), st.integers(1, 5)),
)


@props(150)
@given(st.integers(1, 60), st.lists(_action, max_size=60))
def test_input_stays_bounded_and_every_request_is_answered_in_order(
    n: int, actions: list[tuple[str, int]]
) -> None:
    asyncio.run(_play(n, actions))


async def _play(n: int, actions: list[tuple[str, int]]) -> None:
    stream, paths = _requests(n)
    paused = [False]  # what the transport last told the protocol
    proto, transport, started = _connection(paused)
    sent = 0

    def read(count: int) -> None:
        nonlocal sent
        if not transport.reading or sent == len(stream):
            return  # the event loop reads only while reading is on
        buffer = proto.get_buffer(-1)
        assert len(buffer) > 0, "asked to read with no room"
        count = min(count, len(buffer), len(stream) - sent)
        buffer[:count] = stream[sent : sent + count]
        sent += count
        proto.buffer_updated(count)

    for kind, arg in actions:
        if kind == "read":
            read(arg)
        elif kind == "pause" and not paused[0]:
            paused[0] = True
            proto.pause_writing()
        elif kind == "resume" and paused[0]:
            paused[0] = False
            proto.resume_writing()
        else:
            for _ in range(arg):
                await asyncio.sleep(0)
        assert len(proto.inbox) <= READ_AHEAD_BYTES
        if paused[0]:
            assert not transport.reading, "reading while the answers are not taken"
        assert not any(started), "a request started while the answers were not taken"
    if paused[0]:
        paused[0] = False
        proto.resume_writing()
    for _ in range(100 * n):  # the rest of the stream, read as the loop would
        read(len(stream))
        await asyncio.sleep(0)
        if sent == len(stream) and len(started) == n and proto.cycle is None:
            break
    assert not transport.closing, transport.out[-300:]
    assert _answers(bytes(transport.out)) == paths
