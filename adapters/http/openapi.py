"""The OpenAPI 3.1 document of the HTTP timer API, served at `GET /openapi.json`.

Theory of operation: everything the document promises comes from `adapters.http_contract`
(the routes and their grants, the closed error-code list with each code's HTTP status, the
result statuses, the batch and list limits) and from the running configuration (the cell's
horizon and payload ceiling, the body limit), so it cannot drift from what the service
answers. Each operation documents, per HTTP status, exactly the error codes it can answer
(its own plus `COMMON_ERRORS`); schemathesis checks the live service against it in the tests.
"""

from __future__ import annotations

from typing import Any

from nereus.adapters.http.contract import (
    COMMON_ERRORS,
    ERROR_CODES,
    ERROR_STATUS,
    HINT_HEADER,
    LIST_DEFAULT_LIMIT,
    LIST_MAX_LIMIT,
    MAX_OPERATIONS,
    ROUTES,
    STATUSES,
    Route,
)
from nereus.adapters.tenancy import Tenancy
from nereus.kernel.config import KernelConfig
from nereus.service.access import GRANTS
from nereus.service.codes import COMMAND_CODES
from nereus.service.readiness import REASON_CODES

_REF = "#/components/schemas/"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF + name}


def _nullable(kind: str) -> dict[str, Any]:
    return {"type": [kind, "null"]}


_STR = {"type": "string"}
_INT = {"type": "integer"}
_BOOL = {"type": "boolean"}


def _obj(
    props: dict[str, Any], required: list[str] | None = None, *, closed: bool = True
) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props}
    out["required"] = list(props) if required is None else required
    if closed:
        out["additionalProperties"] = False
    return out


def _schemas(tenancy: Tenancy, kernel: KernelConfig) -> dict[str, Any]:
    """The components' schemas, in the document's order: the requests, the answers, the
    admin and probe bodies."""
    evidence = _evidence()
    return {
        **_request_schemas(_fields(kernel), kernel),
        **_answer_schemas(evidence, _row(evidence)),
        **_admin_schemas(),
    }


def _fields(kernel: KernelConfig) -> dict[str, dict[str, Any]]:
    """The schemas of the request fields the configuration bounds: queue, timerKey, txn and
    delayMs."""
    # The limits are on UTF-8 bytes (what the store keys on), which JSON Schema cannot say:
    # maxLength counts characters, and no string of more characters than the byte limit can
    # fit it, so maxLength is the bound a schema can state; x-nereus-max-bytes is the rule.
    ident = kernel.max_identity_bytes
    in_bytes = "The limit is on UTF-8 bytes: a string within maxLength characters whose UTF-8 "
    in_bytes += "encoding is longer is refused too (400)."
    queue = {
        "type": "string",
        "minLength": 1,
        "maxLength": ident,
        "x-nereus-max-bytes": ident,
        "pattern": "^[^/\\x00]+$",
        "description": f"One path segment of 1 to {ident} bytes of UTF-8. {in_bytes}",
    }
    timer_key = {
        "type": "string",
        "minLength": 1,
        "maxLength": ident,
        "x-nereus-max-bytes": ident,
        "pattern": "^[^\\x00]+$",
        "description": f"1 to {ident} bytes of UTF-8; may contain '/'. {in_bytes}",
    }
    txn = {
        "type": "string",
        "minLength": 1,
        "maxLength": kernel.max_txn_bytes,
        "x-nereus-max-bytes": kernel.max_txn_bytes,
        "description": f"1 to {kernel.max_txn_bytes} bytes of UTF-8. A command that changes "
        "the timer must carry a txn other than its current generation's (else the result is "
        "`rejected` with code `txn_reused`). " + in_bytes,
    }
    delay = {
        "type": "integer",
        "minimum": 0,
        "description": "Milliseconds from the entry's persistence time. Above the tenant's "
        "horizon (min of cell and tenant; the kernel allows at most "
        f"{kernel.limits.max_delay_horizon_ms}) is 403 horizon_exceeded.",
    }
    return {"queue": queue, "timerKey": timer_key, "txn": txn, "delayMs": delay}


