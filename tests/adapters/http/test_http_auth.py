"""Credentials, grants and tenants over a real `HttpServer`: 401 for a missing, malformed or
unknown token on every authenticated route; the grant table of `specs/http.md` exactly; and
another tenant's timers absent on every route."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nereus.adapters.http.contract import ROUTES
from nereus.kernel.keys import message_id
from tests.support.http_harness import (
    QUEUE,
    TOKENS,
    Service,
    cancel,
    config,
    reschedule,
    schedule,
    start_service,
    timer_path,
)


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    with start_service(tmp_path_factory.mktemp("auth"), config()) as s:
        yield s


# One concrete request per route: (method, path, body).
REQUESTS: dict[tuple[str, str], tuple[str, Any]] = {
    ("POST", "/api/v1/timers"): ("/api/v1/timers", {"operations": [cancel("nothing")]}),
    ("DELETE", "/api/v1/timers/{queue}/{timerKey}"): (timer_path("nothing"), None),
    ("GET", "/api/v1/timers/{queue}/{timerKey}"): (timer_path("nothing"), None),
    ("GET", "/api/v1/timers/{queue}"): (f"/api/v1/timers/{QUEUE}", None),
    ("GET", "/api/v1/admin/metering"): ("/api/v1/admin/metering", None),
    ("PUT", "/api/v1/admin/block"): ("/api/v1/admin/block", {"blocked": False}),
    ("POST", "/api/v1/dlq/{queue}/{timerKey}/replay"): (f"/api/v1/dlq/{QUEUE}/k/replay", {}),
    ("GET", "/healthz"): ("/healthz", None),
    ("GET", "/readyz"): ("/readyz", None),
    ("GET", "/metrics"): ("/metrics", None),
    ("GET", "/openapi.json"): ("/openapi.json", None),
}


def test_every_route_has_a_request_here() -> None:
    assert set(REQUESTS) == {(r.method, r.path) for r in ROUTES}


@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Bearer ", "Basic YWNtZTphbGw=", "Bearer acme-all extra", "Bearer nope"],
)
def test_authenticated_routes_answer_401_without_a_valid_token(
    svc: Service, authorization: str | None
) -> None:
    for route in ROUTES:
        path, body = REQUESTS[(route.method, route.path)]
        headers = {} if authorization is None else {"Authorization": authorization}
        reply = svc.call(route.method, path, body, token=None, headers=headers)
        if route.needs == "public":
            assert reply.status == 200, (route, reply.body[:200])
            continue
        assert reply.status == 401, (route, authorization, reply.body[:200])
        assert reply.code == "unauthorized"
        assert reply.headers["www-authenticate"].startswith("Bearer")


def _expected(route_needs: str, grants: list[str]) -> bool:
    return route_needs in ("any", "public") or route_needs in grants


@pytest.mark.parametrize("token", sorted(TOKENS))
def test_the_grant_table(svc: Service, token: str) -> None:
    _, _, grants = TOKENS[token]
    for route in ROUTES:
        path, body = REQUESTS[(route.method, route.path)]
        reply = svc.call(route.method, path, body, token=token)
        if not _expected(route.needs, grants):
            assert reply.status == 403 and reply.code == "missing_grant", (route, token)
            assert route.needs in reply.doc["error"]["message"]
        elif route.path.startswith("/api/v1/dlq/"):
            assert reply.status == 403 and reply.code == "dlq_replay_refused"
        else:
            assert reply.status == 200, (route, token, reply.body[:300])


# The grant table of specs/http.md written out, never read from ROUTES: for each route, the
# class it needs and the answer each credential gets, in the order of CREDENTIALS.
CREDENTIALS = ("acme-all", "acme-producer", "acme-reader", "acme-admin", "acme-nothing", None)
OK = (200, None)
NO_GRANT = (403, "missing_grant")
DLQ_REFUSED = (403, "dlq_replay_refused")
NO_TOKEN = (401, "unauthorized")
GRANT_TABLE: dict[tuple[str, str], tuple[str, tuple[tuple[int, str | None], ...]]] = {
    # route: (class, (all, producer, reader, admin, nothing, no credential))
    ("POST", "/api/v1/timers"): (
        "produce", (OK, OK, NO_GRANT, NO_GRANT, NO_GRANT, NO_TOKEN)
    ),
    ("DELETE", "/api/v1/timers/{queue}/{timerKey}"): ("any", (OK, OK, OK, OK, OK, NO_TOKEN)),
    ("GET", "/api/v1/timers/{queue}/{timerKey}"): (
        "read", (OK, NO_GRANT, OK, NO_GRANT, NO_GRANT, NO_TOKEN)
    ),
    ("GET", "/api/v1/timers/{queue}"): (
        "read", (OK, NO_GRANT, OK, NO_GRANT, NO_GRANT, NO_TOKEN)
    ),
    ("GET", "/api/v1/admin/metering"): (
        "admin", (OK, NO_GRANT, NO_GRANT, OK, NO_GRANT, NO_TOKEN)
    ),
    ("PUT", "/api/v1/admin/block"): (
        "admin", (OK, NO_GRANT, NO_GRANT, OK, NO_GRANT, NO_TOKEN)
    ),
    ("POST", "/api/v1/dlq/{queue}/{timerKey}/replay"): (
        "any", (DLQ_REFUSED,) * 5 + (NO_TOKEN,)
    ),
    ("GET", "/healthz"): ("public", (OK,) * 6),
    ("GET", "/readyz"): ("public", (OK,) * 6),
    ("GET", "/metrics"): ("public", (OK,) * 6),
    ("GET", "/openapi.json"): ("public", (OK,) * 6),
}  # fmt: skip


def test_the_grant_table_as_written_in_the_spec() -> None:
    """Each route needs the class the spec gives it: a route added, dropped or moved to
    another class must be written here too."""
    assert {(r.method, r.path): r.needs for r in ROUTES} == {
        route: needs for route, (needs, _) in GRANT_TABLE.items()
    }
    assert [TOKENS[t][2] for t in CREDENTIALS if t is not None] == [
        ["produce", "read", "admin"],
        ["produce"],
        ["read"],
        ["admin"],
        [],
    ]


@pytest.mark.parametrize("route", list(GRANT_TABLE), ids="_".join)
def test_each_credential_gets_the_answer_the_grant_table_gives(
    svc: Service, route: tuple[str, str]
) -> None:
    method, _ = route
    path, body = REQUESTS[route]
    _, answers = GRANT_TABLE[route]
    for token, (status, code) in zip(CREDENTIALS, answers, strict=True):
        reply = svc.call(method, path, body, token=token)
        assert (reply.status, reply.code) == (status, code), (
            route,
            token,
            reply.body[:300],
        )


def test_a_token_without_any_grant_can_still_cancel(svc: Service) -> None:
    (r,) = svc.post(schedule("cleanup/1"), token="acme-producer")
    assert r["status"] == "scheduled"
    reply = svc.call("DELETE", timer_path("cleanup/1"), token="acme-nothing")
    assert reply.status == 200 and reply.doc["status"] == "canceled"
    assert reply.doc["messageId"] == r["messageId"]
    # A read-only token too.
    svc.post(schedule("cleanup/2"), token="acme-producer")
    reply = svc.call("DELETE", timer_path("cleanup/2"), token="acme-reader")
    assert reply.status == 200 and reply.doc["status"] == "canceled"


def test_records_carry_the_tokens_tenant_and_subject(svc: Service) -> None:
    (r,) = svc.post(schedule("who/1"), token="acme-producer")
    assert r["messageId"] == message_id("acme", QUEUE, "who/1")
    peek = svc.call("GET", timer_path("who/1"), token="acme-reader").doc
    assert peek["producerSub"] == "billing-service" and peek["found"] is True
    (g,) = svc.post(schedule("who/1"), token="globex-all")
    assert g["messageId"] == message_id("globex", QUEUE, "who/1") != r["messageId"]
    assert svc.call("GET", timer_path("who/1"), token="globex-all").doc["producerSub"] == (
        "globex-ops"
    )


def test_another_tenants_timer_is_absent_on_every_route(svc: Service) -> None:
    key = "isolated/key"
    (mine,) = svc.post(schedule(key, payload=b"acme's", txn="a-1"), token="acme-all")
    assert mine["status"] == "scheduled"
    before = svc.call("GET", timer_path(key), token="acme-all").doc
    # Peek and list.
    assert svc.call("GET", timer_path(key), token="globex-all").doc == {"found": False}
    page = svc.call("GET", f"/api/v1/timers/{QUEUE}", token="globex-all").doc
    assert key not in [row["timerKey"] for row in page["rows"]]
    # Cancel (DELETE and in a batch), reschedule: absent, and the timer is untouched.
    reply = svc.call("DELETE", timer_path(key) + "?txn=a-1", token="globex-all")
    assert reply.status == 200 and reply.doc["status"] == "absent" and reply.doc["ok"] is False
    assert "messageId" not in reply.doc
    results = svc.post(
        cancel(key), reschedule(key, 1_000), cancel(key, txn="a-1"), token="globex-all"
    )
    assert [r["status"] for r in results] == ["absent", "absent", "absent"]
    # The DLQ route refuses alike, whoever asks.
    reply = svc.call("POST", f"/api/v1/dlq/{QUEUE}/{key}/replay", {}, token="globex-all")
    assert reply.code == "dlq_replay_refused"
    # Its own schedule of the same key is its own timer.
    (theirs,) = svc.post(schedule(key, payload=b"globex's", txn="a-1"), token="globex-all")
    assert theirs["status"] == "scheduled" and theirs["messageId"] != mine["messageId"]
    # Acme's timer is exactly as it was, apart from nothing.
    after = svc.call("GET", timer_path(key), token="acme-all").doc
    assert after == before and after["status"] == "SCHEDULED"
    rows = svc.call("GET", f"/api/v1/timers/{QUEUE}", token="acme-all").doc["rows"]
    assert [r["messageId"] for r in rows if r["timerKey"] == key] == [mine["messageId"]]
    # Metering and blocks are per tenant too.
    svc.call("PUT", "/api/v1/admin/block", {"blocked": True}, token="globex-all")
    try:
        (ok,) = svc.post(schedule("still/producing"), token="acme-all")
        assert ok["status"] == "scheduled"
    finally:
        svc.call("PUT", "/api/v1/admin/block", {"blocked": False}, token="globex-all")


def test_the_default_tenancy_needs_no_credential(tmp_path: Path) -> None:
    with start_service(tmp_path) as s:
        (r,) = s.post(schedule("k"), token="whatever")
        assert r["messageId"] == message_id("default", QUEUE, "k")
        reply = s.call("GET", timer_path("k"), token=None)
        assert reply.status == 200 and reply.doc["producerSub"] is None
        assert s.call("GET", "/api/v1/admin/metering", token=None).doc["tenant"] == "default"
