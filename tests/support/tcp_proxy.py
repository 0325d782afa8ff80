"""A TCP proxy a test controls: it forwards loopback connections to a target and can cut them.

Theory of operation: one thread runs a selector loop over a listening socket and, for every
connection it accepted, a pair of ends (the client's socket and the one it opened to the
target), each with the bytes waiting to be written to it. Forwarding is plain: what one end
reads is queued for the other, and reading stops while the other end's queue is full, so a
slow reader slows its writer as TCP would. Three modes:

* **open**: forward everything, both ways;
* **blackhole** (a network partition): accept nothing, read nothing, write nothing. Every
  socket stays open and what was queued stays queued, so each peer sees what a partition
  shows it: silence, neither a close nor a reset; once kernel buffers fill, TCP's own flow
  control stops the sender. A new connection waits in the listen backlog, unanswered. After
  the heal the queued bytes go through in order, as TCP's retransmissions would;
* **reset** (a firewall that rejects): every connection is closed with a reset, and each new
  one is reset as soon as it is accepted.

`cut()` and `heal()` return once the loop has applied the change (they wait for it), so the
moment a test records after `cut()` is a moment forwarding had already stopped. Nothing is
left behind: `close()` (or leaving the `with` block) closes every socket and joins the
thread.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Literal

Mode = Literal["open", "blackhole", "reset"]
_CHUNK_BYTES = 64 * 1024
# Bytes queued for one end before the proxy stops reading from its peer.
_QUEUE_LIMIT_BYTES = 1024 * 1024


@dataclass(eq=False)
class _End:
    sock: socket.socket
    out: bytearray = field(default_factory=bytearray)  # waiting to be written to `sock`
    peer: _End | None = None
    read_done: bool = False  # `sock` said EOF
    shut_pending: bool = False  # the peer said EOF: shut our write side once `out` is sent
    mask: int = 0  # what the selector watches now


class TcpProxy:
    """Listens on 127.0.0.1:`port` (0: a free one) and forwards to `target` once started."""

    def __init__(self, port: int = 0) -> None:
        self._listener = socket.create_server(("127.0.0.1", port), backlog=128)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self.target: tuple[str, int] | None = None
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._cond = threading.Condition()
        self._wanted: Mode = "open"
        self._mode: Mode = "open"
        self._closing = False
        self._ends: set[_End] = set()
        self._listening = False
        self._thread = threading.Thread(target=self._serve, name="tcp-proxy", daemon=True)
        # Counters for a test's report: connections accepted, and bytes forwarded each way.
        self.accepted = 0
        self.reset = 0  # connections closed with a reset by a cut (or refused during one)
        self.forwarded_bytes = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, target: tuple[str, int]) -> TcpProxy:
        self.target = target
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._thread.start()
        return self

    def cut(self, mode: Literal["blackhole", "reset"] = "blackhole") -> None:
        self._switch(mode)

    def heal(self) -> None:
        self._switch("open")

    @property
    def mode(self) -> Mode:
        with self._cond:
            return self._mode

    def close(self) -> None:
        with self._cond:
            self._closing = True
        self._wake()
        if self._thread.is_alive():
            self._thread.join(10)
        for end in list(self._ends):
            end.sock.close()
        self._ends.clear()
        self._listener.close()
        self._wake_r.close()
        self._wake_w.close()
        self._selector.close()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # The caller's side ---------------------------------------------------------------------

    def _switch(self, mode: Mode, timeout_s: float = 10.0) -> None:
        assert self._thread.is_alive(), "start() the proxy first"
        with self._cond:
            self._wanted = mode
        self._wake()
        with self._cond:
            # Done once applied, or once a later request replaced this one.
            if not self._cond.wait_for(
                lambda: self._mode == mode or self._wanted != mode, timeout_s
            ):
                raise TimeoutError(f"the proxy did not switch to {mode} in {timeout_s} s")

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    # The loop ------------------------------------------------------------------------------

    def _serve(self) -> None:
        while True:
            with self._cond:
                if self._closing:
                    return
                wanted = self._wanted
            if wanted != self._mode:
                self._apply(wanted)
            self._watch()
            for key, events in self._selector.select(timeout=0.5):
                sock = key.fileobj
                if sock is self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        self._wake_r.recv(4096)
                elif sock is self._listener:
                    self._accept()
                else:
                    self._pump(key.data, events)

    def _apply(self, mode: Mode) -> None:
        if mode == "reset":
            for end in list(self._ends):
                self._drop(end, reset=True)
        with self._cond:
            self._mode = mode
            self._cond.notify_all()

    def _watch(self) -> None:
        """Register exactly what the mode lets the loop do now."""
        listen = self._mode != "blackhole"
        if listen != self._listening:
            if listen:
                self._selector.register(self._listener, selectors.EVENT_READ)
            else:
                self._selector.unregister(self._listener)
            self._listening = listen
        for end in self._ends:
            mask = 0
            if self._mode == "open":
                peer = end.peer
                if not end.read_done and peer is not None and len(peer.out) < _QUEUE_LIMIT_BYTES:
                    mask |= selectors.EVENT_READ
                if end.out:
                    mask |= selectors.EVENT_WRITE
            if mask == end.mask:
                continue
            if end.mask == 0:
                self._selector.register(end.sock, mask, end)
            elif mask == 0:
                self._selector.unregister(end.sock)
            else:
                self._selector.modify(end.sock, mask, end)
            end.mask = mask

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except BlockingIOError:
                return
            self.accepted += 1
            if self._mode == "reset":
                self.reset += 1  # before the reset, which the client may see at once
                _reset(client)
                continue
            assert self.target is not None
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _reset(client)
                continue
            a, b = _End(client), _End(upstream)
            a.peer, b.peer = b, a
            for end in (a, b):
                end.sock.setblocking(False)
                end.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._ends.add(end)

    def _pump(self, end: _End, events: int) -> None:
        peer = end.peer
        if peer is None:
            return
        try:
            if events & selectors.EVENT_READ:
                data = end.sock.recv(_CHUNK_BYTES)
                if data:
                    peer.out += data
                    self.forwarded_bytes += len(data)
                else:
                    end.read_done = True
                    peer.shut_pending = True
            if events & selectors.EVENT_WRITE and end.out:
                sent = end.sock.send(end.out)
                del end.out[:sent]
            for side in (end, peer):
                if side.shut_pending and not side.out:
                    side.shut_pending = False
                    side.sock.shutdown(socket.SHUT_WR)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(end, reset=True)
            return
        if end.read_done and peer.read_done and not end.out and not peer.out:
            self._drop(end, reset=False)

    def _drop(self, end: _End, *, reset: bool) -> None:
        """Close a connection (both its ends)."""
        if end not in self._ends:
            return  # its pair was closed already
        if reset:
            self.reset += 1
        for side in (end, end.peer):
            if side is None or side not in self._ends:
                continue
            if side.mask:
                self._selector.unregister(side.sock)
            self._ends.discard(side)
            if reset:
                _reset(side.sock)
            else:
                side.sock.close()


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), not an orderly FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