def _evidence() -> dict[str, Any]:
    return _obj(
        {
            "destination": _STR,
            "partition": _INT,
            "offset": _INT,
            "timestamp": _INT,
            "brokerMessageId": {
                "type": "string",
                "description": "The destination's own id of the record, where a partition "
                "and an offset do not name it: Pulsar's `ledger:entry:partition:batch` "
                "(`partition` is then Pulsar's partition index, -1 for a non-partitioned "
                "topic, and `offset` -1). Absent for Kafka and the local destination.",
            },
        },
        required=["destination", "partition", "offset", "timestamp"],
    )


def _row(evidence: dict[str, Any]) -> dict[str, Any]:
    """A timer's fields as a peek and a list row show them."""
    return {
        "queue": _STR,
        "timerKey": _STR,
        "status": {
            "type": "string",
            "enum": [
                "SCHEDULED",
                "PUBLISHING",
                "UNCERTAIN",
                "DELIVERED",
                "CANCELED",
                "EXPIRED",
                "DEAD_LETTERED",
            ],
        },
        "partition": _nullable("string"),
        "deliverAt": _INT,
        "expireAt": _INT,
        "txn": _STR,
        "messageId": _STR,
        "generation": _INT,
        "encrypted": _BOOL,
        "producerSub": _nullable("string"),
        "attempts": _INT,
        "lastError": _nullable("string"),
        "createdAt": _INT,
        "updatedAt": _INT,
        "evidence": {
            "oneOf": [evidence, {"type": "null"}],
            "description": "Where the destination has the record once DELIVERED; null "
            "before (so always null for a listed timer, which is live).",
        },
    }


def _request_schemas(fields: dict[str, dict[str, Any]], kernel: KernelConfig) -> dict[str, Any]:
    queue, timer_key, txn, delay = (
        fields[name] for name in ("queue", "timerKey", "txn", "delayMs")
    )
    return {
        "Error": _obj(
            {
                "error": _obj(
                    {"code": {"type": "string", "enum": list(ERROR_CODES)}, "message": _STR}
                )
            }
        ),
        "ScheduleOp": _obj(
            {
                "op": {"const": "schedule"},
                "queue": queue,
                "timerKey": timer_key,
                "delayMs": delay,
                "payload": {
                    "type": "string",
                    "contentEncoding": "base64",
                    "description": "Base64. Larger than the payload ceiling (min of 1 MiB, "
                    "the plan and the cell) is 413 payload_too_large.",
                },
                "txn": txn,
                "partition": _STR,
                "headers": {
                    "type": "object",
                    "additionalProperties": _STR,
                    "maxProperties": kernel.max_headers,
                    "description": "nereus-* names are the server's (400 server_owned_field). "
                    "On an encrypted queue they are sealed inside the payload's envelope "
                    "unless the queue keeps them clear (seal_headers = false).",
                },
            },
            required=["op", "queue", "timerKey"],
        ),
        "RescheduleOp": _obj(
            {
                "op": {"const": "reschedule"},
                "queue": queue,
                "timerKey": timer_key,
                "delayMs": delay,
                "txn": txn,
            },
            required=["op", "queue", "timerKey"],
        ),
        "CancelOp": _obj(
            {"op": {"const": "cancel"}, "queue": queue, "timerKey": timer_key, "txn": txn},
            required=["op", "queue", "timerKey"],
        ),
        "Batch": _obj(
            {
                "operations": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": MAX_OPERATIONS,
                    "items": {
                        "oneOf": [_ref("ScheduleOp"), _ref("RescheduleOp"), _ref("CancelOp")],
                        "discriminator": {"propertyName": "op"},
                    },
                }
            }
        ),
    }


