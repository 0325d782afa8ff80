"""The console over real HTTP, a real embedded service (LMDB, local destination) and the
tenancy `nereus serve --config` builds: login, sessions, CSRF, grants, tenants, the timer's
story and the audit, each checked against the rule in specs/console.md."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from nereus.adapters.http.console.audit import Audits
from nereus.adapters.http.console.session import Session
from nereus.kernel.keys import message_id
from tests.support.console_client import Page, Visitor
from tests.support.http_harness import (
    QUEUE,
    Service,
    config,
    reschedule,
    schedule,
    start_service,
)
from tests.support.worker_process import gone

AUDIT_BATCHES = 30  # log entries (each a batch of 100 timers) for an audit to be seen part way
CSP = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
PAGES = (
    "/console/overview",
    "/console/queues",
    f"/console/queues/{QUEUE}",
    f"/console/timer?queue={QUEUE}&key=k1",
    "/console/obligations",
    "/console/audit",
    f"/console/confirm?action=cancel&queue={QUEUE}&key=k1",
)


@pytest.fixture
def svc(tmp_path: Path) -> Iterator[Service]:
    with start_service(tmp_path / "data", config()) as s:
        yield s


def visitor(svc: Service, token: str | None = None) -> Visitor:
    v = Visitor(svc.server.port)
    if token is not None:
        page = v.login(token)
        assert page.status == 303, page.text[:300]
    return v


def wait(what: str, done: object, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(done) and done():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_login_sets_a_strict_httponly_cookie_that_does_not_hold_the_token(svc: Service) -> None:
    v = Visitor(svc.server.port)
    bad = v.login("not-a-token")
    assert bad.status == 401 and not bad.cookies
    assert "Unknown token" in bad.text
    ok = v.login("acme-all")
    assert ok.status == 303 and ok.headers["location"] == "/console/overview"
    (cookie,) = ok.cookies
    flags = [f.strip() for f in cookie.split(";")]
    assert "HttpOnly" in flags and "SameSite=Strict" in flags and "Path=/console" in flags
    assert "acme-all" not in cookie
    assert v.get("/console/overview").status == 200


def test_pages_without_a_session_send_the_visitor_to_login(svc: Service) -> None:
    v = Visitor(svc.server.port)
    for path in PAGES:
        page = v.get(path)
        assert page.status == 303 and page.headers["location"] == "/console/login", path
    refused = v.post("/console/actions/cancel", {"queue": QUEUE, "key": "k1"})
    assert refused.status == 401


def test_a_forged_or_altered_cookie_is_no_session(svc: Service) -> None:
    v = visitor(svc, "acme-all")
    value = v.jar["nereus_console"]
    payload, sig = value.split(".")

    def other(c: str) -> str:
        return "B" if c != "B" else "C"

    for forged in (
        f"{payload}.{sig[:-1]}{other(sig[-1])}",
        f"{payload[:-1]}{other(payload[-1])}.{sig}",
        f"{other(payload[0])}{payload[1:]}.{sig}",
        "x.y",
        "",
    ):
        v.jar["nereus_console"] = forged
        assert v.get("/console/overview").status == 303, forged
    # A well-formed session naming another credential, under a signature the server gave
    # for a different one: the identity is swapped, the signature is not its own.
    swapped = Session("0" * 32, hashlib.sha256(b"globex-all").hexdigest(), 2_000_000_000)
    encoded = base64.urlsafe_b64encode(msgspec.msgpack.encode(swapped)).rstrip(b"=").decode()
    v.jar["nereus_console"] = f"{encoded}.{sig}"
    assert v.get("/console/overview").status == 303


def test_every_page_carries_the_policy_and_no_script(svc: Service) -> None:
    svc.post(schedule("k1", delay_ms=3_600_000))
    v = visitor(svc, "acme-all")
    for path in PAGES:
        page = v.get(path)
        assert page.status == 200, (path, page.text[:300])
        assert page.headers["content-security-policy"] == CSP
        assert page.headers["x-content-type-options"] == "nosniff"
        assert "<script" not in page.text.lower(), path
        assert not re.search(r"\sstyle=", page.text), path
        # Nothing is fetched from elsewhere: every src/href/action is this service's.
        for url in re.findall(r'(?:src|href|action)="([^"]*)"', page.text):
            assert url.startswith("/console"), (path, url)


def test_an_action_without_the_forms_csrf_token_changes_nothing(svc: Service) -> None:
    svc.post(schedule("k1", delay_ms=3_600_000))
    v = visitor(svc, "acme-all")
    refused = v.post("/console/actions/cancel", {"queue": QUEUE, "key": "k1", "csrf": "00" * 32})
    assert refused.status == 403
    refused = v.post("/console/actions/cancel", {"queue": QUEUE, "key": "k1"})
    assert refused.status == 403
    assert svc.nereus.peek(QUEUE, "k1", tenant="acme").status == "SCHEDULED"
    confirm = v.get(f"/console/confirm?action=cancel&queue={QUEUE}&key=k1")
    done = v.post("/console/actions/cancel", {"queue": QUEUE, "key": "k1", "csrf": confirm.csrf()})
    assert done.status == 200
    assert done.by_id("verdict-status") == "canceled"
    assert svc.nereus.peek(QUEUE, "k1", tenant="acme").status == "CANCELED"


def test_another_sessions_csrf_token_is_refused(svc: Service) -> None:
    svc.post(schedule("k1", delay_ms=3_600_000))
    a, b = visitor(svc, "acme-all"), visitor(svc, "acme-all")
    token_of_b = b.get("/console/confirm?action=cancel&queue=reminders&key=k1").csrf()
    refused = a.post("/console/actions/cancel", {"queue": QUEUE, "key": "k1", "csrf": token_of_b})
    assert refused.status == 403
    assert svc.nereus.peek(QUEUE, "k1", tenant="acme").status == "SCHEDULED"


def test_actions_need_the_admin_grant_and_pages_the_read_grant(svc: Service) -> None:
    svc.post(schedule("k1", delay_ms=3_600_000))
    reader = visitor(svc, "acme-reader")
    assert reader.get("/console/timer?queue=reminders&key=k1").status == 200
    assert reader.get("/console/confirm?action=cancel&queue=reminders&key=k1").status == 403
    csrf = reader.get("/console/overview").csrf()
    refused = reader.post("/console/actions/cancel", {"queue": QUEUE, "key": "k1", "csrf": csrf})
    assert refused.status == 403
    assert svc.nereus.peek(QUEUE, "k1", tenant="acme").status == "SCHEDULED"
    admin_only = visitor(svc, "acme-admin")
    assert admin_only.get("/console/overview").status == 403


def test_a_bearer_header_reads_and_acts_without_a_cookie(svc: Service) -> None:
    svc.post(schedule("k1", delay_ms=3_600_000))
    v = Visitor(svc.server.port, bearer="acme-all")
    assert v.get("/console/timer?queue=reminders&key=k1").status == 200
    done = v.post("/console/actions/cancel", {"queue": QUEUE, "key": "k1"})
    assert done.status == 200 and done.by_id("verdict-status") == "canceled"


def test_a_tenant_never_sees_another_tenants_queue_timer_or_attempt(svc: Service) -> None:
    svc.post(schedule("k1", delay_ms=100))
    wait("the delivery", lambda: len(svc.delivered(tenant="acme")) == 1)
    acme = visitor(svc, "acme-all")
    story = acme.get("/console/timer?queue=reminders&key=k1")
    attempt = re.search(r'<code class="attempt">([^<]+)</code>', story.text)
    assert attempt is not None
    mid = message_id("acme", QUEUE, "k1")
    globex = visitor(svc, "globex-all")
    assert f"/console/queues/{QUEUE}" not in globex.get("/console/queues").text
    for search in (
        f"queue={QUEUE}&key=k1",
        f"message={mid}",
        f"attempt={attempt.group(1)}",
    ):
        page = globex.get(f"/console/timer?{search}")
        assert page.status == 200
        assert page.by_id("not-found") is not None, search
        # The search form echoes what was asked; nothing else may name the timer.
        answer = page.text[page.text.index("</form>", page.text.index('id="search"')) :]
        assert mid not in answer and attempt.group(1) not in answer
        assert 'id="summary"' not in answer
    assert attempt.group(1) not in globex.get("/console/obligations").text
    # The globex queue page of the same name lists globex's timers: none.
    assert "k1" not in globex.get(f"/console/queues/{QUEUE}").text


def test_the_story_of_a_fired_timer_shows_its_command_admission_and_evidence(
    svc: Service,
) -> None:
    (result,) = svc.post(schedule("k1", delay_ms=300))
    wait("the delivery", lambda: len(svc.delivered(tenant="acme")) == 1)
    (record,) = svc.delivered(tenant="acme")
    page = visitor(svc, "acme-all").get("/console/timer?queue=reminders&key=k1")
    assert page.by_id("status") == "DELIVERED"
    text = page.text
    assert "SCHEDULE_V1" in text and "verdict-scheduled" in text
    assert "Admission" in text and "verdict-PUBLISHED" in text
    assert f'<span class="v">{record.offset}</span>' in text
    # The deliverAt line comes before the Admission: nothing crossed before deliverAt.
    boundary = text.index('id="deliver-at-boundary"')
    assert text.index("SCHEDULE_V1") < boundary < text.index(">Admission<")
    assert result["deliverAt"] is not None


def test_a_refused_command_is_in_the_story_with_its_verdict(svc: Service) -> None:
    svc.post(schedule("k1", delay_ms=300))
    wait("the delivery", lambda: len(svc.delivered(tenant="acme")) == 1)
    (late,) = svc.post(reschedule("k1", delay_ms=60_000))
    assert late["status"] == "too_late"
    page = visitor(svc, "acme-all").get("/console/timer?queue=reminders&key=k1")
    assert "RESCHEDULE_V1" in page.text and "verdict-too_late" in page.text
    assert page.text.index("SCHEDULE_V1") < page.text.index("RESCHEDULE_V1")


def _audit_row(page: Page, shard: int = 0) -> str:
    found = re.search(rf'<tr class="audit-[a-z]+" id="audit-{shard}">.*?</tr>', page.text, re.S)
    assert found is not None, page.text
    return found.group(0)


def _row_int(row: str, css_class: str) -> int:
    found = re.search(rf'class="{css_class}">(\d+)<', row)
    assert found is not None, row
    return int(found.group(1))


def _progress(row: str) -> tuple[int, int]:
    found = re.search(r'class="audit-progress">(\d+) / (\d+)<', row)
    assert found is not None, row
    return int(found.group(1)), int(found.group(2))


def _start_audit(v: Visitor, shard: int = 0) -> None:
    csrf = v.get("/console/audit").csrf()
    started = v.post("/console/audit", {"shard": str(shard), "csrf": csrf})
    assert started.status == 303, started.text


def _finished(v: Visitor, shard: int = 0) -> str:
    rows: list[str] = []

    def done() -> bool:
        rows.append(_audit_row(v.get("/console/audit"), shard))
        return "audit-running" not in rows[-1]

    wait("the audit", done)
    return rows[-1]


def test_the_audit_replays_the_log_in_a_child_process_and_shows_equal_digests(
    svc: Service,
) -> None:
    svc.post(*(schedule(f"k{i}", delay_ms=100 + i) for i in range(20)))
    wait("the deliveries", lambda: len(svc.delivered(tenant="acme")) == 20)
    v = visitor(svc, "acme-all")
    _start_audit(v)
    row = _finished(v)
    assert 'class="audit-ok"' in row, row
    digests = re.findall(r"<td><code>([0-9a-f]{16,})</code></td>", row)
    assert len(digests) == 2 and digests[0] == digests[1]
    # It ran in a process of its own, started by the serving process (this one here),
    # and that process is gone now.
    pid = _row_int(row, "audit-pid")
    assert pid != os.getpid() and _row_int(row, "audit-parent") == os.getpid()
    assert gone(pid)
    done, total = _progress(row)
    assert done == total == svc.log_end


def test_the_audit_shows_its_progress_and_the_service_stopping_kills_it(svc: Service) -> None:
    for batch in range(AUDIT_BATCHES):
        svc.post(*(schedule(f"k{batch}-{i}", delay_ms=3_600_000) for i in range(100)))
    v = visitor(svc, "acme-all")
    _start_audit(v)
    pids: list[int] = []

    def started() -> bool:
        row = _audit_row(v.get("/console/audit"))
        if 'class="audit-pid"' in row:
            pids.append(_row_int(row, "audit-pid"))
        return bool(pids)

    wait("the audit's process", started)
    (pid,) = pids[:1]
    try:
        # Held stopped, and let run a few milliseconds at a time, until the page shows it
        # part way through its fold.
        os.kill(pid, signal.SIGSTOP)
        row = _audit_row(v.get("/console/audit"))
        for _ in range(400):
            if 'class="audit-running"' in row and _progress(row)[0] > 0:
                break
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.003)
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.05)
            row = _audit_row(v.get("/console/audit"))
        assert 'class="audit-running"' in row, row
        done, total = _progress(row)
        assert 0 < done <= total and total >= AUDIT_BATCHES
        assert v.get("/console/audit").headers.get("refresh") == "2"
        svc.server.stop()  # the service stopping stops its audit: the child is killed
        assert gone(pid)
        job = svc.api.console.local_audits.jobs()[0]
        assert job.state == "cancelled" and job.finished_at_ms is not None
    finally:
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


def test_an_audit_of_a_store_it_cannot_trust_is_refused_with_the_reason(
    svc: Service, tmp_path: Path
) -> None:
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "data.mdb").write_bytes(b"this is no LMDB file" * 512)
    stores = {0: str(tmp_path / "missing"), 1: str(corrupt)}
    # The console's own audits, pointed at stores that are not there or not stores.
    svc.api.console.local_audits = svc.api.console.audits = Audits(lambda: stores)
    v = visitor(svc, "acme-all")
    for shard, reason in ((0, "no store here"), (1, "")):
        _start_audit(v, shard)
        row = _finished(v, shard)
        assert 'class="audit-refused"' in row, row
        message = re.search(r'class="audit-difference">([^<]+)<', row)
        assert message is not None and stores[shard] in message.group(1)
        assert reason in message.group(1)


def test_console_requests_are_counted_under_their_route(svc: Service) -> None:
    v = visitor(svc, "acme-all")
    v.get("/console/overview")
    metrics = svc.call("GET", "/metrics", token=None).body.decode()
    assert re.search(
        r'nereus_http_requests_total\{route="GET /console/overview",status="200"\}', metrics
    )
