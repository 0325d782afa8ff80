"""The closed list of error codes: every code in `ERROR_CODES` is produced by some request,
each with the HTTP status the contract gives it and the `{"error": {"code", "message"}}`
body; and the OpenAPI document names every route and code."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from nereus.adapters.http.contract import ERROR_CODES, ERROR_STATUS, ROUTES, STATUSES
from nereus.adapters.http.openapi import build_document
from nereus.adapters.tenancy import Tenancy
from nereus.kernel.config import KernelConfig
from nereus.runtime.errors import Overloaded
from nereus.service.errors import ShardNotLocal
from tests.support.http_harness import (
    QUEUE,
    Service,
    cancel,
    config,
    schedule,
    start_service,
    timer_path,
)

POST = "/api/v1/timers"


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    doc = config(
        acme={"max_live_timers": 1000, "horizon_ms": 100_000, "max_payload_bytes": 1000},
        globex={"max_ops_per_s": 1},
    )
    doc["server"] = {"max_body_bytes": 4096, "header_timeout_s": 0.5, "body_timeout_s": 0.5}
    with start_service(tmp_path_factory.mktemp("codes"), doc) as s:
        yield s


def _batch(*ops: Any) -> dict[str, Any]:
    return {"operations": list(ops)}


Case = Callable[[Service], Any]


def _with_backend(attr: str, value: Any, method: str, path: str, body: Any = None) -> Case:
    def run(svc: Service) -> Any:
        setattr(svc.backend, attr, value)
        try:
            return svc.call(method, path, body)
        finally:
            setattr(svc.backend, attr, None if attr != "booted" else True)

    return run


def _shard_not_local(svc: Service) -> Any:
    original = svc.backend.peek

    def peek(*args: Any, **kwargs: Any) -> Any:
        raise ShardNotLocal("shard 3 is not owned by this process")

    svc.backend.peek = peek  # type: ignore[method-assign]
    try:
        return svc.call("GET", timer_path("k"))
    finally:
        svc.backend.peek = original  # type: ignore[method-assign]


def _rate_limited(svc: Service) -> Any:
    svc.clock_s[0] += 100
    svc.post(cancel("r"), token="globex-all")
    return svc.call("POST", POST, _batch(cancel("r")), token="globex-all")


def _over_quota(svc: Service) -> Any:
    policy = svc.api.tenancy.tenants["acme"]
    svc.api.tenancy.tenants["acme"] = dataclasses.replace(policy, max_live_timers=0)
    try:
        return svc.call("POST", POST, _batch(schedule("q")))
    finally:
        svc.api.tenancy.tenants["acme"] = policy


def _blocked(svc: Service) -> Any:
    svc.call("PUT", "/api/v1/admin/block", {"blocked": True})
    try:
        return svc.call("POST", POST, _batch(schedule("q")))
    finally:
        svc.call("PUT", "/api/v1/admin/block", {"blocked": False})


def _server_busy(svc: Service) -> Any:
    shared = svc.server.shared
    shared.inflight += shared.limits.max_inflight  # as if that many requests were waiting
    try:
        return svc.call("GET", timer_path("k"))
    finally:
        shared.inflight -= shared.limits.max_inflight


_DEEP = b'{"operations":' + b"[" * 999 + b"]" * 999 + b"}"
_GET = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"

CASES: dict[str, Case] = {
    "malformed_request": lambda s: s.call("POST", POST, raw=b"{}", headers={"Content-Length": "x"}),
    "malformed_json": lambda s: s.call("POST", POST, raw=b"{nope"),
    "invalid_batch": lambda s: s.call("POST", POST, {"operations": []}),
    "invalid_operation": lambda s: s.call("POST", POST, _batch({"op": "explode"})),
    "invalid_path": lambda s: s.call("GET", "/api/v1/timers/a%2Fb/k"),
    "invalid_query": lambda s: s.call("GET", f"/api/v1/timers/{QUEUE}?limit=many"),
    "invalid_body": lambda s: s.call("PUT", "/api/v1/admin/block", {"blocked": "yes"}),
    "server_owned_field": lambda s: s.call("POST", POST, _batch(schedule("k", tenant="x"))),
    "invalid_identity": lambda s: s.call("POST", POST, _batch(schedule("x" * 151))),
    "invalid_txn": lambda s: s.call("POST", POST, _batch(schedule("k", txn=""))),
    "invalid_headers": lambda s: s.call("POST", POST, _batch(schedule("k", headers={"": "v"}))),
    "invalid_timing": lambda s: s.call("POST", POST, _batch(schedule("k", -1))),
    "unauthorized": lambda s: s.call("GET", timer_path("k"), token="bogus"),
    "missing_grant": lambda s: s.call("GET", timer_path("k"), token="acme-producer"),
    "horizon_exceeded": lambda s: s.call("POST", POST, _batch(schedule("k", 100_001))),
    "over_quota": _over_quota,
    "produce_blocked": _blocked,
    "dlq_replay_refused": lambda s: s.call("POST", f"/api/v1/dlq/{QUEUE}/k/replay", {}),
    "not_found": lambda s: s.call("GET", "/api/v2/timers"),
    "method_not_allowed": lambda s: s.call("PATCH", timer_path("k"), {}),
    "payload_too_large": lambda s: s.call("POST", POST, _batch(schedule("k", 0, b"x" * 2000))),
    "body_too_large": lambda s: s.call("POST", POST, raw=b" " * 5000),
    "rate_limited": _rate_limited,
    "overloaded": _with_backend(
        "fail_execute", Overloaded("full"), "POST", POST, _batch(schedule("k"))
    ),
    "internal_error": _with_backend(
        "fail_execute", RuntimeError("a bug"), "POST", POST, _batch(schedule("k"))
    ),
    "unavailable": _with_backend(
        "fail_execute", TimeoutError("slow"), "POST", POST, _batch(schedule("k"))
    ),
    "not_booted": _with_backend("booted", False, "DELETE", timer_path("k")),
    "storage_full": _with_backend("map_fraction", 0.97, "POST", POST, _batch(schedule("k"))),
    "shard_not_local": _shard_not_local,
    "json_too_deep": lambda s: s.call("POST", POST, raw=_DEEP),
    "request_timeout": lambda s: s.raw(b"GET /healthz HTTP/1.1\r\nHost: x\r\n"),
    "request_line_too_long": lambda s: s.raw(b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n"),
    "headers_too_large": lambda s: s.raw(_GET + b"X-Big: " + b"b" * 70_000 + b"\r\n\r\n"),
    "server_busy": _server_busy,
    "http_version_not_supported": lambda s: s.raw(b"GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n"),
}


def test_every_code_has_a_case() -> None:
    assert set(CASES) == set(ERROR_CODES)


@pytest.mark.parametrize("code", list(ERROR_CODES))
def test_every_error_code_is_produced_with_its_status_and_body(svc: Service, code: str) -> None:
    before = svc.log_end
    reply = CASES[code](svc)
    assert reply.status == ERROR_STATUS[code], (code, reply.status, reply.body[:300])
    assert reply.headers["content-type"] == "application/json"
    doc = json.loads(reply.body)
    assert set(doc) == {"error"} and set(doc["error"]) == {"code", "message"}
    assert doc["error"]["code"] == code and doc["error"]["message"]
    if code not in ("rate_limited",):
        assert svc.log_end == before, "an error appended something"


def test_statuses_of_the_contract() -> None:
    assert ERROR_STATUS["horizon_exceeded"] == 403 and ERROR_STATUS["over_quota"] == 403
    assert ERROR_STATUS["produce_blocked"] == 403 and ERROR_STATUS["storage_full"] == 503
    assert ERROR_STATUS["rate_limited"] == 429 and ERROR_STATUS["overloaded"] == 429
    assert ERROR_STATUS["body_too_large"] == 413 and ERROR_STATUS["payload_too_large"] == 413
    assert ERROR_STATUS["dlq_replay_refused"] == 403 and ERROR_STATUS["not_booted"] == 503
    assert ERROR_STATUS["invalid_identity"] == ERROR_STATUS["invalid_txn"] == 400
    assert ERROR_STATUS["invalid_headers"] == ERROR_STATUS["invalid_timing"] == 400
    assert all(status >= 400 for status in ERROR_STATUS.values())
    # 500 is a bug; 503 is not the caller's fault; 505 is HTTP's own answer to a version the
    # server does not speak (the one 5xx a request's content can cause, by design).
    assert sorted({s for s in ERROR_STATUS.values() if s >= 500}) == [500, 503, 505]
    assert ERROR_STATUS["http_version_not_supported"] == 505


def test_the_openapi_document_names_every_route_code_and_status(svc: Service) -> None:
    reply = svc.call("GET", "/openapi.json", token=None)
    assert reply.status == 200
    doc = reply.doc
    assert doc["openapi"] == "3.1.0"
    assert doc == json.loads(json.dumps(build_document(svc.api.tenancy, svc.api.kernel)))
    for route in ROUTES:
        op = doc["paths"][route.path][route.method.lower()]
        for code in route.errors:
            assert f"`{code}`" in op["responses"][str(ERROR_STATUS[code])]["description"]
        assert ("security" in op) == (route.needs == "public")
    schemas = doc["components"]["schemas"]
    assert schemas["Error"]["properties"]["error"]["properties"]["code"]["enum"] == list(
        ERROR_CODES
    )
    assert schemas["Result"]["properties"]["status"]["enum"] == list(STATUSES)
    documented = {
        code
        for path in doc["paths"].values()
        for op in path.values()
        for response in op["responses"].values()
        for code in ERROR_CODES
        if f"`{code}`" in response.get("description", "")
    }
    assert documented | {"not_found", "method_not_allowed"} == set(ERROR_CODES)


def test_the_document_is_built_from_the_running_limits() -> None:
    kernel = KernelConfig()
    doc = build_document(Tenancy.open_default(), kernel)
    batch = doc["components"]["schemas"]["Batch"]["properties"]["operations"]
    assert batch["maxItems"] == 256
    assert doc["components"]["schemas"]["Queue"]["maxLength"] == kernel.max_identity_bytes


def test_unknown_routes_and_methods(svc: Service) -> None:
    for method, path in (("GET", "/"), ("GET", "/api/v1/timer"), ("POST", "/api/v1/dlq/q")):
        reply = svc.call(method, path, {} if method == "POST" else None)
        assert (reply.status, reply.code) == (404, "not_found"), (method, path)
    for method, path in (
        ("GET", POST),
        ("DELETE", f"/api/v1/timers/{QUEUE}"),
        ("PUT", timer_path("k")),
        ("GET", "/api/v1/admin/block"),
        ("POST", "/api/v1/admin/metering"),
        ("GET", f"/api/v1/dlq/{QUEUE}/k/replay"),
        ("POST", "/openapi.json"),
        ("OPTIONS", "/healthz"),
    ):
        reply = svc.call(method, path, {} if method in ("POST", "PUT") else None)
        assert (reply.status, reply.code) == (405, "method_not_allowed"), (method, path)
