"""The HTTP timer API (first routes): schedule/cancel batches, cancel, peek, metrics.

    POST   /api/v1/timers                      {"operations": [...]}  -> {"results": [...]}
    DELETE /api/v1/timers/{queue}/{timerKey}   [?txn=...]             -> one result
    GET    /api/v1/timers/{queue}/{timerKey}                          -> peek
    GET    /metrics                                                   -> Prometheus text
    GET    /healthz                                                   -> {"ok": true, ...}

Theory of operation: the wire is checked whole before anything is appended: a batch with
one malformed operation is refused whole (400) and nothing of it reaches the log. A valid
batch is appended as one unit and answered in request order once durable, each element with
`ok` and a `status` from a closed list. Only relative delays are on the wire; the absolute
deliverAt is computed from the entry's persistence time and returned. Error bodies are
`{"error": {"code": ..., "message": ...}}` with codes from `ERROR_CODES`.

The routes run against a `TimerBackend`: the embedded `Nereus` (one shard, commands
committed by its runtime), or `adapters.kafka_service.KafkaService` (commands produced to the
Kafka commands topic and answered by whichever process owns their shard; peek reads the
local store of a shard owned here and answers 503 `shard_not_local` for any other).
"""

from __future__ import annotations

import base64
import binascii
import threading
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

import msgspec

from adapters.embedded import DEFAULT_TENANT, Nereus, Peek, Result, schedule_record, to_result
from kernel.config import KernelConfig
from kernel.effects import EntryOutcome
from kernel.records import Cancel
from runtime.metrics import Metrics
from runtime.shard import Overloaded, RuntimeHalted
from storage.store import Appendable

MAX_OPERATIONS = 256
MAX_BODY_BYTES = 64 * 1024 * 1024
SERVER_OWNED = frozenset({"producerSub", "messageId", "tenant"})
# The statuses a result element may carry. "rejected" is the guard for a kernel verdict the
# edge checks should have made impossible; it carries the kernel code in "code".
STATUSES = ("scheduled", "rescheduled", "unchanged", "canceled", "too_late", "absent")

ERROR_CODES: dict[str, str] = {
    "malformed_json": "The body is not JSON.",
    "invalid_batch": 'The body is not {"operations": [...]} with 1 to 256 operations.',
    "invalid_operation": "An operation is malformed; the message names which and why.",
    "server_owned_field": "An operation sets producerSub, messageId, tenant or a _-field.",
    "payload_too_large": "A payload is larger than the payload ceiling.",
    "body_too_large": "The request body is larger than the server accepts.",
    "not_found": "No such route.",
    "method_not_allowed": "The route does not take this method.",
    "overloaded": "The intake queue is full: retry later.",
    "unavailable": "The service cannot commit right now (not your fault).",
    "shard_not_local": "Kafka mode: the timer's shard is not owned by this process; peek it "
    "at the process that owns it (see /healthz) or retry after the shards move.",
}


class Unavailable(RuntimeError):
    """The backend cannot append or answer right now (the command may or may not have been
    appended: a retry of a schedule with the same txn is safe)."""


class ShardNotLocal(Exception):
    """Kafka mode: a peek of a timer whose shard this process does not own (or is still
    catching up on)."""


class TimerBackend(Protocol):
    """What the routes need from the service behind them."""

    @property
    def kernel_config(self) -> KernelConfig: ...

    @property
    def metrics(self) -> Metrics: ...

    def execute(self, items: Sequence[Appendable], timeout_s: float) -> list[EntryOutcome]:
        """Append the items as one unit and return their outcomes once durable. Raises
        Overloaded, RuntimeHalted or TimeoutError when it cannot."""
        ...

    def peek(self, queue: str, timer_key: str) -> Peek:
        """Raises ShardNotLocal when this process cannot read the timer's shard."""
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

    def peek(self, queue: str, timer_key: str) -> Peek:
        return self.nereus.peek(queue, timer_key)

    def health(self) -> tuple[bool, dict[str, Any]]:
        halted = self.nereus.runtime.halted
        return halted is None, {
            "ok": halted is None,
            "appliedPosition": self.nereus.store.meta.position,
        }


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        assert code in ERROR_CODES
        super().__init__(message)
        self.status = status
        self.code = code


class ScheduleOp(
    msgspec.Struct, tag="schedule", tag_field="op", forbid_unknown_fields=True, rename="camel"
):
    queue: str
    timer_key: str
    delay_ms: int = 0
    txn: str | None = None
    payload: str = ""
    partition: str | None = None
    headers: dict[str, str] | None = None


