"""The one closed list of codes a client is answered with: by the library (`nereus.Nereus`,
`nereus.KafkaNereus`, whose commands travel the Kafka RPC), and by the HTTP API.

Theory of operation: every answer to a command carries one code from `CODES`, with the
same string on every surface. A code is a verdict of the kernel (`kernel.codes.Code`: the
four results that changed something, the two verdicts `too_late` and `absent`, and the
refusals of a command's fields and timing) or a refusal of the HTTP edge (credentials,
plan, connection, capacity), which the library never meets. Where the HTTP edge checks a
kernel rule itself, before anything is appended, it answers with the kernel's code and
status of this table; what it does not check reaches the kernel and comes back as a
result element with status `rejected` and the code. The HTTP API's error list
(`adapters.http.contract.ERRORS`) is the part of this table with a status of 400 or more,
so the two cannot disagree. `specs/codes.md` (section "Answers to clients") documents it.

`retryable` says whether the same request, unchanged, may succeed if sent again later
(after a backoff, or once an operator or the tenant's own timers change the state); a
refusal that is not retryable needs a different request.

The human text of a refusal is built here too (`explain`), from the refused command and
the kernel's configuration, so the library and the HTTP API say the same thing: the
HTTP edge's checks call the same builders (`payload_too_large_text`, ...).
"""

from __future__ import annotations

from typing import Final, NamedTuple

from nereus.kernel.codes import CODE_DOCS, Code
from nereus.kernel.config import KernelConfig
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.records import Cancel, Reschedule, Schedule
from nereus.kernel.timing import MAX_INSTANT_MS
from nereus.kernel.validation import check_identity

__all__ = [
    "CODES",
    "COMMAND_CODES",
    "HTTP_ANSWERS",
    "NAMES_JSON",
    "NAMES_PYTHON",
    "OK_CODES",
    "REFUSAL_ANSWERS",
    "RESULT_ANSWERS",
    "STATUSES",
    "Answer",
    "explain",
    "headers_text",
    "horizon_text",
    "identity_text",
    "payload_too_large_text",
    "status_of",
    "txn_text",
]


class Answer(NamedTuple):
    """What a code means to a client: the HTTP status of the answer that carries it (200:
    a result element of a 200 answer), whether a retry of the same request may succeed,
    and what it means."""

    http_status: int
    retryable: bool
    meaning: str


RESULT_ANSWERS: Final[dict[Code, Answer]] = {
    Code.SCHEDULED: Answer(200, False, "A new timer (or a new one under a finished key)."),
    Code.RESCHEDULED: Answer(200, False, "The pending timer was replaced: a new generation."),
    Code.UNCHANGED: Answer(
        200, False, "An identical retry of the current schedule: nothing changed."
    ),
    Code.CANCELED: Answer(200, False, "The pending timer was cancelled before any delivery."),
    Code.TOO_LATE: Answer(
        200,
        False,
        "The timer's current generation crossed Publish Admission: it is being or was "
        "delivered. The answer names the attempt and, once known, where it landed.",
    ),
    Code.ABSENT: Answer(
        200,
        False,
        "No timer is pending under this key: never scheduled, or no longer pending (it may "
        "have been delivered). A key of another tenant is absent too.",
    ),
}

