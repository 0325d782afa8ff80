"""The HTTP timer API's closed lists and limits, in one place.

Theory of operation: the routes (`adapters.http.routing`, `adapters.http.api`), the
connection handling (`adapters.http.protocol`) and the OpenAPI document
(`adapters.http.openapi`) are all built from the constants here, so the document cannot
promise a code, a status or a limit the service does not have. Adding an error code is a
protocol change: it goes into the one list of codes, `service.codes.CODES` (with its HTTP
status), whose refusals are `ERRORS` here, and into `specs/codes.md`.
"""

from __future__ import annotations

from typing import Final, Literal, NamedTuple

from nereus.service.access import Grant
from nereus.service.codes import CODES
from nereus.service.codes import STATUSES as CODE_STATUSES

# Operations per POST batch.
MAX_OPERATIONS: Final = 256
# Request bodies larger than this are refused unread unless the config says otherwise.
DEFAULT_MAX_BODY_BYTES: Final = 16 * 1024 * 1024


# Query parameters whose values are credentials, by name (case-insensitive; `-` and `.`
# read as `_`; also as the last `_`-part of a longer name: `refresh_token`, `X-Amz-Signature`).
# The access log writes their values as `[redacted]`: the API takes credentials only in the
# Authorization header and refuses them elsewhere, but a refused request is logged too.
CREDENTIAL_QUERY_NAMES: Final = frozenset(
    {
        "access_token",
        "token",
        "api_key",
        "apikey",
        "key",
        "password",
        "secret",
        "auth",
        "authorization",
        "signature",
        "sig",
        "session",
    }
)

# List: rows per page.
LIST_DEFAULT_LIMIT: Final = 100
LIST_MAX_LIMIT: Final = 1000
# The LMDB map is "full" for producing at this fraction.
STORAGE_FULL_FRACTION: Final = 0.95

SERVER_OWNED: Final = frozenset({"producerSub", "messageId", "tenant"})
RESERVED_HEADER_PREFIX: Final = "nereus-"

# The statuses a result element may carry (`service.codes`): "rejected" is a kernel verdict
# the edge checks did not make (or that only the kernel can make, such as `txn_reused`); it
# carries the kernel code in "code".
STATUSES: Final = CODE_STATUSES
# Result statuses that count one metered message (a new promise: a new generation).
METERED_STATUSES: Final = frozenset({"scheduled", "rescheduled"})

# The header a refused producing batch carries: what the caller can still do.
HINT_HEADER: Final = "x-nereus-timers-hint"
HINT_VALUE: Final = "DELETE /api/v1/timers/{queue}/{timerKey}"

# code -> (HTTP status, meaning): the codes of the one list (`service.codes.CODES`) that
# refuse a whole request. Every error body is {"error": {"code", "message"}}.
ERRORS: Final[dict[str, tuple[int, str]]] = {
    code: (answer.http_status, answer.meaning)
    for code, answer in CODES.items()
    if answer.http_status >= 400
}

ERROR_CODES: Final[dict[str, str]] = {code: text for code, (_, text) in ERRORS.items()}
ERROR_STATUS: Final[dict[str, int]] = {code: status for code, (status, _) in ERRORS.items()}

# Errors any route may answer, before it is even known which route it is: the connection's
# own answers (adapters.http.protocol) and a bug.
COMMON_ERRORS: Final = (
    "malformed_request",
    "request_timeout",
    "body_too_large",
    "request_line_too_long",
    "headers_too_large",
    "server_busy",
    "http_version_not_supported",
    "internal_error",
)


class Route(NamedTuple):
    """One route: who may call it (a grant, `any` valid credential of a tenant, or `public`)
    and the error codes it may answer besides `COMMON_ERRORS`."""

    method: str
    path: str
    needs: Grant | Literal["any", "public"]
    errors: tuple[str, ...]
    summary: str


_WRITE = ("overloaded", "unavailable")
_PRODUCE_BLOCKS = ("produce_blocked", "over_quota", "storage_full")

ROUTES: Final[tuple[Route, ...]] = (
    Route(
        "POST",
        "/api/v1/timers",
        "produce",
        (
            "unauthorized",
            "missing_grant",
            "malformed_json",
            "json_too_deep",
            "invalid_batch",
            "invalid_operation",
            "server_owned_field",
            "invalid_identity",
            "invalid_txn",
            "payload_too_large",
            "invalid_headers",
            "invalid_timing",
            "horizon_exceeded",
            "rate_limited",
            *_PRODUCE_BLOCKS,
            "shard_not_local",
            *_WRITE,
        ),
        "Schedule, reschedule and cancel timers: one batch, appended as one unit.",
    ),
    Route(
        "DELETE",
        "/api/v1/timers/{queue}/{timerKey}",
        "any",
        ("unauthorized", "not_booted", "invalid_path", "invalid_query", "rate_limited", *_WRITE),
        "Cancel a timer. Never refused by a grant, block or quota; a pending timer's cancel "
        "is never refused by the rate limit either.",
    ),
    Route(
        "GET",
        "/api/v1/timers/{queue}/{timerKey}",
        "read",
        ("unauthorized", "missing_grant", "invalid_path", "shard_not_local"),
        "Peek at a timer's stored row (the payload as stored: never decrypted).",
    ),
    Route(
        "GET",
        "/api/v1/timers/{queue}",
        "read",
        ("unauthorized", "missing_grant", "invalid_path", "invalid_query", "shard_not_local"),
        "List the queue's live timers in byte order of timerKey, without payloads.",
    ),
    Route(
        "GET",
        "/api/v1/admin/metering",
        "admin",
        ("unauthorized", "missing_grant"),
        "The caller's tenant's metered messages since the process started.",
    ),
    Route(
        "PUT",
        "/api/v1/admin/block",
        "admin",
        ("unauthorized", "missing_grant", "malformed_json", "json_too_deep", "invalid_body"),
        "Block or unblock producing for the caller's tenant (this process, in memory).",
    ),
    Route(
        "POST",
        "/api/v1/dlq/{queue}/{timerKey}/replay",
        "any",
        ("unauthorized", "dlq_replay_refused"),
        "Always refused: dead letters are not replayed.",
    ),
    Route("GET", "/healthz", "public", (), "Liveness and what this process serves."),
    Route(
        "GET",
        "/readyz",
        "public",
        (),
        "Readiness: every shard this process should own is owned and serving, with a "
        "bounded clock (503 with the reasons otherwise).",
    ),
    Route("GET", "/metrics", "public", (), "Prometheus metrics."),
    Route("GET", "/openapi.json", "public", (), "This document."),
)

_NEEDS: Final = {(r.method, r.path): r.needs for r in ROUTES}


def route_grant(method: str, path: str) -> str:
    """What the route needs: a grant, "any" or "public" (KeyError for an unknown route)."""
    return _NEEDS[(method, path)]
