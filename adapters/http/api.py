"""The timer routes: a request is matched, authenticated, authorized, then handled.

    POST   /api/v1/timers                              produce  {"operations": [...]}
    DELETE /api/v1/timers/{queue}/{timerKey}[?txn=]    any valid credential of the tenant
    GET    /api/v1/timers/{queue}/{timerKey}           read     peek
    GET    /api/v1/timers/{queue}[?after=&limit=]      read     list live timers
    GET    /api/v1/admin/metering                      admin
    PUT    /api/v1/admin/block                         admin    {"blocked": bool}
    POST   /api/v1/dlq/{queue}/{timerKey}/replay       any      always 403 dlq_replay_refused
    GET    /healthz, /readyz, /metrics, /openapi.json  public

Theory of operation: a request is matched to a route once (`routing.match`: 404/405), then
authenticated (the bearer token decides the tenant, 401), authorized by the route's grant
(403 missing_grant), and only then is its input read. A batch is checked whole before
anything is appended (`batch.parse_batch`); then the tenant's rate and, for a batch that
would produce, the blocks, quota and storage (`policy`); a batch that passes the quota holds
what it may add to the usage until its commit is answered, so concurrent batches count each
other. A valid batch is appended as one unit and answered in request order once durable: the
handler awaits the commit, so a request waiting for its fsync holds no thread. Every record
carries the credential's tenant and subject; since message ids are derived from (tenant,
queue, timerKey), another tenant's timer is simply absent on every route.

A DELETE is never refused by a grant, block or quota, and a pending timer's never by a rate:
only by a missing credential or a service that is not booted (or the physical answers every
commit shares: 429 overloaded, 503 unavailable). One whose verdict would change nothing (a
key with no row, a finished timer) appends nothing in the embedded service: it is answered
from committed state by the kernel's own verdict (`runtime.absent`). A DELETE that appends
takes a token of its credential's bucket (`Policy.take_delete`); without one, the service
still appends a pending timer's cancel, and may refuse (429 rate_limited) only one it has
judged from committed state to cancel nothing (specs/http.md, "Rate limit"). A request's
content never causes a 5xx: `internal_error` is a bug, logged.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import msgspec

from nereus.adapters.http import routing
from nereus.adapters.http.auth import Authenticator, Unauthorized
from nereus.adapters.http.batch import identity_problem, json_field
from nereus.adapters.http.console import Console
from nereus.adapters.http.contract import LIST_DEFAULT_LIMIT, LIST_MAX_LIMIT, Route
from nereus.adapters.http.errors import JSON, ApiError, Response, error_response, json_response
from nereus.adapters.http.openapi import build_document
from nereus.adapters.http.policy import Policy
from nereus.adapters.http.process import ProcessMetrics
from nereus.adapters.http.routing import Request
from nereus.adapters.http.shapes import peek_json, row_json
from nereus.adapters.http.writes import Writes
from nereus.adapters.metering import Blocks, Meter, RateLimiter
from nereus.adapters.tenancy import Principal, Tenancy
from nereus.kernel.keys import DEFAULT_TENANT
from nereus.runtime.log import Logger
from nereus.service import readiness
from nereus.service.access import GRANTS
from nereus.service.errors import ShardNotLocal
from nereus.service.port import TimerService

T = TypeVar("T")
Handler = Callable[[Principal | None, "Request"], Awaitable[Response]]

REQUEST_SECONDS = "nereus_http_request_duration_seconds"
# Request durations: from a cached GET (~50 us) to a commit that waits out a slow fsync.
REQUEST_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)


class TimerApi:
    """Routes requests to the service (`service.port.TimerService`: `nereus.service`, or
    Kafka mode's `KafkaService`); independent of the server, so tests can call `respond`
    (async) or `handle` (sync) directly."""

    def __init__(
        self,
        service: TimerService,
        *,
        tenancy: Tenancy | None = None,
        commit_timeout_s: float = 30.0,
        rate_limiter: RateLimiter | None = None,
        logger: Logger | None = None,
    ) -> None:
        self.service = service
        self.tenancy = tenancy or Tenancy.open_default()
        self.kernel = self.service.kernel_config
        self.tenancy.check_kernel(self.kernel)
        self.limits = {
            name: self.tenancy.limits(name, self.kernel) for name in self.tenancy.tenants
        }
        self.auth = Authenticator(
            self.tenancy.credentials,
            disabled_as=Principal(DEFAULT_TENANT, None, frozenset(GRANTS))
            if self.tenancy.auth_disabled
            else None,
        )
        self.commit_timeout_s = commit_timeout_s
        self.meter = Meter(self.service.metrics, self.tenancy.tenants)
        self.blocks = Blocks()
        self.policy = Policy(self.tenancy, rate_limiter or RateLimiter(), self.blocks)
        self.log = (logger or Logger()).child("http")
        self.process = ProcessMetrics(self.service.metrics)
        # Under `serve --processes`: this process's metrics text -> the machine's (set by
        # `adapters.compose.processes.join_siblings`); None answers for this process alone.
        self.machine_metrics: Callable[[str], str] | None = None
        self.service.metrics.describe(
            REQUEST_SECONDS, "histogram", "HTTP request durations by route and status."
        )
        self._openapi_body = msgspec.json.encode(build_document(self.tenancy, self.kernel))
        self._inline_reads = service.inline_reads
        # Reads that may wait on a shard's lock (Kafka mode) run here, never on the loop.
        self._reads = ThreadPoolExecutor(max_workers=4, thread_name_prefix="nereus-http-read")
        self.writes = Writes(
            service,
            tenancy=self.tenancy,
            policy=self.policy,
            meter=self.meter,
            limits=self.limits,
            commit_timeout_s=commit_timeout_s,
            read=self._read,
        )
        self._handlers: dict[tuple[str, str], Handler] = {
            ("POST", "/api/v1/timers"): self.writes.post,
            ("DELETE", "/api/v1/timers/{queue}/{timerKey}"): self._delete,
            ("GET", "/api/v1/timers/{queue}/{timerKey}"): self._peek,
            ("GET", "/api/v1/timers/{queue}"): self._list,
            ("GET", "/api/v1/admin/metering"): self._metering,
            ("PUT", "/api/v1/admin/block"): self._block,
            ("POST", "/api/v1/dlq/{queue}/{timerKey}/replay"): self._dlq_replay,
            ("GET", "/healthz"): self._health,
            ("GET", "/readyz"): self._ready,
            ("GET", "/metrics"): self._metrics,
            ("GET", "/openapi.json"): self._openapi_doc,
        }
        self.console = Console(self)

    @property
    def max_body_bytes(self) -> int:
        return self.tenancy.server.max_body_bytes

    def close(self) -> None:
        self.console.close()
        self._reads.shutdown(wait=False)

    # Entry points -------------------------------------------------------------------------

    def handle(
        self, method: str, target: str, body: bytes, headers: Mapping[str, str] | None = None
    ) -> tuple[int, str, bytes]:
        """(status, content type, body), for a caller without an event loop."""
        path, _, query = target.partition("?")
        r = asyncio.run(self.respond(method, path, query, body, headers or {}))
        return r.status, r.content_type, r.body

    async def respond(
        self,
        method: str,
        raw_path: str,
        query: str,
        body: bytes,
        headers: Mapping[str, str],
    ) -> Response:
        """The answer to one request; `raw_path` still percent-encoded, header names lower
        case. Never raises: a refusal is an error response, a bug is internal_error."""
        started = time.perf_counter()
        if raw_path == "/console" or raw_path.startswith("/console/"):
            return await self._console(method, raw_path, query, body, headers, started=started)
        found: list[routing.Match] = []

        async def answer() -> Response:
            found.append(routing.match(method, raw_path))
            return await self._route(found[0], query, body, headers)

        response = await self._answered(answer, method, routing.label(method, raw_path))
        label = found[0].label if found else routing.label(method, raw_path)
        self.observe(label, response.status, started)
        return response

    async def _answered(
        self, answer: Callable[[], Awaitable[Response]], method: str, route: str
    ) -> Response:
        """`answer()`, or the error response of its refusal; a bug is logged and answered
        internal_error: a request's content never causes anything else."""
        try:
            return await answer()
        except ApiError as exc:
            return error_response(exc.code, str(exc), exc.headers)
        except Exception as exc:  # a bug: answer, log, never blame the request
            self.log.error(
                "http_internal_error",
                method=method,
                route=route,
                error=repr(exc),
                traceback=traceback.format_exc(),
            )
            return error_response("internal_error", "internal error (logged)")

    async def _console(
        self,
        method: str,
        raw_path: str,
        query: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        started: float,
    ) -> Response:
        """A console page (`adapters.http.console`), counted like any route."""
        labels = ["other"]

        async def answer() -> Response:
            labels[0], response = await self.console.respond(method, raw_path, query, body, headers)
            return response

        response = await self._answered(answer, method, "console")
        self.observe(labels[0], response.status, started)
        return response

    def observe(self, route: str, status: int, started: float) -> None:
        """Count one answered request (the server's own answers use the route "other")."""
        metrics = self.service.metrics
        labels = {"route": route, "status": str(status)}
        metrics.inc("nereus_http_requests_total", labels=labels)
        metrics.observe(REQUEST_SECONDS, time.perf_counter() - started, labels, REQUEST_BUCKETS_S)

    async def _route(
        self, found: routing.Match, query: str, body: bytes, headers: Mapping[str, str]
    ) -> Response:
        route = found.route
        who = None if route.needs == "public" else self._authorize(headers, route)
        handler = self._handlers[(route.method, route.path)]
        return await handler(who, Request(route.method, found.params, query, body, headers))

    def _authorize(self, headers: Mapping[str, str], route: Route) -> Principal:
        try:
            who = self.auth.authenticate(headers.get("authorization"))
        except Unauthorized as exc:
            raise ApiError(
                "unauthorized", str(exc), headers=(("WWW-Authenticate", 'Bearer realm="nereus"'),)
            ) from None
        if route.needs in GRANTS and route.needs not in who.grants:
            raise ApiError(
                "missing_grant", f"{route.method} {route.path} needs the {route.needs!r} grant"
            )
        return who

    async def _read(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """A read of the service: inline when it cannot block, else on the read threads."""
        try:
            if self._inline_reads:
                return fn(*args, **kwargs)
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._reads, lambda: fn(*args, **kwargs))
        except ShardNotLocal as exc:
            raise ApiError("shard_not_local", str(exc)) from exc

    def _check_path(self, who: Principal, queue: str, timer_key: str | None) -> None:
        problem = identity_problem(who.tenant, queue, timer_key or "k", self.kernel)
        if problem is not None:
            raise ApiError("invalid_path", problem)

    # Public -------------------------------------------------------------------------------

    async def _health(self, _who: Principal | None, _req: Request) -> Response:
        ok, doc = self.service.health()
        return json_response(200 if ok else 503, doc)

    async def _ready(self, _who: Principal | None, _req: Request) -> Response:
        status, doc = readiness.answer(self.service.readiness())
        return json_response(status, doc)

    async def _metrics(self, _who: Principal | None, _req: Request) -> Response:
        text = self.own_metrics()
        if self.machine_metrics is not None:
            # Asks the sibling processes over loopback: off the event loop.
            text = await self._read(self.machine_metrics, text)
        return Response(200, "text/plain; version=0.0.4", text.encode())

    def own_metrics(self) -> str:
        """This process's metrics alone, `process_*` read afresh."""
        self.process.refresh()
        return self.service.metrics.render()

    async def _openapi_doc(self, _who: Principal | None, _req: Request) -> Response:
        return Response(200, JSON, self._openapi_body)

    # Commands ----------------------------------------------------------------------------

    async def _delete(self, who: Principal | None, req: Request) -> Response:
        assert who is not None
        ok, _ = self.service.health()
        if not ok:
            raise ApiError("not_booted", "the service is not booted (see /healthz)")
        queue, timer_key = req.params["queue"], req.params["timerKey"]
        self._check_path(who, queue, timer_key)
        return await self.writes.delete(who, req, queue, timer_key)

    async def _dlq_replay(self, _who: Principal | None, _req: Request) -> Response:
        raise ApiError(
            "dlq_replay_refused",
            "a dead letter is not replayed: it never had a consumer group and its offset "
            "is not a position; schedule a new timer instead",
        )

    # Reads --------------------------------------------------------------------------------

    async def _peek(self, who: Principal | None, req: Request) -> Response:
        assert who is not None
        queue, timer_key = req.params["queue"], req.params["timerKey"]
        self._check_path(who, queue, timer_key)
        p = await self._read(self.service.peek, queue, timer_key, tenant=who.tenant)
        return json_response(200, peek_json(p))

    async def _list(self, who: Principal | None, req: Request) -> Response:
        assert who is not None
        queue = req.params["queue"]
        self._check_path(who, queue, None)
        query = routing.parse_query(req.query)
        after = query.get("after") or None
        limit = LIST_DEFAULT_LIMIT
        raw_limit = query.get("limit")
        if raw_limit is not None:
            try:
                limit = int(raw_limit.strip(), 10)
            except ValueError:
                raise ApiError("invalid_query", "limit must be an integer") from None
            limit = min(max(limit, 1), LIST_MAX_LIMIT)
        rows, truncated = await self._read(
            self.service.list_timers, queue, after, limit, tenant=who.tenant
        )
        return json_response(
            200,
            {
                "rows": [row_json(m) for m in rows],
                "truncated": truncated,
                "nextAfter": rows[-1].timer_key if truncated and rows else None,
            },
        )

    # Admin --------------------------------------------------------------------------------

    async def _metering(self, who: Principal | None, _req: Request) -> Response:
        assert who is not None
        return json_response(
            200,
            {
                "tenant": who.tenant,
                "messages": self.meter.count(who.tenant),
                "since": self.meter.started_at_ms,
            },
        )

    async def _block(self, who: Principal | None, req: Request) -> Response:
        assert who is not None
        blocked = json_field(req.body, "blocked", bool, "invalid_body", '{"blocked": true|false}')
        self.blocks.set(who.tenant, blocked)
        self.log.info("tenant_block", tenant=who.tenant, blocked=blocked, by=who.subject)
        return json_response(
            200,
            {
                "tenant": who.tenant,
                "adminBlocked": blocked,
                "blocked": self.policy.blocked(who.tenant),
            },
        )
