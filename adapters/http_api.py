"""The HTTP timer API: tenants, credentials, limits and the timer routes (`specs/http.md`).

    POST   /api/v1/timers                              produce  {"operations": [...]}
    DELETE /api/v1/timers/{queue}/{timerKey}[?txn=]    any valid credential of the tenant
    GET    /api/v1/timers/{queue}/{timerKey}           read     peek
    GET    /api/v1/timers/{queue}[?after=&limit=]      read     list live timers
    GET    /api/v1/admin/metering                      admin
    PUT    /api/v1/admin/block                         admin    {"blocked": bool}
    POST   /api/v1/dlq/{queue}/{timerKey}/replay       any      always 403 dlq_replay_refused
    GET    /healthz, /metrics, /openapi.json           public

Theory of operation: a request is matched to a route (404/405), then authenticated (the
bearer token decides the tenant, 401), authorized by the route's grant (403 missing_grant),
and only then is its input read. A batch is checked whole before anything is appended: a
batch with one bad operation is refused whole and nothing of it reaches the log. Then, in
this order, the tenant's rate (429 rate_limited) and, for a batch that would produce
(`schedule` or `reschedule`), the blocks: admin/operator block, quota from the shard's
durable per-tenant usage, storage full (403/403/503 with the `x-nereus-timers-hint`
header). A valid batch is appended as one unit and answered in request order once durable.
Every record carries the credential's tenant and subject; since message ids are derived from
(tenant, queue, timerKey), another tenant's timer is simply absent on every route.

A DELETE is never refused by a grant, block, quota or rate: only by a missing credential or a
service that is not booted (or the physical answers every commit shares: 429 overloaded, 503
unavailable). Error bodies are `{"error": {"code", "message"}}` with codes from
`ERROR_CODES`; the OpenAPI document at `/openapi.json` is built from the same constants.

The routes run against a `TimerBackend`: the embedded `Nereus` (one shard, commands committed
by its runtime), or `adapters.kafka_service.KafkaService` (commands produced to the Kafka
commands topic and answered by whichever process owns their shard; reads of a shard owned
elsewhere answer 503 `shard_not_local`).
"""

from __future__ import annotations

import base64
import binascii
import threading
import traceback
import urllib.parse
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple, Protocol, TypeVar

import msgspec

from adapters import crypto
from adapters.embedded import DEFAULT_TENANT, Nereus, Peek, Result, schedule_record, to_result
from adapters.http_auth import Authenticator, Unauthorized
from adapters.http_contract import (
    ERROR_CODES,
    ERROR_STATUS,
    GRANTS,
    HINT_HEADER,
    HINT_VALUE,
    LIST_DEFAULT_LIMIT,
    LIST_MAX_LIMIT,
    MAX_OPERATIONS,
    METERED_STATUSES,
    RESERVED_HEADER_PREFIX,
    SERVER_OWNED,
    STATUSES,
    STORAGE_FULL_FRACTION,
    route_grant,
)
from adapters.metering import Blocks, Meter, RateLimiter, retry_after_s
from adapters.openapi import build_document
from adapters.tenancy import Limits, Principal, Tenancy, TenantPolicy
from kernel.config import KernelConfig
from kernel.effects import EntryOutcome
from kernel.model import Message, TenantUsage
from kernel.records import Cancel, Reschedule
from kernel.validation import check_headers, check_identity, check_txn
from runtime.errors import Overloaded, RuntimeHalted
from runtime.log import Logger, NullLogger
from runtime.metrics import Metrics
from storage.store import Appendable

__all__ = [
    "ERROR_CODES",
    "MAX_OPERATIONS",
    "STATUSES",
    "ApiError",
    "EmbeddedBackend",
    "HttpServer",
    "ShardNotLocal",
    "TimerApi",
    "TimerBackend",
    "Unavailable",
]


class Unavailable(RuntimeError):
    """The backend cannot append or answer right now (the command may or may not have been
    appended: a retry of a schedule with the same txn is safe)."""


class ShardNotLocal(Exception):
    """Kafka mode: a read of a shard this process does not own (or is still catching up
    on)."""


