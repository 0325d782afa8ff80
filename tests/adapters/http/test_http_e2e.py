"""The HTTP timer API end to end: a real `HttpServer` on loopback, a real LMDB shard store and
local destination, the host clock with an assumed error of 2 ms, and the runtime thread.

Timers go in over HTTP and are read back from the local destination: all arrive, none before
deliverAt. Cancels, upserts and retries answer from the closed status list; refused requests
answer 4xx with codes from `ERROR_CODES` and leave the shard log untouched. Only "never
early" is a timing assertion; lateness is not asserted (the machine is shared).
"""

from __future__ import annotations

import base64
import json
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nereus.adapters.http.contract import ERROR_CODES, MAX_OPERATIONS, STATUSES
from nereus.adapters.local.destination import LocalDestination, LocalRecord
from nereus.kernel.keys import message_id
from nereus.kernel.records import PublishAdmission
from tests.support import http_harness
from tests.support.builders import records

QUEUE = http_harness.QUEUE


class Service(http_harness.Service):
    """The shared harness's service without a config: no credentials are sent."""

    @property
    def destination(self) -> LocalDestination:
        dest = self.nereus.destination
        assert isinstance(dest, LocalDestination)
        return dest

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, str, bytes]:
        reply = self.call(method, path, raw=body, token=None)
        return reply.status, reply.headers.get("content-type", ""), reply.body

    def json(self, method: str, path: str, doc: Any = None) -> tuple[int, Any]:
        body = None if doc is None else json.dumps(doc).encode()
        status, ctype, raw = self.request(method, path, body)
        assert ctype.startswith("application/json"), (status, ctype, raw[:200])
        return status, json.loads(raw)

    def post(self, *ops: dict[str, Any], token: str | None = None) -> list[dict[str, Any]]:
        return super().post(*ops, token=token)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    with http_harness.start_service(tmp_path / "data") as svc:
        yield Service(svc.nereus, svc.backend, svc.api, svc.server, svc.clock_s)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _schedule(key: str, delay_ms: int, payload: bytes = b"x", **extra: Any) -> dict[str, Any]:
    return {
        "op": "schedule",
        "queue": QUEUE,
        "timerKey": key,
        "delayMs": delay_ms,
        "payload": _b64(payload),
        **extra,
    }


def _path(key: str, queue: str = QUEUE) -> str:
    return f"/api/v1/timers/{queue}/{key}"


def _by_key(records: list[LocalRecord]) -> dict[str, list[LocalRecord]]:
    out: dict[str, list[LocalRecord]] = {}
    for r in records:
        out.setdefault(r.partition or "", []).append(r)
    return out


def test_timers_from_0_to_2000_ms_all_arrive_and_none_early(service: Service) -> None:
    delays = [0, 0, 1, 5, 20, 50, 100, 250, 400, 700, 1000, 1300, 1600, 2000]
    ops = [
        _schedule(f"t{i}/d{d}", d, f"payload {i}".encode(), partition=f"t{i}/d{d}", txn=f"x{i}")
        for i, d in enumerate(delays)
    ]
    results = service.post(*ops)
    for op, r in zip(ops, results, strict=True):
        assert r["ok"] is True and r["status"] == "scheduled", r
        assert r["queue"] == QUEUE and r["timerKey"] == op["timerKey"] and r["txn"] == op["txn"]
        assert r["messageId"] == message_id("default", QUEUE, op["timerKey"])
        assert isinstance(r["deliverAt"], int)
    # One batch, one persistence time: deliverAt differs exactly by the delays.
    base = results[0]["deliverAt"] - delays[0]
    assert [r["deliverAt"] - base for r in results] == delays

    service.wait_for("all deliveries", lambda: len(service.delivered()) >= len(ops))
    time.sleep(0.1)  # anything extra would be a duplicate
    records = _by_key(service.delivered())
    assert sorted(records) == sorted(op["timerKey"] for op in ops)
    for op, r in zip(ops, results, strict=True):
        (rec,) = records[op["timerKey"]]
        assert rec.delivered_at_ms >= rec.deliver_at_ms, f"early: {rec}"
        assert rec.deliver_at_ms == r["deliverAt"]
        assert rec.message_id == r["messageId"] and rec.txn == op["txn"]
        assert rec.payload == base64.b64decode(op["payload"])
        headers = dict(rec.headers)
        assert headers["nereus-message-id"] == r["messageId"]
        assert headers["nereus-attempt-id"] == rec.attempt_id
        assert headers["nereus-deliver-at"] == str(r["deliverAt"])
        status, peek = service.json("GET", _path(op["timerKey"]))
        assert status == 200 and peek["found"] is True and peek["status"] == "DELIVERED"


