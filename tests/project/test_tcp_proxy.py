"""The test-controlled TCP proxy (`tests.support.tcp_proxy`) the Kafka partition test relies on.

What the partition test needs from it, each checked against a target of the test's own (an
echo server that records what reached it): while open, bytes go both ways intact, big
transfers included; a black hole stops both directions at once without closing anything
(the peer hears neither data, nor EOF, nor a reset; new connections get no service) and the
heal delivers what was held, in order; a reset cut closes every connection with a reset and
resets new ones until the heal. And, for any stream and any moment of a black hole and its
heal, the proxy never loses, repeats or reorders a byte (hypothesis).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.tcp_proxy import TcpProxy


class _Echo:
    """A target that sends every chunk it reads back `delay_s` later, and keeps all it read."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.server.getsockname()[1]
        self.received: list[bytearray] = []  # per connection, in accept order
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            got = bytearray()
            with self._lock:
                self.received.append(got)
            threading.Thread(target=self._echo, args=(conn, got), daemon=True).start()

    def _echo(self, conn: socket.socket, got: bytearray) -> None:
        with conn:
            while True:
                try:
                    data = conn.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                with self._lock:
                    got += data
                time.sleep(self.delay_s)
                try:
                    conn.sendall(data)
                except OSError:
                    return

    def got(self, index: int) -> bytes:
        with self._lock:
            return bytes(self.received[index]) if index < len(self.received) else b""

    def close(self) -> None:
        self.server.close()


@contextlib.contextmanager
def _proxied(delay_s: float = 0.0) -> Iterator[tuple[_Echo, TcpProxy]]:
    echo = _Echo(delay_s)
    proxy = TcpProxy().start(("127.0.0.1", echo.port))
    try:
        yield echo, proxy
    finally:
        proxy.close()
        echo.close()


def _connect(proxy: TcpProxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=5)


def _recv_exactly(sock: socket.socket, n: int, timeout_s: float = 10.0) -> bytes:
    sock.settimeout(timeout_s)
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        assert chunk, f"EOF after {len(out)} of {n} bytes"
        out += chunk
    return bytes(out)


def _wait_for(predicate: object, timeout_s: float = 5.0) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_an_open_proxy_forwards_both_ways_intact() -> None:
    with _proxied() as (echo, proxy), _connect(proxy) as client:
        client.sendall(b"hello")
        assert _recv_exactly(client, 5) == b"hello"
        # More than the proxy queues for one end: flow control, not loss or reordering.
        big = os.urandom(3 * 1024 * 1024 + 17)
        sender = threading.Thread(target=client.sendall, args=(big,))
        sender.start()
        assert _recv_exactly(client, len(big), timeout_s=30) == big
        sender.join(10)
        assert echo.got(0) == b"hello" + big
        assert proxy.accepted == 1 and proxy.forwarded_bytes == 2 * (5 + len(big))


def test_a_blackhole_holds_both_directions_without_closing_and_the_heal_delivers() -> None:
    # The target answers 0.3 s after it reads, so the cut falls between a request that got
    # through and its answer: the answer must be held too.
    with _proxied(delay_s=0.3) as (echo, proxy), _connect(proxy) as client:
        client.sendall(b"before")
        _wait_for(lambda: echo.got(0) == b"before")
        proxy.cut("blackhole")
        assert proxy.mode == "blackhole"
        client.sendall(b"during")
        client.settimeout(1.0)
        # Neither the answer, nor an EOF (b""), nor a reset: silence.
        with pytest.raises(TimeoutError):
            client.recv(100)
        assert echo.got(0) == b"before", "a byte crossed the cut towards the target"
        # A new connection is not served (it may sit in the listen backlog).
        late = socket.socket()
        late.settimeout(1.0)
        try:
            late.connect(("127.0.0.1", proxy.port))
            late.sendall(b"new")
            with pytest.raises(TimeoutError):
                late.recv(100)
            assert len(echo.received) == 1, "the target saw a connection made during the cut"
            proxy.heal()
            # What was held goes through, in order, on the same connection.
            assert _recv_exactly(client, 12) == b"beforeduring"
            assert echo.got(0) == b"beforeduring"
            assert _recv_exactly(late, 3) == b"new"
        finally:
            late.close()
        assert proxy.reset == 0


def test_a_reset_cut_closes_every_connection_and_refuses_new_ones_until_healed() -> None:
    with _proxied() as (echo, proxy):
        client = _connect(proxy)
        try:
            client.sendall(b"one")
            assert _recv_exactly(client, 3) == b"one"
            proxy.cut("reset")
            client.settimeout(5)
            with pytest.raises(ConnectionResetError):
                client.sendall(b"two")
                client.recv(100)
        finally:
            client.close()
        # A new connection is accepted and reset at once (the reset may even beat the
        # client's connect() back): it never reaches the target.
        with pytest.raises(ConnectionResetError), _connect(proxy) as refused:
            refused.settimeout(5)
            refused.sendall(b"x")
            refused.recv(100)
        assert len(echo.received) == 1
        assert proxy.reset >= 2
        proxy.heal()
        with _connect(proxy) as again:
            again.sendall(b"three")
            assert _recv_exactly(again, 5) == b"three"
        assert echo.got(len(echo.received) - 1) == b"three"


@settings(max_examples=int(os.environ.get("NEREUS_PROXY_EXAMPLES", "25")), deadline=None)
@given(
    chunks=st.lists(st.binary(min_size=1, max_size=200_000), min_size=1, max_size=6),
    cut_after=st.integers(min_value=0, max_value=6),
    held_s=st.sampled_from([0.0, 0.05, 0.3]),
)
def test_a_black_hole_and_its_heal_never_lose_repeat_or_reorder_a_byte(
    chunks: list[bytes], cut_after: int, held_s: float
) -> None:
    sent = b"".join(chunks)
    reached, cut_done = threading.Event(), threading.Event()
    with _proxied() as (echo, proxy), _connect(proxy) as client:

        def send() -> None:
            for i, chunk in enumerate(chunks):
                if i == cut_after:
                    reached.set()
                    cut_done.wait(10)
                client.sendall(chunk)  # may block on a full window while cut off
            reached.set()

        sender = threading.Thread(target=send)
        sender.start()
        assert reached.wait(30)
        proxy.cut("blackhole")
        cut_done.set()
        time.sleep(held_s)
        proxy.heal()
        assert _recv_exactly(client, len(sent), timeout_s=30) == sent
        sender.join(10)
        assert echo.got(0) == sent