# Refusals by the kernel's rules (the HTTP edge checks some first: those have its status).
REFUSAL_ANSWERS: Final[dict[Code, Answer]] = {
    Code.TXN_REUSED: Answer(
        200, False, "A change to the timer repeats its current generation's txn: use a new txn."
    ),
    Code.SHARD_NOT_ACTIVE: Answer(
        200, True, "The timer's shard is frozen by an operator and takes no commands."
    ),
    Code.INVALID_IDENTITY: Answer(
        400, False, "Tenant, queue or key empty, too long or with NUL; '/' in tenant or queue."
    ),
    Code.INVALID_TXN: Answer(400, False, "The txn is empty or too long."),
    Code.INVALID_PAYLOAD_REF: Answer(
        200, False, "The payload reference is malformed (never made by Nereus's own clients)."
    ),
    Code.PAYLOAD_TOO_LARGE: Answer(413, False, "A payload is larger than the payload ceiling."),
    Code.INVALID_HEADERS: Answer(
        400, False, "Too many headers, too large, or a name that is empty or nereus-*."
    ),
    Code.INVALID_CAPABILITY: Answer(
        200, False, "The destination capability is malformed (never made by the clients)."
    ),
    Code.INVALID_TIMING: Answer(
        400,
        False,
        "Both or neither of delay and delivery instant, both expiry forms, or a time that is "
        "negative or not below 2^53 ms.",
    ),
    Code.HORIZON_EXCEEDED: Answer(
        403,
        False,
        "The delivery time is beyond the horizon (over HTTP the tenant's, a plan verdict).",
    ),
    Code.LIFETIME_EXCEEDED: Answer(
        200, False, "The expiry is later than the maximum message lifetime allows."
    ),
    Code.EXPIRE_BEFORE_WINDOW: Answer(
        200, False, "The expiry leaves less than the minimum delivery window."
    ),
    Code.VERSION_MISMATCH: Answer(
        200, False, "expected_version is not the timer's version: read it and decide again."
    ),
    Code.DESTINATION_CHANGED: Answer(
        200, False, "A pending timer's destination or capability cannot change."
    ),
}

# Refusals of the HTTP edge: the request is refused whole and nothing of it is appended.
HTTP_ANSWERS: Final[dict[str, Answer]] = {
    "malformed_request": Answer(
        400,
        False,
        "The HTTP request itself is malformed: the request line, a header, raw non-ASCII "
        "bytes in the target, a Content-Length that is not exactly one count of digits, or "
        "a chunked body.",
    ),
    "malformed_json": Answer(400, False, "The body is not JSON (or not UTF-8)."),
    "json_too_deep": Answer(
        400, False, "The body's JSON nests deeper than any document this API takes."
    ),
    "invalid_batch": Answer(
        400, False, 'The body is not {"operations": [...]} with 1 to 256 operations.'
    ),
    "invalid_operation": Answer(
        400,
        False,
        "An operation is not one this API takes (an unknown op or field, a value of the "
        "wrong type); the message names which and why.",
    ),
    "invalid_path": Answer(
        400, False, "A queue or timerKey in the path is empty, too long or malformed."
    ),
    "invalid_query": Answer(
        400, False, "A query parameter is malformed (e.g. a limit that is no integer)."
    ),
    "invalid_body": Answer(400, False, "The body is JSON but not the document this route takes."),
    "server_owned_field": Answer(
        400,
        False,
        "An operation sets producerSub, messageId, tenant, a _-field or a nereus-* header.",
    ),
    "unauthorized": Answer(
        401, False, "No credential, a malformed one, or one this service does not know."
    ),
    "missing_grant": Answer(403, False, "The credential lacks the grant this route needs."),
    "over_quota": Answer(
        403,
        True,
        "The tenant is at its quota of live timers or bytes: cancel timers to produce again.",
    ),
    "produce_blocked": Answer(
        403, False, "Producing is blocked for the tenant by an operator or admin."
    ),
    "dlq_replay_refused": Answer(
        403, False, "Dead letters are not replayed: schedule a new timer instead."
    ),
    "not_found": Answer(404, False, "No such route."),
    "method_not_allowed": Answer(405, False, "The route does not take this method."),
    "request_timeout": Answer(
        408,
        True,
        "The request line and headers, or the declared body, did not arrive in time.",
    ),
    "body_too_large": Answer(
        413,
        False,
        "The declared Content-Length is larger than the server accepts (refused unread).",
    ),
    "request_line_too_long": Answer(
        414, False, "The request line is longer than the server accepts."
    ),
    "headers_too_large": Answer(
        431, False, "The headers are larger, or more, than the server accepts."
    ),
    "rate_limited": Answer(
        429,
        True,
        "The tenant's rate of POST operations, or the credential's rate of DELETEs that "
        "append, is spent: retry after Retry-After (a pending timer's DELETE is never "
        "refused).",
    ),
    "overloaded": Answer(429, True, "The intake queue is full: retry later."),
    "internal_error": Answer(
        500, True, "A bug in the service (never caused by the request's content)."
    ),
    "unavailable": Answer(503, True, "The service cannot commit right now (not your fault)."),
    "not_booted": Answer(503, True, "The service has not finished starting (or has halted)."),
    "storage_full": Answer(503, True, "The cell's storage is nearly full: producing is paused."),
    "shard_not_local": Answer(
        503,
        True,
        "Kafka mode: the timer's shard is not owned by this process; ask the process that "
        "owns it (see /healthz) or retry after the shards move.",
    ),
    "server_busy": Answer(
        503,
        True,
        "The server holds as many connections or requests as it may: retry after Retry-After.",
    ),
    "http_version_not_supported": Answer(505, False, "Only HTTP/1.0 and HTTP/1.1 are served."),
}

