"""Shared by the HTTP tests: a configured service on loopback and a small urllib client.

`start_service` runs a real `HttpServer` over an embedded `Nereus` (LMDB in a temp dir) with
a tenancy built from a TOML-shaped dict, so every test goes through the same code path as
`nereus serve --config`. `Backend` wraps the embedded backend so a test can make the storage
full, the service unbooted or the intake full without mocking the kernel or storage.
"""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nereus.adapters.clock import SystemClock
from nereus.adapters.http.api import TimerApi
from nereus.adapters.http.server import HttpServer
from nereus.adapters.local.destination import LocalDestination, LocalRecord
from nereus.adapters.local.embedded import Nereus
from nereus.adapters.metering import RateLimiter
from nereus.adapters.tenancy import Tenancy, parse_tenancy
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.keys import DEFAULT_TENANT
from nereus.kernel.records import Appendable
from nereus.runtime.clock import ClockSource
from nereus.service.embedded import EmbeddedService

QUEUE = "reminders"
SECRET_QUEUE = "secrets"
KEY_B64 = base64.b64encode(bytes(range(32))).decode()
WAIT_S = 30.0

# token -> (tenant, subject, grants)
TOKENS: dict[str, tuple[str, str, list[str]]] = {
    "acme-all": ("acme", "acme-ops", ["produce", "read", "admin"]),
    "acme-producer": ("acme", "billing-service", ["produce"]),
    "acme-reader": ("acme", "dashboard", ["read"]),
    "acme-admin": ("acme", "acme-admin", ["admin"]),
    "acme-nothing": ("acme", "cleanup-job", []),
    "globex-all": ("globex", "globex-ops", ["produce", "read", "admin"]),
}


def config(**tenant_overrides: dict[str, Any]) -> dict[str, Any]:
    """A TOML-shaped config: tenants acme and globex with the tokens above (acme's listed by
    digest, globex's in clear), acme's `secrets` queue encrypted. `tenant_overrides` merges
    keys into a tenant's table (`acme={"max_live_timers": 2}`)."""
    tenants: dict[str, dict[str, Any]] = {
        "acme": {"queues": {SECRET_QUEUE: {"encryption_key": "k1"}}, "tokens": []},
        "globex": {"tokens": []},
    }
    for token, (tenant, subject, grants) in TOKENS.items():
        entry: dict[str, Any] = {"subject": subject, "grants": grants}
        if tenant == "acme":
            entry["token_sha256"] = hashlib.sha256(token.encode()).hexdigest()
        else:
            entry["token"] = token
        tenants[tenant]["tokens"].append(entry)
    for tenant, extra in tenant_overrides.items():
        tenants.setdefault(tenant, {"tokens": []}).update(extra)
    return {"keys": {"k1": KEY_B64}, "tenants": tenants}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def schedule(
    key: str, delay_ms: int = 60_000, payload: bytes = b"x", **extra: Any
) -> dict[str, Any]:
    return {
        "op": "schedule",
        "queue": extra.pop("queue", QUEUE),
        "timerKey": key,
        "delayMs": delay_ms,
        "payload": b64(payload),
        **extra,
    }


def cancel(key: str, queue: str = QUEUE, **extra: Any) -> dict[str, Any]:
    return {"op": "cancel", "queue": queue, "timerKey": key, **extra}


def reschedule(key: str, delay_ms: int, queue: str = QUEUE, **extra: Any) -> dict[str, Any]:
    return {"op": "reschedule", "queue": queue, "timerKey": key, "delayMs": delay_ms, **extra}


class Backend(EmbeddedService):
    """The embedded service with knobs for conditions that are hard to reach for real."""

    def __init__(self, nereus: Nereus) -> None:
        super().__init__(nereus.store, nereus.runtime, nereus.destination)
        self.map_fraction: float | None = None
        self.booted = True
        self.fail_execute: BaseException | None = None

    def map_usage(self) -> float:
        return super().map_usage() if self.map_fraction is None else self.map_fraction

    def health(self) -> tuple[bool, dict[str, Any]]:
        ok, doc = super().health()
        return ok and self.booted, {**doc, "ok": ok and self.booted}

    async def execute_async(
        self, items: Sequence[Appendable], timeout_s: float
    ) -> list[EntryOutcome]:
        if self.fail_execute is not None:
            raise self.fail_execute
        return await super().execute_async(items, timeout_s)

    async def cancel_async(
        self, items: Sequence[Appendable], may_append: Callable[[], bool], timeout_s: float
    ) -> list[EntryOutcome] | None:
        if self.fail_execute is not None:
            raise self.fail_execute
        return await super().cancel_async(items, may_append, timeout_s)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def doc(self) -> Any:
        return json.loads(self.body)

    @property
    def code(self) -> str | None:
        if self.status < 400 or not self.body.startswith(b"{"):
            return None
        code: str = self.doc["error"]["code"]
        return code