def test_cancel_before_the_fire_wins_and_nothing_is_delivered(service: Service) -> None:
    (doomed,) = service.post(_schedule("doomed/1", 800, b"never"))
    assert doomed["status"] == "scheduled"
    status, result = service.json("DELETE", _path("doomed/1"))
    assert status == 200
    assert result["ok"] is True and result["status"] == "canceled", result
    assert result["messageId"] == doomed["messageId"]
    # A sentinel due after the canceled one: once it arrived, the canceled one had its chance.
    (sentinel,) = service.post(_schedule("sentinel", 1_000))
    service.wait_for("the sentinel", lambda: bool(service.delivered()))
    assert time.time() * 1000 > doomed["deliverAt"]
    assert [r.partition for r in service.delivered()] == [None]
    assert [r.message_id for r in service.delivered()] == [sentinel["messageId"]]
    status, peek = service.json("GET", _path("doomed/1"))
    assert peek["found"] is True and peek["status"] == "CANCELED" and peek["attempts"] == 0
    admitted = {
        r.message_id
        for r in records(service.nereus.store.iter_log())
        if isinstance(r, PublishAdmission)
    }
    assert doomed["messageId"] not in admitted


def test_cancel_after_delivery_is_too_late_with_the_evidence(service: Service) -> None:
    (r,) = service.post(_schedule("early/bird", 0, b"fast", txn="eb-1"))
    service.wait_for("the delivery", lambda: bool(service.delivered()))
    (rec,) = service.delivered()
    service.wait_for(
        "the outcome", lambda: service.json("GET", _path("early/bird"))[1]["status"] == "DELIVERED"
    )
    status, result = service.json("DELETE", _path("early/bird") + "?txn=eb-1")
    assert status == 200
    assert result["ok"] is False and result["status"] == "too_late", result
    assert result["attemptId"] == rec.attempt_id
    assert result["messageId"] == r["messageId"]
    assert result["evidence"] == {
        "destination": QUEUE,
        "partition": 0,
        "offset": rec.offset,
        "timestamp": rec.delivered_at_ms,
    }
    # The same through a batch cancel.
    (batch,) = service.post({"op": "cancel", "queue": QUEUE, "timerKey": "early/bird"})
    assert batch["ok"] is False and batch["status"] == "too_late"
    assert batch["attemptId"] == rec.attempt_id and batch["evidence"]["offset"] == rec.offset
    assert len(service.delivered()) == 1


def test_cancel_of_a_never_scheduled_key_is_absent(service: Service) -> None:
    status, result = service.json("DELETE", _path("never/was"))
    assert status == 200
    assert result["ok"] is False and result["status"] == "absent", result
    assert "messageId" not in result
    (batch,) = service.post({"op": "cancel", "queue": QUEUE, "timerKey": "nor/this"})
    assert batch["ok"] is False and batch["status"] == "absent"
    # Cancelling twice: the second answers absent.
    service.post(_schedule("twice", 60_000))
    assert service.json("DELETE", _path("twice"))[1]["status"] == "canceled"
    assert service.json("DELETE", _path("twice"))[1]["status"] == "absent"


