"""Plan limits and blocks over a real `HttpServer`: horizon, payload ceiling, batch and body
size, rate limit, quota, admin/operator block and storage full. A refused batch appends
nothing; a block refuses a producing batch whole with the hint header and never a cancel."""

from __future__ import annotations

import base64
import json
import socket
from pathlib import Path
from typing import Any

import pytest

from nereus.adapters.http.contract import HINT_HEADER, HINT_VALUE, MAX_OPERATIONS
from nereus.runtime.errors import Overloaded
from tests.support.http_harness import (
    QUEUE,
    Reply,
    Service,
    cancel,
    config,
    reschedule,
    schedule,
    start_service,
    timer_path,
)

HOUR_MS = 3_600_000


def _refused(svc: Service, ops: list[dict[str, Any]], status: int, code: str, **kw: Any) -> Reply:
    before = svc.log_end
    reply = svc.call("POST", "/api/v1/timers", {"operations": ops}, **kw)
    assert (reply.status, reply.code) == (status, code), reply.body[:300]
    assert reply.doc["error"]["message"]
    assert svc.log_end == before, "a refused batch reached the log"
    return reply


def test_horizon_is_the_narrowest_of_kernel_cell_and_tenant(tmp_path: Path) -> None:
    doc = config(acme={"horizon_ms": HOUR_MS})
    doc["cell"] = {"horizon_ms": 2 * HOUR_MS}
    with start_service(tmp_path, doc) as svc:
        (r,) = svc.post(schedule("at", HOUR_MS))
        assert r["status"] == "scheduled"
        reply = _refused(
            svc, [schedule("ok", 1), schedule("over", HOUR_MS + 1)], 403, "horizon_exceeded"
        )
        assert "operations[1]" in reply.doc["error"]["message"]
        _refused(svc, [reschedule("at", HOUR_MS + 1)], 403, "horizon_exceeded")
        (r,) = svc.post(reschedule("at", HOUR_MS))
        assert r["status"] == "rescheduled"
        # globex has only the cell's horizon.
        (g,) = svc.post(schedule("at", 2 * HOUR_MS), token="globex-all")
        assert g["status"] == "scheduled"
        _refused(svc, [schedule("x", 2 * HOUR_MS + 1)], 403, "horizon_exceeded", token="globex-all")
        # A delay no instant can hold is invalid timing, as the kernel and the library say
        # (checked before the horizon, in the kernel's order); never a 5xx.
        _refused(svc, [schedule("x", 10**30)], 400, "invalid_timing")
        _refused(svc, [schedule("x", 2**53)], 400, "invalid_timing")


def test_payload_ceiling_is_min_of_plan_and_cell(tmp_path: Path) -> None:
    doc = config(acme={"max_payload_bytes": 100})
    doc["cell"] = {"max_payload_bytes": 200}
    with start_service(tmp_path, doc) as svc:
        svc.post(schedule("a", payload=b"p" * 100))
        _refused(svc, [schedule("b", payload=b"p" * 101)], 413, "payload_too_large")
        svc.post(schedule("a", payload=b"p" * 200), token="globex-all")
        _refused(
            svc, [schedule("b", payload=b"p" * 201)], 413, "payload_too_large", token="globex-all"
        )


def test_batches_are_1_to_256_operations(tmp_path: Path) -> None:
    with start_service(tmp_path, config()) as svc:
        _refused(svc, [], 400, "invalid_batch")
        ops = [schedule(f"k{i}") for i in range(MAX_OPERATIONS + 1)]
        _refused(svc, ops, 400, "invalid_batch")
        results = svc.post(*ops[:MAX_OPERATIONS])
        assert {r["status"] for r in results} == {"scheduled"}


@pytest.mark.parametrize(
    "field", [{"producerSub": "me"}, {"messageId": "0" * 32}, {"tenant": "globex"}, {"_x": 1}]
)
def test_server_owned_fields_are_refused(tmp_path: Path, field: dict[str, Any]) -> None:
    with start_service(tmp_path, config()) as svc:
        for bad in (schedule("k", **field), reschedule("k", 1, **field), cancel("k", **field)):
            _refused(svc, [schedule("fine"), bad], 400, "server_owned_field")
        _refused(svc, [schedule("k", headers={"Nereus-Tenant": "x"})], 400, "server_owned_field")


def test_the_body_limit_comes_from_the_config(tmp_path: Path) -> None:
    doc = config()
    doc["server"] = {"max_body_bytes": 2_000}
    with start_service(tmp_path, doc) as svc:
        big = json.dumps({"operations": [schedule("k", payload=b"x" * 3_000)]}).encode()
        before = svc.log_end
        reply = svc.call("POST", "/api/v1/timers", raw=big)
        assert (reply.status, reply.code) == (413, "body_too_large")
        assert reply.headers.get("connection") == "close"
        assert svc.log_end == before
        # Refused before it is read: a declared length is enough, the body never comes.
        with socket.create_connection(("127.0.0.1", svc.server.port), timeout=10) as sock:
            sock.sendall(
                b"POST /api/v1/timers HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer acme-all\r\n"
                b"Content-Length: 999999999\r\n\r\n"
            )
            head = _read_all(sock)
        assert head.startswith("HTTP/1.1 413") and "body_too_large" in head