@dataclass
class Service:
    nereus: Nereus
    backend: Backend
    api: TimerApi
    server: HttpServer
    clock_s: list[float] = field(default_factory=lambda: [0.0])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    def raw(self, data: bytes, *, timeout_s: float = WAIT_S) -> Reply:
        return raw_request(self.server.port, data, timeout_s=timeout_s)

    @property
    def log_end(self) -> int:
        return self.nereus.store.log_last_position

    def call(
        self,
        method: str,
        path: str,
        doc: Any = None,
        *,
        token: str | None = "acme-all",
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        data = raw if raw is not None else (None if doc is None else json.dumps(doc).encode())
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if token is not None:
            req.add_header("Authorization", f"Bearer {token}")
        for name, value in (headers or {}).items():
            req.add_header(name, value)
        try:
            with urllib.request.urlopen(req, timeout=WAIT_S) as resp:
                return Reply(
                    resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
                )
        except urllib.error.HTTPError as err:
            return Reply(err.code, {k.lower(): v for k, v in err.headers.items()}, err.read())

    def post(self, *ops: dict[str, Any], token: str | None = "acme-all") -> list[dict[str, Any]]:
        reply = self.call("POST", "/api/v1/timers", {"operations": list(ops)}, token=token)
        assert reply.status == 200, (reply.status, reply.body[:300])
        results: list[dict[str, Any]] = reply.doc["results"]
        assert len(results) == len(ops)
        return results

    def delivered(self, queue: str = QUEUE, tenant: str | None = None) -> list[LocalRecord]:
        """What was delivered to a tenant's queue (default: the tenant of the default token,
        acme, or the default tenant of a service without a config)."""
        dest = self.nereus.destination
        assert isinstance(dest, LocalDestination)
        if tenant is None:
            tenant = DEFAULT_TENANT if self.api.tenancy.auth_disabled else "acme"
        return list(dest.iter_all(dest.topic_for(queue, tenant=tenant)))

    def wait_for(self, what: str, done: Callable[[], bool]) -> None:
        deadline = time.monotonic() + WAIT_S
        while not done():
            assert self.nereus.runtime.halted is None, self.nereus.runtime.halted
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.02)


def read_reply(sock: socket.socket) -> Reply:
    """One HTTP/1.1 response from a socket: the head, then Content-Length bytes (or up to
    the end of the stream when there is no length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a response head: {data[:200]!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = headers.get("content-length")
    while length is None or len(body) < int(length):
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return Reply(int(status_line.split(" ")[1]), headers, body)


def raw_request(port: int, data: bytes, *, timeout_s: float = WAIT_S) -> Reply:
    """Send `data` as it is on a new connection and read one response."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(data)
        return read_reply(sock)


def timer_path(key: str, queue: str = QUEUE) -> str:
    return f"/api/v1/timers/{urllib.parse.quote(queue, safe='')}/{urllib.parse.quote(key)}"


@contextmanager
def start_service(
    data: Path,
    doc: dict[str, Any] | None = None,
    *,
    clock: ClockSource | None = None,
    tenancy: Tenancy | None = None,
    destination: LocalDestination | None = None,
) -> Iterator[Service]:
    """`doc` None: the default tenancy (no config, no authentication). `destination`: a
    local destination of the test's own (one that fails on purpose), under `data`."""
    if tenancy is None and doc is not None:
        tenancy = parse_tenancy(doc, "test.toml")
    nereus = Nereus.open(
        str(data), clock=clock or SystemClock(assumed_error_ms=2), destination=destination
    )
    backend = Backend(nereus)
    clock_s = [1000.0]
    api = TimerApi(backend, tenancy=tenancy, rate_limiter=RateLimiter(lambda: clock_s[0]))
    server = HttpServer(api, "127.0.0.1", 0)
    nereus.start()
    server.start()
    try:
        yield Service(nereus, backend, api, server, clock_s)
    finally:
        server.stop()
        nereus.close()