def test_schedule_is_an_upsert_and_an_identical_retry_is_unchanged(service: Service) -> None:
    first, retried = service.post(
        _schedule("up/sert", 600, b"old", txn="t-1"),
        _schedule("re/try", 300, b"same", txn="r-1"),
    )
    assert first["status"] == "scheduled" and retried["status"] == "scheduled"
    # Changed content before the fire: a new generation with the new payload.
    (upsert,) = service.post(_schedule("up/sert", 600, b"new", txn="t-2"))
    assert upsert["ok"] is True and upsert["status"] == "rescheduled", upsert
    assert upsert["txn"] == "t-2" and upsert["messageId"] == first["messageId"]
    # The identical request again (same txn, same content): nothing changes.
    (same,) = service.post(_schedule("re/try", 300, b"same", txn="r-1"))
    assert same["ok"] is True and same["status"] == "unchanged", same
    assert same["messageId"] == retried["messageId"]

    service.wait_for("both timers", lambda: len(service.delivered()) >= 2)
    time.sleep(0.1)
    records = _by_key(service.delivered())
    by_mid = {r.message_id: r for rs in records.values() for r in rs}
    assert len(service.delivered()) == 2
    assert by_mid[first["messageId"]].payload == b"new"
    assert by_mid[first["messageId"]].txn == "t-2"
    assert by_mid[first["messageId"]].deliver_at_ms == upsert["deliverAt"]
    assert by_mid[retried["messageId"]].payload == b"same"
    for r in by_mid.values():
        assert r.delivered_at_ms >= r.deliver_at_ms
    # A retry after delivery still answers unchanged and delivers nothing more.
    (late,) = service.post(_schedule("re/try", 300, b"same", txn="r-1"))
    assert late["status"] == "unchanged"
    time.sleep(0.5)
    assert len(service.delivered()) == 2


def _refused(service: Service, body: bytes, status: int, code: str) -> None:
    before = service.nereus.store.log_last_position
    got, ctype, raw = service.request("POST", "/api/v1/timers", body)
    assert got == status, raw[:300]
    assert ctype.startswith("application/json")
    doc = json.loads(raw)
    assert doc["error"]["code"] == code, doc
    assert code in ERROR_CODES
    assert doc["error"]["message"]
    time.sleep(0.05)
    assert service.nereus.store.log_last_position == before, "a refused batch reached the log"


@pytest.mark.parametrize(
    "field",
    [
        {"producerSub": "me"},
        {"messageId": "0" * 32},
        {"tenant": "other"},
        {"_x": 1},
        {"_": None},
    ],
    ids=["producerSub", "messageId", "tenant", "_x", "_"],
)
def test_server_owned_fields_are_refused_and_nothing_of_the_batch_is_appended(
    service: Service, field: dict[str, Any]
) -> None:
    good = _schedule("fine", 60_000)
    for bad in (
        _schedule("owned", 1_000, **field),
        {"op": "cancel", "queue": QUEUE, "timerKey": "k", **field},
    ):
        body = json.dumps({"operations": [good, bad]}).encode()
        _refused(service, body, 400, "server_owned_field")
    # And as the first operation of the batch, too.
    body = json.dumps({"operations": [_schedule("owned", 1_000, **field), good]}).encode()
    _refused(service, body, 400, "server_owned_field")
    assert service.json("GET", _path("fine")) == (200, {"found": False})


