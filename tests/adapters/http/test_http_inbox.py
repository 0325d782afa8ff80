"""The connection's inbox (`adapters.http.inbox`), without sockets: it never holds more than
its capacity, it cuts a pipelined stream into exactly the requests that were sent, in order,
however the stream is split into reads, and it ends a head exactly where h11 does, so h11 is
never handed part of a next request (issue 31, item 1).

The real server under pipelining floods and pipelining readers is `test_http_backpressure`.
"""

from __future__ import annotations

import h11
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nereus.adapters.http.inbox import Inbox
from tests.support.strategies import props

CAPACITY_BYTES = 4096

_token = st.text("abcdefghijklmnopqrstuvwxyz-0123456789", min_size=1, max_size=12)
_value = st.text("abcdefghijklmnopqrstuvwxyz ,;=/0123456789", max_size=24).map(str.strip)


@st.composite
def _request(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """One request, as its head and its body: a request line, a few headers (a line end
    of CRLF or a bare LF, as h11 takes both), and a body declared by Content-Length."""
    eol = draw(st.sampled_from([b"\r\n", b"\n"]))
    method = draw(st.sampled_from([b"GET", b"POST", b"DELETE", b"PUT"]))
    path = b"/" + draw(_token).encode()
    lines = [method + b" " + path + b" HTTP/1.1", b"Host: x"]
    for name, value in draw(st.lists(st.tuples(_token, _value), max_size=4)):
        if name.lower() not in ("content-length", "transfer-encoding", "host"):
            lines.append(f"{name}: {value}".encode())
    body = draw(st.binary(max_size=200))
    if body or draw(st.booleans()):
        lines.append(b"Content-Length: %d" % len(body))
    return eol.join(lines) + eol + eol, body


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    return [piece for piece in pieces if piece]  # a read brings at least one byte


@props(200)
@given(st.lists(_request(), min_size=1, max_size=12), st.lists(st.integers(0, 10**6)))
def test_a_pipelined_stream_is_cut_into_the_requests_sent_in_order(
    requests: list[tuple[bytes, bytes]], cuts: list[int]
) -> None:
    stream = b"".join(head + body for head, body in requests)
    inbox = Inbox(CAPACITY_BYTES)
    reads = _cut(stream, cuts)
    taken: list[tuple[bytes, bytes]] = []
    head: bytes | None = None
    body = b""
    declared = 0
    while reads or inbox:
        if reads:  # a read never brings more than the room left (`get_buffer`)
            room = inbox.room()
            inbox.append(reads[0][:room])
            reads[0] = reads[0][room:]
            if not reads[0]:
                reads.pop(0)
        if head is None:
            end = inbox.head_end()
            if end < 0:
                assert reads, f"a head never ended: {inbox.peek()!r}"
                continue
            head = inbox.take(end)
            # The length the request declared, read back with h11 (the parser that will
            # frame its body), never with the code under test.
            conn = h11.Connection(h11.SERVER)
            conn.receive_data(head)
            event = conn.next_event()
            assert isinstance(event, h11.Request), event
            lengths = [int(v) for n, v in event.headers if n == b"content-length"]
            declared = lengths[0] if lengths else 0
        want = declared - len(body)
        body += inbox.take(min(want, len(inbox)))
        if len(body) == declared:
            taken.append((head, body))
            head, body = None, b""
    assert taken == requests


_piece = st.sampled_from(
    [b"\r", b"\n", b"\r\n", b" ", b"\t", b":", b"a", b"GET / HTTP/1.1", b"Host: x", b"\x16", b"0"]
)


@props(300)
@given(
    st.lists(_piece, max_size=16).map(b"".join),
    st.sampled_from([b"", b"GET /next HTTP/1.1\r\nHost: y\r\n\r\n", b"\n\n"]),
)
def test_a_head_ends_exactly_where_h11_ends_it(start: bytes, following: bytes) -> None:
    """Bytes of any shape, h11 as the judge: h11 reading the whole stream takes a request
    exactly as long as the head the inbox frames, or refuses the stream; and given just that
    head, it answers the same."""
    data = start + b"\r\n\r\n" + following
    inbox = Inbox(CAPACITY_BYTES)
    inbox.append(data)
    end = inbox.head_end()
    assert 0 < end <= len(data)
    whole = _first_event(data)
    framed = _first_event(data[:end])
    if whole is None:
        assert framed is None, "h11 refuses the stream but takes the framed head"
        return
    assert isinstance(whole[0], h11.Request), whole
    assert whole[1] == data[end:], "h11's head and the inbox's end differently"
    assert framed is not None and framed[0] == whole[0] and framed[1] == b""


def _first_event(data: bytes) -> tuple[object, bytes] | None:
    """h11's first event for `data` and what it left unread; None when it refuses."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(data)
    try:
        event = conn.next_event()
    except h11.RemoteProtocolError:
        return None
    return event, conn.trailing_data[0]


@props(200)
@given(st.lists(st.binary(min_size=1, max_size=3000), max_size=20), st.data())
def test_the_inbox_never_holds_more_than_its_capacity(
    chunks: list[bytes], data: st.DataObject
) -> None:
    inbox = Inbox(CAPACITY_BYTES)
    for chunk in chunks:
        if len(chunk) > inbox.room():
            with pytest.raises(OverflowError):
                inbox.append(chunk)
        else:
            inbox.append(chunk)
        assert len(inbox) <= CAPACITY_BYTES
        assert inbox.room() == CAPACITY_BYTES - len(inbox)
        if inbox and data.draw(st.booleans()):
            inbox.take(data.draw(st.integers(1, len(inbox))))


def test_a_head_that_trickles_in_is_found_once_complete() -> None:
    inbox = Inbox(CAPACITY_BYTES)
    head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: 1\r\n\r\n"
    for i in range(len(head) - 1):
        inbox.append(head[i : i + 1])
        assert inbox.head_end() == -1, head[: i + 1]
    inbox.append(head[-1:])
    assert inbox.head_end() == len(head)
    assert inbox.take(len(head)) == head and len(inbox) == 0