class TimerBackend(Protocol):
    """What the routes need from the service behind them."""

    @property
    def kernel_config(self) -> KernelConfig: ...

    @property
    def metrics(self) -> Metrics: ...

    def execute(self, items: Sequence[Appendable], timeout_s: float) -> list[EntryOutcome]:
        """Append the items as one unit and return their outcomes once durable. Raises
        Overloaded, RuntimeHalted, TimeoutError or Unavailable when it cannot."""
        ...

    def peek(self, queue: str, timer_key: str, *, tenant: str = DEFAULT_TENANT) -> Peek:
        """Raises ShardNotLocal when this process cannot read the timer's shard."""
        ...

    def list_timers(
        self, queue: str, after: str | None, limit: int, *, tenant: str
    ) -> tuple[list[Message], bool]:
        """The queue's live timers after `after` in byte order of the key, at most `limit`,
        and whether more follow. Raises ShardNotLocal."""
        ...

    def tenant_usage(self, tenant: str) -> TenantUsage:
        """The tenant's durable usage (live timers, their payload bytes). Raises
        ShardNotLocal."""
        ...

    def map_usage(self) -> float:
        """The fraction of the (fullest) LMDB map in use: storage is full at 0.95."""
        ...

    def health(self) -> tuple[bool, dict[str, Any]]: ...


class EmbeddedBackend:
    """The embedded `Nereus` (one shard in this process) as a TimerBackend."""

    def __init__(self, nereus: Nereus) -> None:
        self.nereus = nereus

    @property
    def kernel_config(self) -> KernelConfig:
        return self.nereus.store.config

    @property
    def metrics(self) -> Metrics:
        return self.nereus.runtime.metrics

    def execute(self, items: Sequence[Appendable], timeout_s: float) -> list[EntryOutcome]:
        return self.nereus.runtime.execute(items, timeout_s)

    def peek(self, queue: str, timer_key: str, *, tenant: str = DEFAULT_TENANT) -> Peek:
        return self.nereus.peek(queue, timer_key, tenant=tenant)

    def list_timers(
        self, queue: str, after: str | None, limit: int, *, tenant: str
    ) -> tuple[list[Message], bool]:
        with self.nereus.store.read() as view:
            return view.list_timers(tenant, queue, after, limit)

    def tenant_usage(self, tenant: str) -> TenantUsage:
        with self.nereus.store.read() as view:
            return view.tenant_usage(tenant)

    def map_usage(self) -> float:
        return self.nereus.store.map_usage()

    def health(self) -> tuple[bool, dict[str, Any]]:
        halted = self.nereus.runtime.halted
        return halted is None, {
            "ok": halted is None,
            "appliedPosition": self.nereus.store.meta.position,
        }


class ApiError(Exception):
    def __init__(self, code: str, message: str, *, headers: Sequence[tuple[str, str]] = ()) -> None:
        assert code in ERROR_CODES, code
        super().__init__(message)
        self.status = ERROR_STATUS[code]
        self.code = code
        self.headers = tuple(headers)


class Response(NamedTuple):
    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


_JSON = "application/json"
_HINT = ((HINT_HEADER, HINT_VALUE),)


def error_response(code: str, message: str, headers: Sequence[tuple[str, str]] = ()) -> Response:
    doc = {"error": {"code": code, "message": message}}
    return Response(ERROR_STATUS[code], _JSON, msgspec.json.encode(doc), tuple(headers))


# Operations -------------------------------------------------------------------------------


class _Op(msgspec.Struct, forbid_unknown_fields=True, rename="camel", tag_field="op"):
    queue: str
    timer_key: str


class ScheduleOp(_Op, tag="schedule"):
    delay_ms: int = 0
    payload: str = ""
    txn: str | None = None
    partition: str | None = None
    headers: dict[str, str] | None = None


class RescheduleOp(_Op, tag="reschedule"):
    delay_ms: int = 0
    txn: str | None = None


class CancelOp(_Op, tag="cancel"):
    txn: str | None = None