def test_reserved_headers_are_server_owned(service: Service) -> None:
    op = _schedule("h", 1_000, headers={"nereus-message-id": "forged"})
    _refused(service, json.dumps({"operations": [op]}).encode(), 400, "server_owned_field")


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", "malformed_json"),
        (b"", "malformed_json"),
        (b"[]", "invalid_batch"),
        (b'{"ops": []}', "invalid_batch"),
        (b'{"operations": {}}', "invalid_batch"),
        (b'{"operations": []}', "invalid_batch"),
        (b'{"operations": [], "extra": 1}', "invalid_batch"),
        (
            b'{"operations": [{"op": "explode", "queue": "q", "timerKey": "k"}]}',
            "invalid_operation",
        ),
        (b'{"operations": [{"op": "schedule", "queue": "q"}]}', "invalid_operation"),
        (
            b'{"operations": [{"op": "schedule", "queue": "q", "timerKey": "k", "colour": "red"}]}',
            "invalid_operation",
        ),
        (
            b'{"operations": [{"op": "schedule", "queue": "q", "timerKey": "k", "delayMs": -1}]}',
            "invalid_timing",
        ),
        (
            b'{"operations": [{"op": "schedule", "queue": "q", "timerKey": "k", "delayMs": "5"}]}',
            "invalid_operation",
        ),
        (
            b'{"operations": [{"op": "schedule", "queue": "q", "timerKey": "k", "payload": "!!"}]}',
            "invalid_operation",
        ),
        (
            b'{"operations": [{"op": "schedule", "queue": "a/b", "timerKey": "k"}]}',
            "invalid_identity",
        ),
        (
            b'{"operations": [{"op": "schedule", "queue": "q", "timerKey": ""}]}',
            "invalid_identity",
        ),
        (
            b'{"operations": [{"op": "cancel", "queue": "q", "timerKey": "k", "delayMs": 1}]}',
            "invalid_operation",
        ),
        (b'{"operations": ["schedule"]}', "invalid_operation"),
    ],
)
def test_malformed_batches_are_refused_whole(service: Service, body: bytes, code: str) -> None:
    good = _schedule("fine", 60_000)
    _refused(service, body, 400, code)
    doc = json.loads(body) if code not in ("malformed_json",) else None
    if isinstance(doc, dict) and isinstance(doc.get("operations"), list) and doc["operations"]:
        # The same bad operation after a good one: the good one is not appended either.
        mixed = {"operations": [good, *doc["operations"]]}
        _refused(service, json.dumps(mixed).encode(), 400, code)


def test_too_many_operations_are_refused(service: Service) -> None:
    ops = [_schedule(f"k{i}", 60_000) for i in range(MAX_OPERATIONS + 1)]
    _refused(service, json.dumps({"operations": ops}).encode(), 400, "invalid_batch")
    results = service.post(*ops[:MAX_OPERATIONS])
    assert {r["status"] for r in results} == {"scheduled"}


def test_a_payload_over_the_ceiling_is_413(service: Service) -> None:
    ceiling = service.nereus.store.config.max_payload_bytes
    at = _schedule("at/ceiling", 60_000, b"a" * ceiling)
    over = _schedule("over/ceiling", 60_000, b"a" * (ceiling + 1))
    _refused(service, json.dumps({"operations": [at, over]}).encode(), 413, "payload_too_large")
    (r,) = service.post(at)
    assert r["status"] == "scheduled"


def test_routes_methods_and_peek(service: Service) -> None:
    for method, path in [
        ("GET", "/"),
        ("GET", "/api/v1/timer"),
        ("GET", "/api/v2/timers"),
        ("POST", "/api/v1/timerz"),
    ]:
        status, doc = service.json(method, path)
        assert status == 404 and doc["error"]["code"] == "not_found", (method, path, doc)
    for method, path in [
        ("GET", "/api/v1/timers"),
        ("PUT", "/api/v1/timers"),
        ("DELETE", "/api/v1/timers"),
        ("POST", _path("k")),
        ("PUT", _path("k")),
        ("PATCH", _path("k")),
        ("POST", "/metrics"),
        ("DELETE", "/healthz"),
    ]:
        status, doc = service.json(method, path, {} if method != "GET" else None)
        assert status == 405 and doc["error"]["code"] == "method_not_allowed", (method, path)
        assert doc["error"]["code"] in ERROR_CODES
    assert service.json("GET", _path("no/such/timer")) == (200, {"found": False})
    assert service.json("GET", _path("k", queue="otherqueue")) == (200, {"found": False})
    status, health = service.json("GET", "/healthz")
    assert status == 200 and health["ok"] is True


@pytest.mark.parametrize(
    ("key", "encoded"),
    [
        ("a/b", "a/b"),
        ("trial/acme/day/7", "trial/acme/day/7"),
        ("/leading", "/leading"),
        ("trailing/", "trailing/"),
        ("sla%sh/es", "sla%25sh%2Fes"),
        ("spaces and ü", urllib.parse.quote("spaces and ü", safe="")),
    ],
)
def test_timer_keys_with_slashes_work_on_every_route(
    service: Service, key: str, encoded: str
) -> None:
    (r,) = service.post(_schedule(key, 60_000, b"slashed", txn="s-1"))
    assert r["ok"] is True and r["timerKey"] == key
    assert r["messageId"] == message_id("default", QUEUE, key)
    status, peek = service.json("GET", f"/api/v1/timers/{QUEUE}/{encoded}")
    assert status == 200 and peek["found"] is True, peek
    assert peek["timerKey"] == key and peek["messageId"] == r["messageId"]
    assert peek["status"] == "SCHEDULED" and base64.b64decode(peek["payload"]) == b"slashed"
    status, result = service.json("DELETE", f"/api/v1/timers/{QUEUE}/{encoded}?txn=s-1")
    assert status == 200 and result["status"] == "canceled" and result["timerKey"] == key
    assert result["messageId"] == r["messageId"]
    assert service.json("GET", f"/api/v1/timers/{QUEUE}/{encoded}")[1]["status"] == "CANCELED"


