"""`HttpServer`: the timer API's ASGI app on uvicorn, in a thread with its own event loop.

    server = HttpServer(TimerApi(nereus.service), "127.0.0.1", 0)   # binds now: errors surface here
    server.start()                                          # serving when this returns
    ... server.port ...
    server.stop()                                           # graceful: answers in flight

Theory of operation: the socket is bound by the constructor (so a busy port is an `OSError`
in the caller, and port 0 is known at once) and handed to uvicorn, which listens with the
configured backlog and runs the connections on one event loop in a thread of its own. Each
connection is `adapters.http.protocol.NereusProtocol` over h11; requests wait for their
durable commit as awaitables, so the number of threads does not grow with connections.
uvicorn installs no logging configuration of its own (`log_config=None`): its records go to
the `uvicorn` loggers and from there wherever the process routes them (JSON lines in the
service).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
import time

import uvicorn

from nereus.adapters.config_file import HttpLimits
from nereus.adapters.http.api import TimerApi
from nereus.adapters.http.asgi import TimerAsgiApp
from nereus.adapters.http.cycle import Shared
from nereus.adapters.http.protocol import protocol_class

START_TIMEOUT_S = 10.0


def bind_socket(host: str, port: int) -> socket.socket:
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:  # a name: resolve it the way a client would
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


class HttpServer:
    def __init__(
        self,
        api: TimerApi,
        host: str,
        port: int,
        *,
        limits: HttpLimits | None = None,
        access_log: bool = False,
        sock: socket.socket | None = None,
    ) -> None:
        """`sock`: a socket already bound (and maybe listening), such as the one a
        supervisor's processes share, instead of binding `host`:`port`."""
        self.api = api
        self.limits = limits or api.tenancy.server
        self.sock = bind_socket(host, port) if sock is None else sock
        self.shared = shared = Shared(self.limits, api.observe, access_log)
        config = uvicorn.Config(
            TimerAsgiApp(api),
            # uvicorn hands the class to `loop.create_server`, which takes any protocol;
            # its annotation names only `asyncio.Protocol`, not the buffered kind ours is.
            http=protocol_class(shared),  # type: ignore[arg-type]
            ws="none",
            lifespan="off",
            interface="asgi3",
            loop="asyncio",
            log_config=None,
            access_log=False,
            proxy_headers=False,
            server_header=False,
            backlog=self.limits.backlog,
            timeout_graceful_shutdown=5,
        )
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None
        self._failed: BaseException | None = None

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    def start(self) -> None:
        self._thread = threading.Thread(target=self._serve, name="nereus-http", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if self._failed is not None or not self._thread.is_alive():
                raise RuntimeError(f"the HTTP server did not start: {self._failed!r}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the HTTP server did not start in {START_TIMEOUT_S} s")
            time.sleep(0.005)

    def _serve(self) -> None:
        try:
            asyncio.run(self.server.serve(sockets=[self.sock]))
        except BaseException as exc:  # reported by start(), or seen as a dead thread
            self._failed = exc

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
        self.sock.close()
        self.api.close()