Operation = ScheduleOp | RescheduleOp | CancelOp
_KIND: dict[type[_Op], str] = {
    ScheduleOp: "schedule",
    RescheduleOp: "reschedule",
    CancelOp: "cancel",
}


@dataclass(frozen=True)
class Checked:
    """One operation of a batch, validated; `payload` is the clear payload of a schedule."""

    op: Operation
    payload: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def kind(self) -> str:
        return _KIND[type(self.op)]

    @property
    def produces(self) -> bool:
        return not isinstance(self.op, CancelOp)


def _identity_problem(tenant: str, queue: str, timer_key: str, kernel: KernelConfig) -> str | None:
    if check_identity(tenant, queue, timer_key, kernel) is None:
        return None
    limit = kernel.max_identity_bytes
    if not queue or "/" in queue or "\x00" in queue or len(queue.encode()) > limit:
        return f"queue must be one path segment of 1..{limit} bytes without NUL"
    return f"timerKey must be 1..{limit} bytes without NUL"


T = TypeVar("T")


def _json_field(body: bytes, name: str, kind: type[T], code: str, shape: str) -> T:
    """The one field of a JSON object body that must hold exactly `{name: <kind>}`."""
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise ApiError("malformed_json", str(exc)) from exc
    if not isinstance(doc, dict) or set(doc) != {name} or not isinstance(doc[name], kind):
        raise ApiError(code, f"expected {shape}")
    value: T = doc[name]
    return value


def parse_batch(
    body: bytes,
    *,
    tenant: str,
    limits: Limits,
    kernel: KernelConfig,
    queue_keys: Mapping[str, str] | None = None,
) -> list[Checked]:
    """The whole batch, validated, or ApiError: nothing of a bad batch is appended."""
    raw_ops = _json_field(body, "operations", list, "invalid_batch", '{"operations": [...]}')
    if not 1 <= len(raw_ops) <= MAX_OPERATIONS:
        raise ApiError("invalid_batch", f"1 to {MAX_OPERATIONS} operations per call")
    keys = queue_keys or {}
    return [
        _check_op(
            raw,
            f"operations[{index}]",
            tenant=tenant,
            limits=limits,
            kernel=kernel,
            queue_keys=keys,
        )
        for index, raw in enumerate(raw_ops)
    ]