def _read_all(sock: socket.socket) -> str:
    """The whole answer: the server closes the connection after it."""
    chunks = []
    while chunk := sock.recv(4096):
        chunks.append(chunk)
    return b"".join(chunks).decode()


def test_malformed_http_is_400(tmp_path: Path) -> None:
    with start_service(tmp_path, config()) as svc:
        for head in (
            b"Content-Length: -5\r\n",
            b"Content-Length: many\r\n",
            b"Transfer-Encoding: chunked\r\n",
        ):
            with socket.create_connection(("127.0.0.1", svc.server.port), timeout=10) as sock:
                sock.sendall(b"POST /api/v1/timers HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n")
                answer = _read_all(sock)
            assert answer.startswith("HTTP/1.1 400") and "malformed_request" in answer, head


def test_the_rate_limit_counts_operations_and_never_delete(tmp_path: Path) -> None:
    with start_service(tmp_path, config(acme={"max_ops_per_s": 4})) as svc:
        svc.post(schedule("a"), schedule("b"), schedule("c"))
        svc.post(cancel("c"))  # cancels count too: 4 of 4
        reply = _refused(svc, [cancel("a")], 429, "rate_limited")
        assert reply.headers["retry-after"] == "1"
        # DELETE is never rate limited.
        for key in ("a", "b"):
            assert svc.call("DELETE", timer_path(key)).doc["status"] == "canceled"
        # Another tenant has its own (unlimited) budget.
        svc.post(*[schedule(f"g{i}") for i in range(10)], token="globex-all")
        svc.clock_s[0] += 0.5  # two tokens back
        svc.post(schedule("d"), schedule("e"))
        _refused(svc, [schedule("f")], 429, "rate_limited")
        svc.clock_s[0] += 10
        # A batch larger than one second's worth waits for a full bucket, then goes (in debt).
        svc.post(*[schedule(f"big{i}") for i in range(10)])
        reply = _refused(svc, [schedule("g")], 429, "rate_limited")
        assert reply.headers["retry-after"] == str(2)  # 6 in debt + 1 needed, at 4/s


def _blocked(svc: Service, ops: list[dict[str, Any]], status: int, code: str) -> None:
    reply = _refused(svc, ops, status, code)
    assert reply.headers[HINT_HEADER] == HINT_VALUE


def test_over_quota_refuses_producing_batches_whole_but_never_cancels(tmp_path: Path) -> None:
    with start_service(tmp_path, config(acme={"max_live_timers": 2})) as svc:
        svc.post(schedule("a"), schedule("b"))
        for ops in (
            [schedule("c")],
            [reschedule("a", 5)],
            [cancel("a"), schedule("c")],  # mixed: refused whole, the cancel too
            [schedule("c"), cancel("a")],
        ):
            _blocked(svc, ops, 403, "over_quota")
        assert svc.call("GET", timer_path("a")).doc["status"] == "SCHEDULED"
        # A cancels-only batch passes, and so does DELETE (even without the produce grant).
        (r,) = svc.post(cancel("a"))
        assert r["status"] == "canceled"
        reply = svc.call("DELETE", timer_path("b"), token="acme-nothing")
        assert reply.doc["status"] == "canceled"
        # Below the quota again: producing works.
        assert svc.post(schedule("c"))[0]["status"] == "scheduled"


def test_byte_quota(tmp_path: Path) -> None:
    with start_service(tmp_path, config(acme={"max_bytes": 10})) as svc:
        svc.post(schedule("a", payload=b"x" * 9))
        # The batch counts itself: 9 + 5 bytes would pass 10, so nothing of it goes in.
        _blocked(svc, [schedule("b", payload=b"x" * 5)], 403, "over_quota")
        svc.post(schedule("b", payload=b"x"))  # 9 + 1 reaches 10 exactly: admitted
        _blocked(svc, [schedule("c", payload=b"")], 403, "over_quota")  # at the quota
        assert svc.call("DELETE", timer_path("a")).doc["status"] == "canceled"
        svc.post(schedule("c", payload=b""))