class CancelOp(
    msgspec.Struct, tag="cancel", tag_field="op", forbid_unknown_fields=True, rename="camel"
):
    queue: str
    timer_key: str
    txn: str | None = None


Operation = ScheduleOp | CancelOp


@dataclass(frozen=True)
class ApiLimits:
    max_delay_ms: int
    max_payload_bytes: int


def _check_identity(queue: str, timer_key: str, where: str) -> None:
    if not queue or "/" in queue or "\x00" in queue:
        raise ApiError(400, "invalid_operation", f"{where}: queue must be one path segment")
    if not timer_key or "\x00" in timer_key:
        raise ApiError(400, "invalid_operation", f"{where}: timerKey must be non-empty")


def parse_batch(body: bytes, limits: ApiLimits) -> list[tuple[Operation, Appendable]]:
    """The whole batch, validated, or ApiError: nothing of a bad batch is appended."""
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise ApiError(400, "malformed_json", str(exc)) from exc
    if (
        not isinstance(doc, dict)
        or set(doc) != {"operations"}
        or not isinstance(doc["operations"], list)
    ):
        raise ApiError(400, "invalid_batch", 'expected {"operations": [...]}')
    raw_ops = doc["operations"]
    if not 1 <= len(raw_ops) <= MAX_OPERATIONS:
        raise ApiError(400, "invalid_batch", f"1 to {MAX_OPERATIONS} operations per call")
    parsed: list[tuple[Operation, Appendable]] = []
    for index, raw in enumerate(raw_ops):
        where = f"operations[{index}]"
        if isinstance(raw, dict):
            owned = sorted(k for k in raw if k in SERVER_OWNED or str(k).startswith("_"))
            if owned:
                raise ApiError(
                    400, "server_owned_field", f"{where}: {', '.join(owned)} is set by the server"
                )
        try:
            op = msgspec.convert(raw, Operation)
        except msgspec.ValidationError as exc:
            raise ApiError(400, "invalid_operation", f"{where}: {exc}") from exc
        _check_identity(op.queue, op.timer_key, where)
        if isinstance(op, ScheduleOp):
            parsed.append((op, _schedule_item(op, where, limits)))
        else:
            record = Cancel(DEFAULT_TENANT, op.queue, op.timer_key, txn=op.txn)
            parsed.append((op, (record, None)))
    return parsed


