"""`GET /api/v1/timers/{queue}?after=&limit=`: live timers in byte order of the key, a key
cursor that concurrent schedules cannot make skip or repeat, clamped limits."""

from __future__ import annotations

import random
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nereus.adapters.http.contract import LIST_DEFAULT_LIMIT, LIST_MAX_LIMIT
from tests.support.http_harness import QUEUE, Service, cancel, config, schedule, start_service

LIST = f"/api/v1/timers/{QUEUE}"


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[Service]:
    with start_service(tmp_path, config()) as s:
        yield s


def _page(svc: Service, query: str = "", token: str = "acme-reader") -> dict[str, Any]:
    reply = svc.call("GET", LIST + query, token=token)
    assert reply.status == 200, reply.body[:300]
    doc: dict[str, Any] = reply.doc
    return doc


def _walk(svc: Service, limit: int) -> list[str]:
    keys: list[str] = []
    after: str | None = None
    while True:
        query = f"?limit={limit}" + ("" if after is None else f"&after={_q(after)}")
        page = _page(svc, query)
        keys += [row["timerKey"] for row in page["rows"]]
        if not page["truncated"]:
            assert page["nextAfter"] is None
            return keys
        assert page["nextAfter"] == page["rows"][-1]["timerKey"]
        after = page["nextAfter"]


def _q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def test_rows_are_live_timers_in_byte_order_without_payloads(svc: Service) -> None:
    keys = ["b", "a", "B", "é", "z", "a/b", "a b", "ü", "0"]
    svc.post(*[schedule(k, payload=b"secret") for k in keys])
    svc.post(schedule("gone"), cancel("gone"))
    svc.post(schedule("elsewhere", queue="other"))
    page = _page(svc)
    got = [row["timerKey"] for row in page["rows"]]
    assert got == sorted(keys, key=lambda k: k.encode())
    assert page["truncated"] is False and page["nextAfter"] is None
    row = page["rows"][0]
    assert "payload" not in row
    assert row["status"] == "SCHEDULED" and row["queue"] == QUEUE
    assert row["producerSub"] == "acme-ops" and row["encrypted"] is False
    assert set(row) == {
        "queue",
        "timerKey",
        "status",
        "partition",
        "deliverAt",
        "expireAt",
        "txn",
        "messageId",
        "generation",
        "encrypted",
        "producerSub",
        "attempts",
        "lastError",
        "createdAt",
        "updatedAt",
        "evidence",
    }
    assert row["evidence"] is None  # a listed timer is live: nothing delivered yet


def test_pages_and_the_cursor(svc: Service) -> None:
    keys = [f"k{i:03d}" for i in range(25)]
    svc.post(*[schedule(k) for k in keys])
    page = _page(svc, "?limit=10")
    assert [r["timerKey"] for r in page["rows"]] == keys[:10]
    assert page["truncated"] is True and page["nextAfter"] == "k009"
    page = _page(svc, "?limit=10&after=k009")
    assert [r["timerKey"] for r in page["rows"]] == keys[10:20]
    page = _page(svc, "?limit=5&after=k019")
    assert [r["timerKey"] for r in page["rows"]] == keys[20:25]
    assert page["truncated"] is False and page["nextAfter"] is None  # exactly the rest
    # `after` is exclusive and need not exist.
    assert [r["timerKey"] for r in _page(svc, "?after=k0105")["rows"]][:1] == ["k011"]
    assert _page(svc, "?after=zzz")["rows"] == []
    assert _walk(svc, 7) == keys
    # An empty `after` is the start.
    assert len(_page(svc, "?after=")["rows"]) == 25


def test_limits_are_clamped_and_must_be_integers(svc: Service) -> None:
    svc.post(*[schedule(f"k{i:04d}") for i in range(256)])
    svc.post(*[schedule(f"k{i:04d}") for i in range(256, 512)])
    svc.post(*[schedule(f"k{i:04d}") for i in range(512, 768)])
    svc.post(*[schedule(f"k{i:04d}") for i in range(768, 1024)])
    svc.post(*[schedule(f"k{i:04d}") for i in range(1024, 1030)])
    assert len(_page(svc)["rows"]) == LIST_DEFAULT_LIMIT
    for raw, expected in (("0", 1), ("-5", 1), ("1", 1), ("5000", LIST_MAX_LIMIT)):
        page = _page(svc, f"?limit={raw}")
        assert len(page["rows"]) == expected and page["truncated"] is True, raw
    page = _page(svc, "?limit=1000&after=k0029")
    assert len(page["rows"]) == 1000 and page["truncated"] is False
    for bad in ("abc", "1.5", "", "1&limit=2"):
        reply = svc.call("GET", f"{LIST}?limit={bad}", token="acme-reader")
        assert (reply.status, reply.code) == (400, "invalid_query"), bad


def test_the_cursor_is_stable_under_concurrent_schedules(svc: Service) -> None:
    """Keys live throughout the walk appear exactly once, in order, whatever is scheduled
    and cancelled meanwhile (including keys sorting before and after the cursor)."""
    stable = [f"s{i:03d}" for i in range(120)]
    for start in range(0, len(stable), 60):
        svc.post(*[schedule(k) for k in stable[start : start + 60]])
    stop = threading.Event()
    errors: list[BaseException] = []

    def churn() -> None:
        rng = random.Random(7)
        n = 0
        try:
            while not stop.is_set():
                key = f"s{rng.randrange(120):03d}.{n}"  # interleaved with the stable keys
                svc.post(schedule(key), schedule(f"a{n}"), schedule(f"z{n}"))
                if n % 2:
                    svc.post(cancel(key))
                n += 1
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=churn)
    thread.start()
    try:
        seen = _walk(svc, 9)
    finally:
        stop.set()
        thread.join(30)
    assert not errors, errors
    assert seen == sorted(seen, key=lambda k: k.encode()), "pages out of order"
    assert len(seen) == len(set(seen)), "a key was repeated"
    assert [k for k in seen if k in set(stable)] == stable, "a stable key was skipped"


def test_list_of_an_invalid_queue_is_400(svc: Service) -> None:
    reply = svc.call("GET", "/api/v1/timers/a%2Fb", token="acme-reader")
    assert (reply.status, reply.code) == (400, "invalid_path")
    reply = svc.call("GET", "/api/v1/timers/" + "q" * 151, token="acme-reader")
    assert (reply.status, reply.code) == (400, "invalid_path")