def _answer_schemas(evidence: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    peek_found = {
        **row,
        "found": {"const": True},
        "payload": {
            **_nullable("string"),
            "contentEncoding": "base64",
            "description": "The bytes as stored (an envelope for an encrypted queue); null "
            "once a finished timer's bytes were dropped.",
        },
        "claimed": _BOOL,
    }
    return {
        "Result": _obj(
            {
                "ok": _BOOL,
                "status": {"type": "string", "enum": list(STATUSES)},
                "queue": _STR,
                "timerKey": _STR,
                "txn": _nullable("string"),
                "code": {
                    "type": "string",
                    "enum": sorted(COMMAND_CODES),
                    "description": "The code (specs/codes.md): the status itself, or for "
                    "`rejected` the rule that refused the operation, e.g. `txn_reused`.",
                },
                "message": {
                    "type": "string",
                    "description": "Why, in words: on every result that is not ok.",
                },
                "messageId": _STR,
                "deliverAt": _nullable("integer"),
                "attemptId": _nullable("string"),
                "evidence": evidence,
            },
            required=["ok", "status", "code", "queue", "timerKey", "txn"],
        ),
        "Results": _obj({"results": {"type": "array", "items": _ref("Result")}}),
        "PeekMissing": _obj({"found": {"const": False}}),
        "PeekFound": _obj(peek_found),
        "Peek": {"oneOf": [_ref("PeekMissing"), _ref("PeekFound")]},
        "Row": _obj(row),
        "Page": _obj(
            {
                "rows": {"type": "array", "items": _ref("Row"), "maxItems": LIST_MAX_LIMIT},
                "truncated": _BOOL,
                "nextAfter": _nullable("string"),
            }
        ),
    }


def _admin_schemas() -> dict[str, Any]:
    return {
        "Metering": _obj(
            {
                "tenant": _STR,
                "messages": {"type": "integer", "minimum": 0},
                "since": {"type": "integer", "description": "Process start, epoch ms."},
            }
        ),
        "BlockRequest": _obj({"blocked": _BOOL}),
        "BlockState": _obj({"tenant": _STR, "adminBlocked": _BOOL, "blocked": _BOOL}),
        "Health": _obj({"ok": _BOOL}, closed=False),
        "Readiness": _obj(
            {
                "ready": _BOOL,
                "reasons": {
                    "type": "array",
                    "description": "Why not ready (absent when ready).",
                    "items": _ref("ReadinessReason"),
                },
            },
            ["ready"],
        ),
        "ReadinessReason": _obj(
            {
                "code": {
                    "type": "string",
                    "enum": list(REASON_CODES),
                    "description": "; ".join(f"`{c}`: {d}" for c, d in REASON_CODES.items()),
                },
                "detail": _STR,
                "shard": {"type": "integer", "minimum": 0, "description": "The shard, if one."},
            },
            ["code", "detail"],
        ),
    }


_OK: dict[tuple[str, str], tuple[str, str]] = {
    ("POST", "/api/v1/timers"): ("Results", "application/json"),
    ("DELETE", "/api/v1/timers/{queue}/{timerKey}"): ("Result", "application/json"),
    ("GET", "/api/v1/timers/{queue}/{timerKey}"): ("Peek", "application/json"),
    ("GET", "/api/v1/timers/{queue}"): ("Page", "application/json"),
    ("GET", "/api/v1/admin/metering"): ("Metering", "application/json"),
    ("PUT", "/api/v1/admin/block"): ("BlockState", "application/json"),
    ("GET", "/healthz"): ("Health", "application/json"),
    ("GET", "/readyz"): ("Readiness", "application/json"),
}
_BODY = {("POST", "/api/v1/timers"): "Batch", ("PUT", "/api/v1/admin/block"): "BlockRequest"}
_HINTED = frozenset({"produce_blocked", "over_quota", "storage_full"})


def _parameters(route: Route) -> list[dict[str, Any]]:
    params: list[dict[str, Any]] = []
    for name in ("queue", "timerKey"):
        if "{" + name + "}" in route.path:
            params.append(
                {
                    "name": name,
                    "in": "path",
                    "required": True,
                    "schema": _ref(name[0].upper() + name[1:]),
                }
            )
    if route.path == "/api/v1/timers/{queue}":
        params += [
            {
                "name": "after",
                "in": "query",
                "required": False,
                "description": "Exclusive cursor: the last timerKey of the previous page.",
                "schema": _STR,
            },
            {
                "name": "limit",
                "in": "query",
                "required": False,
                "description": f"Rows per page, default {LIST_DEFAULT_LIMIT}, clamped to "
                f"[1, {LIST_MAX_LIMIT}].",
                "schema": _INT,
            },
        ]
    if route.method == "DELETE":
        params.append(
            {
                "name": "txn",
                "in": "query",
                "required": False,
                "description": "The txn the cancel carries.",
                "schema": _ref("Txn"),
            }
        )
    return params


def _responses(route: Route) -> dict[str, Any]:
    out: dict[str, Any] = {}
    ok = _OK.get((route.method, route.path))
    if route.path == "/metrics":
        out["200"] = {
            "description": "Prometheus text exposition.",
            "content": {"text/plain": {"schema": _STR}},
        }
    elif route.path == "/openapi.json":
        out["200"] = {
            "description": "This document.",
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
    elif ok is not None:
        out["200"] = {"description": "OK", "content": {ok[1]: {"schema": _ref(ok[0])}}}
    if route.path == "/healthz":
        out["503"] = {
            "description": "Not ok (halted, or Kafka mode not started).",
            "content": {"application/json": {"schema": _ref("Health")}},
        }
    if route.path == "/readyz":
        out["503"] = {
            "description": "Not ready: `reasons` lists every reason.",
            "content": {"application/json": {"schema": _ref("Readiness")}},
        }
    by_status: dict[int, list[str]] = {}
    for code in (*route.errors, *COMMON_ERRORS):
        by_status.setdefault(ERROR_STATUS[code], []).append(code)
    for status, codes in sorted(by_status.items()):
        if str(status) in out:
            continue
        response: dict[str, Any] = {
            "description": "; ".join(f"`{c}`: {ERROR_CODES[c]}" for c in codes),
            "content": {"application/json": {"schema": _ref("Error")}},
        }
        headers: dict[str, Any] = {}
        if _HINTED & set(codes):
            headers[HINT_HEADER] = {
                "description": "On a refused producing batch: what still works.",
                "schema": _STR,
            }
        if status == 429 or "server_busy" in codes:
            headers["Retry-After"] = {"description": "Seconds.", "schema": _STR}
        if status == 401:
            headers["WWW-Authenticate"] = {"schema": _STR}
        if headers:
            response["headers"] = headers
        out[str(status)] = response
    return out


def build_document(tenancy: Tenancy, kernel: KernelConfig) -> dict[str, Any]:
    schemas = _schemas(tenancy, kernel)
    schemas["Queue"] = schemas["ScheduleOp"]["properties"]["queue"]
    schemas["TimerKey"] = schemas["ScheduleOp"]["properties"]["timerKey"]
    schemas["Txn"] = schemas["ScheduleOp"]["properties"]["txn"]
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        operation: dict[str, Any] = {
            "summary": route.summary,
            "operationId": _operation_id(route),
            "responses": _responses(route),
        }
        if route.needs == "public":
            operation["security"] = []
        else:
            needs = "any valid credential" if route.needs == "any" else f"the `{route.needs}` grant"
            operation["description"] = f"Needs {needs}."
        params = _parameters(route)
        if params:
            operation["parameters"] = params
        body = _BODY.get((route.method, route.path))
        if body is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": _ref(body)}},
            }
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    body_limit = tenancy.server.max_body_bytes
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Nereus timer API",
            "version": "1",
            "description": "A durable delayed-message scheduler (specs/http.md). Grants: "
            + ", ".join(GRANTS)
            + f". Bodies above {body_limit} bytes: 413 body_too_large.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


def _operation_id(route: Route) -> str:
    words = [w.strip("{}") for w in route.path.split("/") if w and w not in ("api", "v1")]
    return route.method.lower() + "".join(w[:1].upper() + w[1:] for w in words)