CODES: Final[dict[str, Answer]] = {
    **{str(code): answer for code, answer in RESULT_ANSWERS.items()},
    **{str(code): answer for code, answer in REFUSAL_ANSWERS.items()},
    **HTTP_ANSWERS,
}

# The closed list of a result's `status` (the seed's taxonomy: a client writes a switch on
# it): the six verdicts, and `rejected` for every refusal by a kernel rule, whose code is in
# the result's `code`.
STATUSES: Final = (*(str(c) for c in RESULT_ANSWERS), "rejected")

# The codes a command's result can carry on every surface (the kernel's verdicts).
COMMAND_CODES: Final = frozenset(str(c) for c in (*RESULT_ANSWERS, *REFUSAL_ANSWERS))
# Results that are `ok`.
OK_CODES: Final = frozenset({Code.SCHEDULED, Code.RESCHEDULED, Code.UNCHANGED, Code.CANCELED})


def status_of(code: str) -> str:
    """A result's status for its code: the code itself for the six verdicts, else
    `rejected`."""
    return code if code in _VERDICTS else "rejected"


_VERDICTS: Final = frozenset(str(c) for c in RESULT_ANSWERS)


# Human texts ----------------------------------------------------------------------------

# How an argument is called: the library's keyword, or the HTTP API's JSON field.
NAMES_PYTHON: Final = {
    "timer_key": "timer_key",
    "delay_ms": "delay_ms",
    "deliver_at_ms": "deliver_at_ms",
    "expire_at_ms": "expire_at_ms",
    "lifetime_ms": "lifetime_ms",
}
NAMES_JSON: Final = {
    "timer_key": "timerKey",
    "delay_ms": "delayMs",
    "deliver_at_ms": "deliverAt",
    "expire_at_ms": "expireAt",
    "lifetime_ms": "lifetime",
}


def identity_text(
    tenant: str, queue: str, timer_key: str, config: KernelConfig, names: dict[str, str]
) -> str | None:
    """What is wrong with an identity, or None when the kernel would take it."""
    if check_identity(tenant, queue, timer_key, config) is None:
        return None
    limit = config.max_identity_bytes
    for name, part in (("tenant", tenant), ("queue", queue)):
        if not part or "/" in part or "\x00" in part or len(part.encode()) > limit:
            return f"{name} must be one path segment of 1..{limit} bytes without NUL"
    return f"{names['timer_key']} must be 1..{limit} bytes without NUL"


def txn_text(config: KernelConfig) -> str:
    return f"txn must be 1..{config.max_txn_bytes} bytes"


def payload_too_large_text(size: int, ceiling: int) -> str:
    return f"{size} bytes > ceiling {max(ceiling, 0)}"


def headers_text(config: KernelConfig) -> str:
    return (
        f"headers: at most {config.max_headers}, names non-empty and not nereus-*, "
        f"{config.max_header_bytes} bytes in all"
    )


def horizon_text(name: str, value: int, horizon_ms: int) -> str:
    return f"{name} {value} is beyond the horizon of {horizon_ms} ms"