def _schedule_item(op: ScheduleOp, where: str, limits: ApiLimits) -> Appendable:
    if not 0 <= op.delay_ms <= limits.max_delay_ms:
        raise ApiError(
            400, "invalid_operation", f"{where}: delayMs must be in [0, {limits.max_delay_ms}]"
        )
    if op.txn is not None and not op.txn:
        raise ApiError(400, "invalid_operation", f"{where}: txn must not be empty")
    try:
        payload = base64.b64decode(op.payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ApiError(400, "invalid_operation", f"{where}: payload is not base64") from exc
    if len(payload) > limits.max_payload_bytes:
        raise ApiError(
            413,
            "payload_too_large",
            f"{where}: {len(payload)} bytes > ceiling {limits.max_payload_bytes}",
        )
    headers = tuple(sorted((op.headers or {}).items()))
    if any(name.lower().startswith("nereus-") for name, _ in headers):
        raise ApiError(
            400, "server_owned_field", f"{where}: nereus-* headers are set by the server"
        )
    return schedule_record(
        op.queue,
        op.timer_key,
        payload,
        delay_ms=op.delay_ms,
        txn=op.txn,
        partition=op.partition,
        headers=headers,
    )


def result_json(result: Result, kind: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "ok": result.ok,
        "status": result.status if result.status in STATUSES else "rejected",
        "queue": result.queue,
        "timerKey": result.timer_key,
        "txn": result.txn,
    }
    if result.status not in STATUSES:
        out["code"] = result.status
    if result.message_id is not None and result.status != "absent":
        out["messageId"] = result.message_id
    if kind == "schedule" and result.ok:
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


class TimerApi:
    """Routes requests to a `Nereus` instance; independent of the HTTP server class so tests
    can call `handle` directly."""

    def __init__(self, backend: Nereus | TimerBackend, *, commit_timeout_s: float = 30.0) -> None:
        self.backend: TimerBackend = (
            EmbeddedBackend(backend) if isinstance(backend, Nereus) else backend
        )
        cfg = self.backend.kernel_config
        self.limits = ApiLimits(
            max_delay_ms=cfg.limits.max_delay_horizon_ms,
            max_payload_bytes=cfg.max_payload_bytes,
        )
        self.commit_timeout_s = commit_timeout_s

    def handle(self, method: str, target: str, body: bytes) -> tuple[int, str, bytes]:
        """(status, content type, body)."""
        try:
            response = self._route(method, target, body)
        except ApiError as exc:
            doc = {"error": {"code": exc.code, "message": str(exc)}}
            response = exc.status, "application/json", msgspec.json.encode(doc)
        self.backend.metrics.inc(
            "nereus_http_requests_total",
            labels={"route": _route_label(method, target), "status": str(response[0])},
        )
        return response

    def _route(self, method: str, target: str, body: bytes) -> tuple[int, str, bytes]:
        url = urllib.parse.urlsplit(target)
        path = url.path
        if path == "/metrics":
            self._only(method, "GET")
            return 200, "text/plain; version=0.0.4", self.backend.metrics.render().encode()
        if path == "/healthz":
            self._only(method, "GET")
            ok, doc = self.backend.health()
            return (200 if ok else 503), "application/json", msgspec.json.encode(doc)
        if path == "/api/v1/timers":
            self._only(method, "POST")
            return self._post(body)
        prefix = "/api/v1/timers/"
        if path.startswith(prefix):
            queue_raw, _, key_raw = path[len(prefix) :].partition("/")
            queue = urllib.parse.unquote(queue_raw)
            timer_key = urllib.parse.unquote(key_raw)
            _check_identity(queue, timer_key, "path")
            if method == "GET":
                return self._json(200, self._peek(queue, timer_key))
            if method == "DELETE":
                txn = urllib.parse.parse_qs(url.query).get("txn", [None])[0]
                return self._delete(queue, timer_key, txn)
            raise ApiError(405, "method_not_allowed", f"{method} {prefix}{{queue}}/{{timerKey}}")
        raise ApiError(404, "not_found", f"no route {path}")

    @staticmethod
    def _only(method: str, allowed: str) -> None:
        if method != allowed:
            raise ApiError(405, "method_not_allowed", f"use {allowed}")

    @staticmethod
    def _json(status: int, doc: Any) -> tuple[int, str, bytes]:
        return status, "application/json", msgspec.json.encode(doc)

    def _commit(self, items: list[Appendable]) -> list[Any]:
        try:
            return self.backend.execute(items, self.commit_timeout_s)
        except Overloaded as exc:
            raise ApiError(429, "overloaded", str(exc)) from exc
        except (RuntimeHalted, TimeoutError, Unavailable) as exc:
            raise ApiError(503, "unavailable", str(exc)) from exc

    def _post(self, body: bytes) -> tuple[int, str, bytes]:
        parsed = parse_batch(body, self.limits)
        outcomes = self._commit([item for _, item in parsed])
        results = [
            result_json(
                to_result(outcome, op.queue, op.timer_key),
                "schedule" if isinstance(op, ScheduleOp) else "cancel",
            )
            for (op, _), outcome in zip(parsed, outcomes, strict=True)
        ]
        return self._json(200, {"results": results})

    def _delete(self, queue: str, timer_key: str, txn: str | None) -> tuple[int, str, bytes]:
        record = Cancel(DEFAULT_TENANT, queue, timer_key, txn=txn)
        outcome = self._commit([(record, None)])[0]
        return self._json(200, result_json(to_result(outcome, queue, timer_key), "cancel"))

    def _peek(self, queue: str, timer_key: str) -> dict[str, Any]:
        try:
            p = self.backend.peek(queue, timer_key)
        except ShardNotLocal as exc:
            raise ApiError(503, "shard_not_local", str(exc)) from exc
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


def _route_label(method: str, target: str) -> str:
    path = urllib.parse.urlsplit(target).path
    if path == "/api/v1/timers":
        return f"{method} /api/v1/timers"
    if path.startswith("/api/v1/timers/"):
        return f"{method} /api/v1/timers/{{queue}}/{{timerKey}}"
    if path in ("/metrics", "/healthz"):
        return f"{method} {path}"
    return "other"


def make_handler(api: TimerApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "nereus"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                doc = {"error": {"code": "body_too_large", "message": f"over {MAX_BODY_BYTES}"}}
                status, ctype, body = 413, "application/json", msgspec.json.encode(doc)
                self.close_connection = True
            else:
                data = self.rfile.read(length) if length else b""
                status, ctype, body = api.handle(self.command, self.path, data)
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_DELETE = do_PUT = do_PATCH = _serve  # noqa: N815

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