def _check_op(
    raw: Any,
    where: str,
    *,
    tenant: str,
    limits: Limits,
    kernel: KernelConfig,
    queue_keys: Mapping[str, str],
) -> Checked:
    if isinstance(raw, dict):
        owned = sorted(str(k) for k in raw if k in SERVER_OWNED or str(k).startswith("_"))
        if owned:
            raise ApiError(
                "server_owned_field", f"{where}: {', '.join(owned)} is set by the server"
            )
    try:
        op = msgspec.convert(raw, Operation)
    except msgspec.ValidationError as exc:
        raise ApiError("invalid_operation", f"{where}: {exc}") from exc
    problem = _identity_problem(tenant, op.queue, op.timer_key, kernel)
    if problem is not None:
        raise ApiError("invalid_operation", f"{where}: {problem}")
    if op.txn is not None and check_txn(op.txn, kernel) is not None:
        raise ApiError("invalid_operation", f"{where}: txn must be 1..{kernel.max_txn_bytes} bytes")
    if isinstance(op, CancelOp):
        return Checked(op)
    if op.delay_ms < 0:
        raise ApiError("invalid_operation", f"{where}: delayMs must be >= 0")
    if op.delay_ms > limits.horizon_ms:
        raise ApiError(
            "horizon_exceeded",
            f"{where}: delayMs {op.delay_ms} is beyond the horizon of {limits.horizon_ms} ms",
        )
    if isinstance(op, RescheduleOp):
        return Checked(op)
    try:
        payload = base64.b64decode(op.payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ApiError("invalid_operation", f"{where}: payload is not base64") from exc
    ceiling = limits.payload_ceiling
    key_id = queue_keys.get(op.queue)
    if key_id is not None:
        # The ceiling is on the clear payload, but the stored envelope must fit the kernel.
        ceiling = min(ceiling, kernel.max_payload_bytes - crypto.ENVELOPE_OVERHEAD_BYTES(key_id))
    if len(payload) > ceiling:
        raise ApiError(
            "payload_too_large", f"{where}: {len(payload)} bytes > ceiling {max(ceiling, 0)}"
        )
    headers = tuple(sorted((op.headers or {}).items()))
    if any(name.lower().startswith(RESERVED_HEADER_PREFIX) for name, _ in headers):
        raise ApiError("server_owned_field", f"{where}: nereus-* headers are set by the server")
    if check_headers(headers, kernel) is not None:
        raise ApiError(
            "invalid_operation",
            f"{where}: headers: at most {kernel.max_headers}, names non-empty, "
            f"{kernel.max_header_bytes} bytes in all",
        )
    return Checked(op, payload, headers)


def result_json(result: Result, kind: str) -> dict[str, Any]:
    known = result.status in STATUSES and result.status != "rejected"
    out: dict[str, Any] = {
        "ok": result.ok,
        "status": result.status if known else "rejected",
        "queue": result.queue,
        "timerKey": result.timer_key,
        "txn": result.txn,
    }
    if not known:
        out["code"] = result.status
    if result.message_id is not None and result.status != "absent":
        out["messageId"] = result.message_id
    if kind in ("schedule", "reschedule") and result.ok:
        out["deliverAt"] = result.deliver_at_ms
    if result.status == "too_late":
        out["attemptId"] = result.attempt_id
        if result.evidence is not None:
            ev = result.evidence
            out["evidence"] = {
                "destination": ev["destination"],
                "partition": ev["partition"],
                "offset": ev["offset"],
                "timestamp": ev["timestamp_ms"],
            }
    return out


def peek_json(p: Peek) -> dict[str, Any]:
    if not p.found:
        return {"found": False}
    return {
        "found": True,
        "queue": p.queue,
        "timerKey": p.timer_key,
        "status": p.status,
        "partition": p.partition,
        "deliverAt": p.deliver_at_ms,
        "expireAt": p.expire_at_ms,
        "txn": p.txn,
        "messageId": p.message_id,
        "generation": p.generation,
        "payload": p.payload,
        "encrypted": p.encrypted,
        "producerSub": p.producer_sub,
        "attempts": p.attempts,
        "lastError": p.last_error,
        "claimed": p.claimed,
        "createdAt": p.created_at_ms,
        "updatedAt": p.updated_at_ms,
    }


def row_json(m: Message) -> dict[str, Any]:
    return {
        "queue": m.queue,
        "timerKey": m.timer_key,
        "status": str(m.status),
        "partition": m.partition_key,
        "deliverAt": m.deliver_at_ms,
        "expireAt": m.expire_at_ms,
        "txn": m.txn,
        "messageId": m.message_id,
        "generation": m.generation,
        "encrypted": m.encrypted,
        "producerSub": m.producer_sub,
        "attempts": m.attempts_admitted,
        "lastError": m.last_error,
        "createdAt": m.created_at_ms,
        "updatedAt": m.updated_at_ms,
    }


# The API ----------------------------------------------------------------------------------

_TIMERS = "/api/v1/timers"
_DLQ = "/api/v1/dlq/"
_METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE"})
_FIXED_ROUTES = frozenset(
    {"/metrics", "/healthz", "/openapi.json", "/api/v1/admin/metering", "/api/v1/admin/block"}
)


class TimerApi:
    """Routes requests to a backend; independent of the HTTP server class so tests can call
    `handle` (or `respond`, with headers) directly."""

    def __init__(
        self,
        backend: Nereus | TimerBackend,
        *,
        tenancy: Tenancy | None = None,
        commit_timeout_s: float = 30.0,
        rate_limiter: RateLimiter | None = None,
        logger: Logger | None = None,
    ) -> None:
        self.backend: TimerBackend = (
            EmbeddedBackend(backend) if isinstance(backend, Nereus) else backend
        )
        self.tenancy = tenancy or Tenancy.open_default()
        self.kernel = self.backend.kernel_config
        self.tenancy.check_kernel(self.kernel)
        self.limits = {
            name: self.tenancy.limits(name, self.kernel) for name in self.tenancy.tenants
        }
        all_grants = frozenset(GRANTS)
        self.auth = Authenticator(
            self.tenancy.credentials,
            disabled_as=Principal(DEFAULT_TENANT, None, all_grants)
            if self.tenancy.auth_disabled
            else None,
        )
        self.max_body_bytes = self.tenancy.server.max_body_bytes
        self.commit_timeout_s = commit_timeout_s
        self.meter = Meter(self.backend.metrics, self.tenancy.tenants)
        self.rates = rate_limiter or RateLimiter()
        self.blocks = Blocks()
        self.log = logger or NullLogger()
        self._openapi = msgspec.json.encode(build_document(self.tenancy, self.kernel))

    # Entry points -------------------------------------------------------------------------

    def handle(
        self, method: str, target: str, body: bytes, headers: Mapping[str, str] | None = None
    ) -> tuple[int, str, bytes]:
        """(status, content type, body)."""
        r = self.respond(method, target, body, headers)
        return r.status, r.content_type, r.body

    def respond(
        self, method: str, target: str, body: bytes, headers: Mapping[str, str] | None = None
    ) -> Response:
        lowered = {k.lower(): v for k, v in (headers or {}).items()}
        try:
            response = self._route(method, target, body, lowered)
        except ApiError as exc:
            response = error_response(exc.code, str(exc), exc.headers)
        except Exception as exc:  # a bug: answer, log, never blame the request
            self.log.error(
                "http_internal_error",
                method=method,
                route=route_label(method, target),
                error=repr(exc),
                traceback=traceback.format_exc(),
            )
            response = error_response("internal_error", "internal error (logged)")
        self.backend.metrics.inc(
            "nereus_http_requests_total",
            labels={"route": route_label(method, target), "status": str(response.status)},
        )
        return response

    # Routing ------------------------------------------------------------------------------

    def _route(self, method: str, target: str, body: bytes, headers: Mapping[str, str]) -> Response:
        url = urllib.parse.urlsplit(target)
        path = url.path
        if path == "/metrics":
            self._only(method, "GET")
            return Response(
                200, "text/plain; version=0.0.4", self.backend.metrics.render().encode()
            )
        if path == "/healthz":
            self._only(method, "GET")
            ok, doc = self.backend.health()
            return Response(200 if ok else 503, _JSON, msgspec.json.encode(doc))
        if path == "/openapi.json":
            self._only(method, "GET")
            return Response(200, _JSON, self._openapi)
        if path == _TIMERS:
            self._only(method, "POST")
            who = self._authorize(headers, "POST", _TIMERS)
            return self._post(who, body)
        if path.startswith(_TIMERS + "/"):
            queue_raw, slash, key_raw = path[len(_TIMERS) + 1 :].partition("/")
            queue = urllib.parse.unquote(queue_raw)
            if not slash:
                self._only(method, "GET")
                who = self._authorize(headers, "GET", _TIMERS + "/{queue}")
                return self._list(who, queue, url.query)
            timer_key = urllib.parse.unquote(key_raw)
            if method == "GET":
                who = self._authorize(headers, "GET", _TIMERS + "/{queue}/{timerKey}")
                return self._peek(who, queue, timer_key)
            if method == "DELETE":
                who = self._authorize(headers, "DELETE", _TIMERS + "/{queue}/{timerKey}")
                return self._delete(who, queue, timer_key, url.query)
            raise ApiError("method_not_allowed", f"{method} {_TIMERS}/{{queue}}/{{timerKey}}")
        if path == "/api/v1/admin/metering":
            self._only(method, "GET")
            who = self._authorize(headers, "GET", path)
            return self._metering(who)
        if path == "/api/v1/admin/block":
            self._only(method, "PUT")
            who = self._authorize(headers, "PUT", path)
            return self._block(who, body)
        if path.startswith(_DLQ) and path.endswith("/replay") and "/" in path[len(_DLQ) :]:
            self._only(method, "POST")
            self._authorize(headers, "POST", _DLQ + "{queue}/{timerKey}/replay")
            raise ApiError(
                "dlq_replay_refused",
                "a dead letter is not replayed: it never had a consumer group and its offset "
                "is not a position; schedule a new timer instead",
            )
        raise ApiError("not_found", f"no route {path}")

    @staticmethod
    def _only(method: str, allowed: str) -> None:
        if method != allowed:
            raise ApiError("method_not_allowed", f"use {allowed}")

    def _authorize(self, headers: Mapping[str, str], method: str, route: str) -> Principal:
        try:
            who = self.auth.authenticate(headers.get("authorization"))
        except Unauthorized as exc:
            raise ApiError(
                "unauthorized", str(exc), headers=(("WWW-Authenticate", 'Bearer realm="nereus"'),)
            ) from None
        grant = route_grant(method, route)
        if grant in GRANTS and grant not in who.grants:
            raise ApiError("missing_grant", f"{method} {route} needs the {grant!r} grant")
        return who

    @staticmethod
    def _json(status: int, doc: Any) -> Response:
        return Response(status, _JSON, msgspec.json.encode(doc))

    def _policy(self, who: Principal) -> TenantPolicy:
        return self.tenancy.tenants[who.tenant]

    def _check_path(self, who: Principal, queue: str, timer_key: str | None) -> None:
        problem = _identity_problem(who.tenant, queue, timer_key or "k", self.kernel)
        if problem is not None:
            raise ApiError("invalid_path", problem)

    # Commands -----------------------------------------------------------------------------

    def _commit(self, items: list[Appendable]) -> list[EntryOutcome]:
        try:
            return self.backend.execute(items, self.commit_timeout_s)
        except Overloaded as exc:
            raise ApiError("overloaded", str(exc), headers=(("Retry-After", "1"),)) from exc
        except (RuntimeHalted, TimeoutError, Unavailable) as exc:
            raise ApiError("unavailable", str(exc)) from exc

    def _post(self, who: Principal, body: bytes) -> Response:
        policy = self._policy(who)
        checked = parse_batch(
            body,
            tenant=who.tenant,
            limits=self.limits[who.tenant],
            kernel=self.kernel,
            queue_keys=policy.queue_keys,
        )
        wait = self.rates.take(who.tenant, policy.max_ops_per_s, len(checked))
        if wait is not None:
            raise ApiError(
                "rate_limited",
                f"tenant {who.tenant!r} may send {policy.max_ops_per_s} operations per second",
                headers=(("Retry-After", str(retry_after_s(wait))),),
            )
        if any(c.produces for c in checked):
            self._check_may_produce(who, policy)
        items = [self._item(who, policy, c) for c in checked]
        outcomes = self._commit(items)
        results = [
            result_json(to_result(outcome, c.op.queue, c.op.timer_key), c.kind)
            for c, outcome in zip(checked, outcomes, strict=True)
        ]
        metered = sum(
            1
            for c, r in zip(checked, results, strict=True)
            if c.produces and r["status"] in METERED_STATUSES
        )
        if metered:
            self.meter.add(who.tenant, metered)
        return self._json(200, {"results": results})

    def blocked(self, tenant: str) -> bool:
        """Blocked for producing by the operator or an admin (not by quota or storage)."""
        policy = self.tenancy.tenants[tenant]
        return self.tenancy.server.blocked or policy.blocked or self.blocks.get(tenant)

    def _check_may_produce(self, who: Principal, policy: TenantPolicy) -> None:
        if self.blocked(who.tenant):
            raise ApiError(
                "produce_blocked",
                f"producing is blocked for tenant {who.tenant!r}; cancels still work",
                headers=_HINT,
            )
        if policy.has_quota:
            try:
                usage = self.backend.tenant_usage(who.tenant)
            except ShardNotLocal as exc:
                raise ApiError("shard_not_local", f"the tenant's usage: {exc}") from exc
            over = []
            if policy.max_live_timers is not None and usage.live >= policy.max_live_timers:
                over.append(f"{usage.live} live timers of {policy.max_live_timers}")
            if policy.max_bytes is not None and usage.bytes >= policy.max_bytes:
                over.append(f"{usage.bytes} payload bytes of {policy.max_bytes}")
            if over:
                raise ApiError(
                    "over_quota",
                    f"tenant {who.tenant!r} is at its quota ({'; '.join(over)}); cancel timers "
                    "to produce again",
                    headers=_HINT,
                )
        used = self.backend.map_usage()
        if used >= STORAGE_FULL_FRACTION:
            raise ApiError(
                "storage_full",
                f"storage is {used:.0%} full: producing is paused; cancels still work",
                headers=_HINT,
            )

    def _item(self, who: Principal, policy: TenantPolicy, c: Checked) -> Appendable:
        op = c.op
        if isinstance(op, CancelOp):
            return Cancel(who.tenant, op.queue, op.timer_key, txn=op.txn), None
        if isinstance(op, RescheduleOp):
            record = Reschedule(
                tenant=who.tenant,
                queue=op.queue,
                timer_key=op.timer_key,
                txn=op.txn or uuid.uuid4().hex,
                delay_ms=op.delay_ms,
            )
            return record, None
        payload, encrypted = c.payload, False
        key_id = policy.queue_keys.get(op.queue)
        if key_id is not None:
            payload, encrypted = self._seal(who, key_id, op, c.payload), True
        return schedule_record(
            op.queue,
            op.timer_key,
            payload,
            tenant=who.tenant,
            delay_ms=op.delay_ms,
            txn=op.txn,
            partition=op.partition,
            headers=c.headers,
            producer_sub=who.subject,
            encrypted=encrypted,
        )

    def _seal(self, who: Principal, key_id: str, op: ScheduleOp, clear: bytes) -> bytes:
        """The envelope to schedule. Sealing is deterministic (adapters/crypto.py), so an
        identical retry is the identical request and the kernel answers `unchanged`."""
        return crypto.seal(
            self.tenancy.keyring,
            key_id,
            clear,
            tenant=who.tenant,
            queue=op.queue,
            timer_key=op.timer_key,
        )

    def _delete(self, who: Principal, queue: str, timer_key: str, query: str) -> Response:
        ok, _ = self.backend.health()
        if not ok:
            raise ApiError("not_booted", "the service is not booted (see /healthz)")
        self._check_path(who, queue, timer_key)
        txn = _query_value(query, "txn")
        if txn is not None and check_txn(txn, self.kernel) is not None:
            raise ApiError("invalid_query", f"txn must be 1..{self.kernel.max_txn_bytes} bytes")
        record = Cancel(who.tenant, queue, timer_key, txn=txn)
        outcome = self._commit([(record, None)])[0]
        return self._json(200, result_json(to_result(outcome, queue, timer_key), "cancel"))

    # Reads --------------------------------------------------------------------------------

    def _peek(self, who: Principal, queue: str, timer_key: str) -> Response:
        self._check_path(who, queue, timer_key)
        try:
            p = self.backend.peek(queue, timer_key, tenant=who.tenant)
        except ShardNotLocal as exc:
            raise ApiError("shard_not_local", str(exc)) from exc
        return self._json(200, peek_json(p))

    def _list(self, who: Principal, queue: str, query: str) -> Response:
        self._check_path(who, queue, None)
        after = _query_value(query, "after") or None
        raw_limit = _query_value(query, "limit")
        limit = LIST_DEFAULT_LIMIT
        if raw_limit is not None:
            try:
                limit = int(raw_limit.strip(), 10)
            except ValueError:
                raise ApiError("invalid_query", "limit must be an integer") from None
            limit = min(max(limit, 1), LIST_MAX_LIMIT)
        try:
            rows, truncated = self.backend.list_timers(queue, after, limit, tenant=who.tenant)
        except ShardNotLocal as exc:
            raise ApiError("shard_not_local", str(exc)) from exc
        return self._json(
            200,
            {
                "rows": [row_json(m) for m in rows],
                "truncated": truncated,
                "nextAfter": rows[-1].timer_key if truncated and rows else None,
            },
        )

    # Admin --------------------------------------------------------------------------------

    def _metering(self, who: Principal) -> Response:
        return self._json(
            200,
            {
                "tenant": who.tenant,
                "messages": self.meter.count(who.tenant),
                "since": self.meter.started_at_ms,
            },
        )

    def _block(self, who: Principal, body: bytes) -> Response:
        blocked = _json_field(body, "blocked", bool, "invalid_body", '{"blocked": true|false}')
        self.blocks.set(who.tenant, blocked)
        self.log.info("tenant_block", tenant=who.tenant, blocked=blocked, by=who.subject)
        return self._json(
            200,
            {
                "tenant": who.tenant,
                "adminBlocked": blocked,
                "blocked": self.blocked(who.tenant),
            },
        )


def _query_value(query: str, name: str) -> str | None:
    values = urllib.parse.parse_qs(query, keep_blank_values=True).get(name)
    if not values:
        return None
    if len(values) > 1:
        raise ApiError("invalid_query", f"{name} given {len(values)} times")
    return values[0]


def route_label(method: str, target: str) -> str:
    """A bounded label: a route template and a known method (or "other")."""
    if method not in _METHODS:
        return "other"
    path = urllib.parse.urlsplit(target).path
    if path == _TIMERS:
        return f"{method} {_TIMERS}"
    if path.startswith(_TIMERS + "/"):
        if "/" in path[len(_TIMERS) + 1 :]:
            return f"{method} {_TIMERS}/{{queue}}/{{timerKey}}"
        return f"{method} {_TIMERS}/{{queue}}"
    if path.startswith(_DLQ):
        return f"{method} {_DLQ}{{queue}}/{{timerKey}}/replay"
    if path in _FIXED_ROUTES:
        return f"{method} {path}"
    return "other"


# The server -------------------------------------------------------------------------------


def make_handler(api: TimerApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Headers and body leave in two writes; with Nagle on, the body waits for the
        # client's delayed ACK (~40 ms a request on keep-alive connections).
        disable_nagle_algorithm = True
        server_version = "nereus"

        def _serve(self) -> None:
            response = self._read_and_respond()
            self.send_response(response.status)
            self.send_header("Content-Type", response.content_type)
            self.send_header("Content-Length", str(len(response.body)))
            for name, value in response.headers:
                self.send_header(name, value)
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(response.body)

        def _read_and_respond(self) -> Response:
            if self.headers.get("Transfer-Encoding") is not None:
                self.close_connection = True
                return error_response(
                    "malformed_request", "send the body with a Content-Length, not chunked"
                )
            raw_length = self.headers.get("Content-Length")
            try:
                length = int(raw_length) if raw_length is not None else 0
                if length < 0:
                    raise ValueError
            except ValueError:
                self.close_connection = True
                return error_response("malformed_request", "Content-Length is not a count")
            if length > api.max_body_bytes:
                self.close_connection = True
                return error_response(
                    "body_too_large", f"{length} bytes > {api.max_body_bytes} accepted"
                )
            data = self.rfile.read(length) if length else b""
            headers = {name: value for name, value in self.headers.items()}
            return api.respond(self.command, self.path, data, headers)

        do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _serve  # noqa: N815

        def __getattr__(self, name: str) -> Any:
            # Any other method (HEAD, OPTIONS, TRACE, made-up ones) is routed too, so it is
            # answered 404/405 with a JSON error body instead of http.server's HTML 501.
            if name.startswith("do_"):
                return self._serve
            raise AttributeError(name)

        def log_message(self, format: str, *args: Any) -> None:
            return  # requests are counted in metrics, not logged one by one

    return Handler


class HttpServer:
    def __init__(self, api: TimerApi, host: str, port: int) -> None:
        self.server = ThreadingHTTPServer((host, port), make_handler(api))
        self.server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="nereus-http", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        if self._thread is not None:
            self._thread.join(5)