def test_result_statuses_come_from_the_closed_list(service: Service) -> None:
    results = service.post(
        _schedule("s1", 60_000, txn="a"),
        _schedule("s1", 60_000, txn="a"),
        _schedule("s1", 60_000, b"changed", txn="b"),
        {"op": "cancel", "queue": QUEUE, "timerKey": "s1"},
        {"op": "cancel", "queue": QUEUE, "timerKey": "s1"},
    )
    assert [r["status"] for r in results] == [
        "scheduled",
        "unchanged",
        "rescheduled",
        "canceled",
        "absent",
    ]
    assert [r["ok"] for r in results] == [True, True, True, True, False]
    assert all(r["status"] in STATUSES for r in results)


def _metric(text: str, name: str, labels: str = "") -> float:
    pattern = rf"^{re.escape(name)}{re.escape(labels)} (\S+)$"
    match = re.search(pattern, text, re.M)
    assert match, f"{name}{labels} not in /metrics"
    return float(match.group(1))


def test_metrics_export_fire_lag_claims_admissions_outcomes_and_clock_bound(
    service: Service,
) -> None:
    service.post(*[_schedule(f"m{i}", 10 * i) for i in range(5)])
    service.wait_for("deliveries", lambda: len(service.delivered()) >= 5)
    service.wait_for(
        "outcomes",
        lambda: (
            service.nereus.runtime.metrics.value("nereus_outcomes_total", {"class": "PUBLISHED"})
            >= 5
        ),
    )
    status, ctype, raw = service.request("GET", "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    text = raw.decode()
    assert re.search(r"^# TYPE nereus_fire_lag_seconds histogram$", text, re.M)
    assert _metric(text, "nereus_fire_lag_seconds_count") >= 5
    assert _metric(text, "nereus_fire_lag_seconds_bucket", '{le="+Inf"}') >= 5
    assert _metric(text, "nereus_fire_lag_seconds_sum") >= 0
    assert re.search(r"^# TYPE nereus_admission_lag_seconds histogram$", text, re.M)
    assert _metric(text, "nereus_admission_lag_seconds_count") >= 5
    assert re.search(r"^# TYPE nereus_claims_inflight gauge$", text, re.M)
    assert _metric(text, "nereus_claims_inflight") >= 0
    assert re.search(r"^# TYPE nereus_admissions_total counter$", text, re.M)
    assert _metric(text, "nereus_admissions_total", '{result="won"}') >= 5
    assert re.search(r"^# TYPE nereus_outcomes_total counter$", text, re.M)
    assert _metric(text, "nereus_outcomes_total", '{class="PUBLISHED"}') >= 5
    assert re.search(r"^# TYPE nereus_clock_error_bound_seconds gauge$", text, re.M)
    bound = _metric(text, "nereus_clock_error_bound_seconds")
    assert bound > 0, "an assumed clock error bound must be exported"
    if re.search(r"^nereus_early_deliveries_total ", text, re.M):
        assert _metric(text, "nereus_early_deliveries_total") == 0


def test_metrics_export_the_due_backlog(service: Service) -> None:
    service.post(*[_schedule(f"later{i}", 60_000) for i in range(3)])
    time.sleep(0.1)
    _, _, raw = service.request("GET", "/metrics")
    text = raw.decode()
    assert re.search(r"^# TYPE nereus_due_backlog gauge$", text, re.M)
    assert _metric(text, "nereus_due_backlog") == 0  # nothing is due for a minute