def test_admin_and_operator_blocks(tmp_path: Path) -> None:
    with start_service(tmp_path, config(globex={"blocked": True})) as svc:
        svc.post(schedule("a"))
        reply = svc.call("PUT", "/api/v1/admin/block", {"blocked": True}, token="acme-admin")
        assert reply.status == 200
        assert reply.doc == {"tenant": "acme", "adminBlocked": True, "blocked": True}
        _blocked(svc, [schedule("b")], 403, "produce_blocked")
        _blocked(svc, [cancel("a"), reschedule("a", 5)], 403, "produce_blocked")
        assert svc.call("DELETE", timer_path("a"), token="acme-reader").doc["status"] == "canceled"
        assert svc.post(cancel("zzz"))[0]["status"] == "absent"
        reply = svc.call("PUT", "/api/v1/admin/block", {"blocked": False}, token="acme-admin")
        assert reply.doc == {"tenant": "acme", "adminBlocked": False, "blocked": False}
        svc.post(schedule("b"))
        # globex is blocked by the config: an admin unblock does not lift the config's.
        reply = svc.call("PUT", "/api/v1/admin/block", {"blocked": False}, token="globex-all")
        assert reply.doc == {"tenant": "globex", "adminBlocked": False, "blocked": True}
        reply = svc.call(
            "POST", "/api/v1/timers", {"operations": [schedule("b")]}, token="globex-all"
        )
        assert reply.code == "produce_blocked"
        for body, code in (
            (b"{", "malformed_json"),
            (b"[]", "invalid_body"),
            (b'{"blocked": 1}', "invalid_body"),
            (b'{"blocked": true, "x": 1}', "invalid_body"),
        ):
            reply = svc.call("PUT", "/api/v1/admin/block", raw=body, token="acme-admin")
            assert (reply.status, reply.code) == (400, code)


def test_the_server_block_covers_every_tenant(tmp_path: Path) -> None:
    doc = config()
    doc["server"] = {"blocked": True}
    with start_service(tmp_path, doc) as svc:
        for token in ("acme-all", "globex-all"):
            reply = _refused(svc, [schedule("a")], 403, "produce_blocked", token=token)
            assert reply.headers[HINT_HEADER] == HINT_VALUE
            assert svc.post(cancel("a"), token=token)[0]["status"] == "absent"


def test_storage_full_at_95_percent(tmp_path: Path) -> None:
    with start_service(tmp_path, config()) as svc:
        assert 0 < svc.backend.map_usage() < 0.95  # the real gauge
        svc.post(schedule("a"))
        svc.backend.map_fraction = 0.95
        _blocked(svc, [schedule("b")], 503, "storage_full")
        assert svc.call("DELETE", timer_path("a")).doc["status"] == "canceled"
        assert svc.post(cancel("b"))[0]["status"] == "absent"
        svc.backend.map_fraction = 0.9499
        svc.post(schedule("b"))


def test_delete_needs_a_booted_service_only(tmp_path: Path) -> None:
    with start_service(tmp_path, config(acme={"max_live_timers": 0, "max_ops_per_s": 1})) as svc:
        svc.call("PUT", "/api/v1/admin/block", {"blocked": True})
        svc.backend.map_fraction = 0.99
        # Over quota, blocked, storage full, rate spent, no grant: DELETE still answers.
        assert svc.post(cancel("x"))[0]["status"] == "absent"
        _refused(svc, [cancel("x")], 429, "rate_limited")
        for _ in range(3):
            reply = svc.call("DELETE", timer_path("x"), token="acme-nothing")
            assert reply.status == 200 and reply.doc["status"] == "absent"
        svc.backend.booted = False
        reply = svc.call("DELETE", timer_path("x"), token="acme-nothing")
        assert (reply.status, reply.code) == (503, "not_booted")
        # Authentication still comes first.
        assert svc.call("DELETE", timer_path("x"), token=None).code == "unauthorized"


def test_intake_full_is_429_overloaded_and_commit_failures_503(tmp_path: Path) -> None:
    with start_service(tmp_path, config()) as svc:
        svc.backend.fail_execute = Overloaded("intake queue full")
        reply = _refused(svc, [schedule("a")], 429, "overloaded")
        assert reply.headers["retry-after"] == "1"
        assert svc.call("DELETE", timer_path("a")).code == "overloaded"
        svc.backend.fail_execute = TimeoutError("no answer in time")
        _refused(svc, [schedule("a")], 503, "unavailable")
        svc.backend.fail_execute = None
        assert svc.post(schedule("a"))[0]["status"] == "scheduled"


def test_reschedule_op(tmp_path: Path) -> None:
    with start_service(tmp_path, config()) as svc:
        (s,) = svc.post(schedule("r", 60_000, txn="s-1"))
        (r,) = svc.post(reschedule("r", 120_000, txn="r-1"))
        assert r["ok"] is True and r["status"] == "rescheduled" and r["txn"] == "r-1"
        assert r["messageId"] == s["messageId"] and r["deliverAt"] > s["deliverAt"]
        (again,) = svc.post(reschedule("r", 120_000, txn="r-1"))
        assert again["status"] == "unchanged" and again["ok"] is True
        (minted,) = svc.post(reschedule("r", 30_000))
        assert minted["status"] == "rescheduled" and minted["txn"] not in ("r-1", "s-1")
        peek = svc.call("GET", timer_path("r")).doc
        assert peek["generation"] == 3 and peek["txn"] == minted["txn"]
        assert base64_payload(peek) == b"x"  # same content
        (gone,) = svc.post(reschedule("never", 1_000))
        assert gone["ok"] is False and gone["status"] == "absent"
        _refused(
            svc,
            [{"op": "reschedule", "queue": QUEUE, "timerKey": "r", "payload": ""}],
            400,
            "invalid_operation",
        )


def base64_payload(peek: dict[str, Any]) -> bytes:
    return base64.b64decode(peek["payload"])
