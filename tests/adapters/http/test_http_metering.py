"""Metering: one message per accepted schedule/reschedule (a new promise), zero for identical
retries, cancels, fires and refusals; per tenant in `/metrics` and the admin route."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.http_harness import Service, cancel, config, reschedule, schedule, start_service


def _metered(svc: Service, tenant: str = "acme") -> tuple[int, float]:
    doc = svc.call("GET", "/api/v1/admin/metering", token=f"{tenant}-all").doc
    assert doc["tenant"] == tenant and isinstance(doc["since"], int)
    text = svc.call("GET", "/metrics", token=None).body.decode()
    match = re.search(rf'^nereus_metered_messages_total{{tenant="{tenant}"}} (\S+)$', text, re.M)
    assert match, text
    return doc["messages"], float(match.group(1))


def _expect(svc: Service, n: int, tenant: str = "acme") -> None:
    assert _metered(svc, tenant) == (n, float(n))


def test_metering_counts_new_promises_only(tmp_path: Path) -> None:
    with start_service(tmp_path, config(acme={"max_live_timers": 100})) as svc:
        text = svc.call("GET", "/metrics", token=None).body.decode()
        assert "# TYPE nereus_metered_messages_total counter" in text
        _expect(svc, 0)
        _expect(svc, 0, "globex")  # every configured tenant is exported from the start
        svc.post(schedule("a", txn="a1"), schedule("b", txn="b1"))
        _expect(svc, 2)
        svc.post(schedule("a", txn="a1"))  # identical retry: unchanged
        _expect(svc, 2)
        svc.post(schedule("a", payload=b"new", txn="a2"))  # upsert: rescheduled, a new promise
        _expect(svc, 3)
        svc.post(reschedule("b", 5_000, txn="r1"))
        _expect(svc, 4)
        svc.post(reschedule("b", 5_000, txn="r1"))  # identical: unchanged
        _expect(svc, 4)
        svc.post(reschedule("nothing", 5_000))  # absent
        _expect(svc, 4)
        svc.post(cancel("a"), cancel("a"))  # cancels count zero, refund nothing
        assert svc.call("DELETE", "/api/v1/timers/reminders/b").doc["status"] == "canceled"
        _expect(svc, 4)
        # Refused batches count zero.
        reply = svc.call("POST", "/api/v1/timers", {"operations": [schedule("x", -1)]})
        assert reply.status == 400
        svc.call("PUT", "/api/v1/admin/block", {"blocked": True})
        assert svc.call("POST", "/api/v1/timers", {"operations": [schedule("y")]}).status == 403
        svc.call("PUT", "/api/v1/admin/block", {"blocked": False})
        _expect(svc, 4)
        # The unit is the operation, not the call.
        svc.post(*[schedule(f"many{i}") for i in range(10)])
        _expect(svc, 14)
        # Another tenant's count is its own.
        svc.post(schedule("a"), token="globex-all")
        _expect(svc, 1, "globex")
        _expect(svc, 14)


def test_fires_count_zero(tmp_path: Path) -> None:
    with start_service(tmp_path, config()) as svc:
        svc.post(schedule("now", 0), schedule("soon", 1))
        svc.wait_for("deliveries", lambda: len(svc.delivered()) == 2)
        svc.wait_for(
            "outcomes",
            lambda: svc.call("GET", "/api/v1/timers/reminders/soon").doc["status"] == "DELIVERED",
        )
        _expect(svc, 2)