def explain(
    outcome: EntryOutcome,
    record: object,
    config: KernelConfig,
    names: dict[str, str] = NAMES_PYTHON,
) -> str | None:
    """The human text of a refused command (None for an `ok` one): which rule and, where
    the command says it, by how much. `record` is the command as submitted; `names` says
    how its fields are called on the surface that answers."""
    if outcome.code in OK_CODES:
        return None
    if isinstance(record, Schedule | Reschedule | Cancel):
        text = _field_text(outcome, record, config, names)
        if text is not None:
            return text
    return CODE_DOCS.get(outcome.code, str(outcome.code))


def _field_text(
    outcome: EntryOutcome,
    r: Schedule | Reschedule | Cancel,
    config: KernelConfig,
    names: dict[str, str],
) -> str | None:
    code = outcome.code
    if code is Code.TOO_LATE:
        where = f" (attempt {outcome.attempt_id})" if outcome.attempt_id else ""
        return f"the timer crossed Publish Admission{where}: it is being or was delivered"
    if code is Code.ABSENT:
        return "no timer is pending under this key (never scheduled, or no longer pending)"
    if code is Code.TXN_REUSED:
        return f"txn {r.txn!r} is the current generation's: a change needs a new txn"
    if code is Code.SHARD_NOT_ACTIVE:
        return "the timer's shard is frozen by an operator and takes no commands"
    if code is Code.INVALID_IDENTITY:
        return identity_text(r.tenant, r.queue, r.timer_key, config, names)
    if code is Code.INVALID_TXN:
        return txn_text(config)
    if code is Code.VERSION_MISMATCH:
        return (
            f"expected_version {r.expected_version} is not the timer's version "
            f"{outcome.version or 0}"
        )
    if isinstance(r, Cancel):
        return None
    if code is Code.DESTINATION_CHANGED:
        return "a pending timer's destination cannot change: cancel it, or use another key"
    if isinstance(r, Schedule):
        text = _content_text(code, r, config)
        if text is not None:
            return text
    return _timing_text(code, r, config, names)


def _content_text(code: Code, r: Schedule, config: KernelConfig) -> str | None:
    if code is Code.PAYLOAD_TOO_LARGE:
        return payload_too_large_text(r.payload_size, config.max_payload_bytes)
    if code is Code.INVALID_HEADERS:
        return headers_text(config)
    if code is Code.INVALID_CAPABILITY:
        return (
            f"the delivery capability is malformed, or its lead is above "
            f"{config.max_handoff_lead_ms} ms or its clock-ahead bound above "
            f"{config.max_clock_ahead_bound_ms} ms"
        )
    return None


def _timing_text(
    code: Code, r: Schedule | Reschedule, config: KernelConfig, names: dict[str, str]
) -> str | None:
    limits = config.limits
    if code is Code.INVALID_TIMING:
        if (r.deliver_at_ms is None) == (r.delay_ms is None):
            return f"give one of {names['delay_ms']} and {names['deliver_at_ms']}, not both"
        if r.expire_at_ms is not None and r.lifetime_ms is not None:
            return f"give one of {names['expire_at_ms']} and {names['lifetime_ms']}, not both"
        for field in ("delay_ms", "deliver_at_ms", "expire_at_ms", "lifetime_ms"):
            value = getattr(r, field)
            if value is not None and not 0 <= value < MAX_INSTANT_MS:
                return f"{names[field]} must be in [0, 2^53) ms, not {value}"
        return None
    if code is Code.HORIZON_EXCEEDED:
        if r.delay_ms is not None:
            return horizon_text(names["delay_ms"], r.delay_ms, limits.max_delay_horizon_ms)
        return (
            f"{names['deliver_at_ms']} {r.deliver_at_ms} is more than the horizon of "
            f"{limits.max_delay_horizon_ms} ms after the command's persistence time"
        )
    if code is Code.LIFETIME_EXCEEDED:
        return (
            f"the expiry is more than the maximum lifetime of "
            f"{limits.max_message_lifetime_ms} ms after the command's persistence time"
        )
    if code is Code.EXPIRE_BEFORE_WINDOW:
        return (
            f"the expiry leaves less than the minimum delivery window of "
            f"{limits.min_delivery_window_ms} ms after the delivery time"
        )
    return None
