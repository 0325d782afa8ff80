"""Encryption at schedule through the HTTP API: a queue with `encryption_key` stores and
delivers only the envelope (peek never decrypts), the ceiling is on the clear payload, and an
identical retry of an encrypted schedule is still `unchanged`."""

from __future__ import annotations

import base64
from pathlib import Path

from nereus.adapters import crypto
from nereus.adapters.crypto import Keyring, open_envelope
from tests.http_harness import (
    KEY_B64,
    QUEUE,
    SECRET_QUEUE,
    config,
    schedule,
    start_service,
    timer_path,
)

KEYRING = Keyring({"k1": KEY_B64})
IDENT = {"tenant": "acme", "queue": SECRET_QUEUE}


def test_an_encrypted_queue_stores_and_delivers_only_the_envelope(tmp_path: Path) -> None:
    with start_service(tmp_path, config()) as svc:
        clear = b'{"card": "4111"}'
        # Due after the peeks below: a delivered timer's bytes are dropped, and a peek of it
        # then shows none.
        (r,) = svc.post(schedule("pay/1", 2_000, clear, queue=SECRET_QUEUE, txn="p-1"))
        assert r["status"] == "scheduled"
        peek = svc.call("GET", timer_path("pay/1", SECRET_QUEUE)).doc
        assert peek["encrypted"] is True
        stored = base64.b64decode(peek["payload"])
        assert stored.startswith(b"NRE1") and clear not in stored
        assert len(stored) == len(clear) + crypto.ENVELOPE_OVERHEAD_BYTES("k1")
        # Peek never decrypts; the envelope opens only for its own timer.
        assert open_envelope(KEYRING, stored, timer_key="pay/1", **IDENT) == clear
        try:
            open_envelope(KEYRING, stored, timer_key="pay/2", **IDENT)
            raise AssertionError("an envelope opened for another timer")
        except crypto.EnvelopeError as exc:
            assert exc.reason == "authentication_failed"
        # Nor does the list show payloads.
        rows = svc.call("GET", f"/api/v1/timers/{SECRET_QUEUE}").doc["rows"]
        assert all("payload" not in row for row in rows)
        svc.wait_for("the delivery", lambda: bool(svc.delivered(SECRET_QUEUE)))
        (rec,) = svc.delivered(SECRET_QUEUE)
        assert rec.payload == stored
        assert dict(rec.headers)["nereus-encryption"] == "aes-256-gcm"
        assert open_envelope(KEYRING, rec.payload, timer_key="pay/1", **IDENT) == clear


def test_other_queues_and_tenants_stay_clear(tmp_path: Path) -> None:
    with start_service(tmp_path, config()) as svc:
        svc.post(schedule("k", payload=b"plain"))
        svc.post(schedule("k", payload=b"theirs", queue=SECRET_QUEUE), token="globex-all")
        for path, token in (
            (timer_path("k"), "acme-all"),
            (timer_path("k", SECRET_QUEUE), "globex-all"),
        ):
            peek = svc.call("GET", path, token=token).doc
            assert peek["encrypted"] is False
            assert base64.b64decode(peek["payload"]) in (b"plain", b"theirs")


def test_an_identical_retry_of_an_encrypted_schedule_is_unchanged(tmp_path: Path) -> None:
    with start_service(tmp_path, config()) as svc:
        op = schedule("retry/1", 60_000, b"same", queue=SECRET_QUEUE, txn="t-1")
        (first,) = svc.post(op)
        (again,) = svc.post(op)
        assert (first["status"], again["status"]) == ("scheduled", "unchanged")
        assert again["deliverAt"] == first["deliverAt"]
        # Changed content is a new message: under the same txn it is refused, under a new
        # one it supersedes the timer (and is sealed anew).
        other = {**op, "payload": base64.b64encode(b"other").decode()}
        (reused,) = svc.post(other)
        assert (reused["status"], reused["code"]) == ("rejected", "txn_reused")
        (changed,) = svc.post({**other, "txn": "t-2"})
        assert changed["status"] == "rescheduled"
        peek = svc.call("GET", timer_path("retry/1", SECRET_QUEUE)).doc
        stored = base64.b64decode(peek["payload"])
        assert open_envelope(KEYRING, stored, timer_key="retry/1", **IDENT) == b"other"
        # Without a txn each call is a new request (a new txn is minted).
        op2 = schedule("retry/2", 60_000, b"same", queue=SECRET_QUEUE)
        assert [svc.post(op2)[0]["status"] for _ in range(2)] == ["scheduled", "rescheduled"]


def test_the_ceiling_applies_to_the_clear_payload(tmp_path: Path) -> None:
    with start_service(tmp_path, config(acme={"max_payload_bytes": 64})) as svc:
        (r,) = svc.post(schedule("at", payload=b"c" * 64, queue=SECRET_QUEUE))
        assert r["status"] == "scheduled"
        peek = svc.call("GET", timer_path("at", SECRET_QUEUE)).doc
        assert len(base64.b64decode(peek["payload"])) > 64  # the envelope is larger
        reply = svc.call(
            "POST",
            "/api/v1/timers",
            {"operations": [schedule("over", payload=b"c" * 65, queue=SECRET_QUEUE)]},
        )
        assert (reply.status, reply.code) == (413, "payload_too_large")


def test_at_the_kernel_ceiling_the_envelope_overhead_comes_off(tmp_path: Path) -> None:
    """The cell may allow 1 MiB of clear payload, but the stored envelope must fit the
    kernel's 1 MiB: an encrypted queue's clear ceiling is lower by the overhead."""
    with start_service(tmp_path, config()) as svc:
        room = 1024 * 1024 - crypto.ENVELOPE_OVERHEAD_BYTES("k1")
        (r,) = svc.post(schedule("max", payload=b"m" * room, queue=SECRET_QUEUE))
        assert r["status"] == "scheduled", r
        reply = svc.call(
            "POST",
            "/api/v1/timers",
            {"operations": [schedule("over", payload=b"m" * (room + 1), queue=SECRET_QUEUE)]},
        )
        assert (reply.status, reply.code) == (413, "payload_too_large")
        # An unencrypted queue still takes the full 1 MiB.
        (r,) = svc.post(schedule("max", payload=b"m" * (1024 * 1024), queue=QUEUE))
        assert r["status"] == "scheduled"
