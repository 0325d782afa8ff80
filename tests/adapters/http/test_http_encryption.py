"""Encryption at schedule through the HTTP API: a queue with `encryption_key` stores and
delivers only the envelope (peek never decrypts), the ceiling is on the clear payload, and an
identical retry of an encrypted schedule is still `unchanged`. Its headers are sealed in the
envelope too: no file of the data directory, no snapshot and no export holds them (nor the
payload) in clear, scheduled or delivered, and the destination record carries only Nereus's
own headers; a queue with `seal_headers = false` keeps them clear."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from nereus.adapters import crypto
from nereus.adapters.crypto import Keyring, open_envelope, open_message
from nereus.adapters.tenancy import ConfigError, parse_tenancy
from nereus.storage.jsonl import export_log
from nereus.storage.snapshot import write_snapshot
from tests.support.file_modes import files_holding, tree_files
from tests.support.http_harness import (
    KEY_B64,
    QUEUE,
    SECRET_QUEUE,
    Service,
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


# Headers: sealed with the payload unless the queue says otherwise ---------------------------

CLEAR_HEADERS = {"x-holder": "Ada Lovelace", "x-plan": "platinum-annual"}
CLEAR_PAYLOAD = b'{"card": "4242-4242-4242-4242"}'
NEEDLES = [CLEAR_PAYLOAD, *(t.encode() for pair in CLEAR_HEADERS.items() for t in pair)]


def _snapshot_and_export(svc: Service, out: Path) -> None:
    write_snapshot(svc.nereus.store)
    with open(out, "w", encoding="utf-8") as f:
        export_log(svc.nereus.store, f)


def test_an_encrypted_queues_headers_are_never_at_rest_in_clear(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with start_service(data, config()) as svc:
        op = schedule("pay/1", 2_000, CLEAR_PAYLOAD, queue=SECRET_QUEUE, headers=CLEAR_HEADERS)
        (r,) = svc.post(op)
        assert r["status"] == "scheduled"
        _snapshot_and_export(svc, tmp_path / "pending.jsonl")
        scheduled = files_holding([*tree_files(data), tmp_path / "pending.jsonl"], NEEDLES)
        # The peek answers the envelope, which seals both; headers are never a peek field.
        peek = svc.call("GET", timer_path("pay/1", SECRET_QUEUE)).doc
        assert "headers" not in peek and peek["encrypted"] is True
        stored = base64.b64decode(peek["payload"])
        assert stored[:4] == b"NRE2"
        opened = open_message(KEYRING, stored, timer_key="pay/1", **IDENT)
        # Sorted by name: the order the service seals them in, whatever the JSON's order.
        assert opened == (
            (("x-holder", "Ada Lovelace"), ("x-plan", "platinum-annual")),
            CLEAR_PAYLOAD,
        )
        svc.wait_for("the delivery", lambda: bool(svc.delivered(SECRET_QUEUE)))
        (rec,) = svc.delivered(SECRET_QUEUE)
        _snapshot_and_export(svc, tmp_path / "delivered.jsonl")
    assert scheduled == []
    snapshots = list(data.rglob("snapshot-*.bin"))
    assert len(snapshots) == 2
    exports = [tmp_path / "pending.jsonl", tmp_path / "delivered.jsonl"]
    assert files_holding([*tree_files(data), *exports], NEEDLES) == []
    # The destination record: the envelope as stored, Nereus's own headers only.
    assert rec.payload == stored
    delivered_headers = dict(rec.headers)
    assert delivered_headers["nereus-encryption"] == "aes-256-gcm"
    assert not set(CLEAR_HEADERS) & set(delivered_headers)
    assert open_message(KEYRING, rec.payload, timer_key="pay/1", **IDENT) == opened


def test_a_queue_that_keeps_its_headers_clear_seals_only_the_payload(tmp_path: Path) -> None:
    """`seal_headers = false`: the headers are stored and delivered as given (the search
    above would find them: here it does), the payload is still sealed."""
    queues = {SECRET_QUEUE: {"encryption_key": "k1", "seal_headers": False}}
    data = tmp_path / "data"
    with start_service(data, config(acme={"queues": queues})) as svc:
        op = schedule("pay/2", 0, CLEAR_PAYLOAD, queue=SECRET_QUEUE, headers=CLEAR_HEADERS)
        assert svc.post(op)[0]["status"] == "scheduled"
        svc.wait_for("the delivery", lambda: bool(svc.delivered(SECRET_QUEUE)))
        (rec,) = svc.delivered(SECRET_QUEUE)
    assert rec.payload[:4] == b"NRE1"
    assert open_message(KEYRING, rec.payload, timer_key="pay/2", **IDENT) == ((), CLEAR_PAYLOAD)
    assert {k: v for k, v in rec.headers if k in CLEAR_HEADERS} == CLEAR_HEADERS
    found = files_holding(tree_files(data), NEEDLES)
    assert any(b"Ada Lovelace" in f.encode() for f in found), found
    assert not any(repr(CLEAR_PAYLOAD) in f for f in found), found


def test_seal_headers_needs_an_encrypted_queue() -> None:
    doc = config(acme={"queues": {QUEUE: {"seal_headers": False}}})
    with pytest.raises(ConfigError, match=r"queues\.reminders\.seal_headers"):
        parse_tenancy(doc, "t.toml")


def test_an_identical_retry_with_headers_in_another_order_is_unchanged(tmp_path: Path) -> None:
    with start_service(tmp_path, config()) as svc:
        first = schedule("h/1", 60_000, b"p", queue=SECRET_QUEUE, txn="t", headers=CLEAR_HEADERS)
        reordered = {**first, "headers": dict(reversed(list(CLEAR_HEADERS.items())))}
        changed = {**first, "headers": {**CLEAR_HEADERS, "x-plan": "basic"}}
        assert svc.post(first)[0]["status"] == "scheduled"
        assert svc.post(reordered)[0]["status"] == "unchanged"
        # Other headers are other content: under the same txn refused, as a payload would be.
        (again,) = svc.post(changed)
        assert (again["status"], again["code"]) == ("rejected", "txn_reused")


def test_sealed_headers_come_off_the_clear_payload_ceiling(tmp_path: Path) -> None:
    """The envelope holds the headers' frame too, and must still fit the kernel's 1 MiB."""
    headers = {"a": "bc"}
    frame_bytes = 4 + 8 + 1 + 2
    with start_service(tmp_path, config()) as svc:
        room = 1024 * 1024 - crypto.ENVELOPE_OVERHEAD_BYTES("k1") - frame_bytes
        op = schedule("max", payload=b"m" * room, queue=SECRET_QUEUE, headers=headers)
        (r,) = svc.post(op)
        assert r["status"] == "scheduled", r
        over = schedule("over", payload=b"m" * (room + 1), queue=SECRET_QUEUE, headers=headers)
        reply = svc.call("POST", "/api/v1/timers", {"operations": [over]})
        assert (reply.status, reply.code) == (413, "payload_too_large")
        peek = svc.call("GET", timer_path("max", SECRET_QUEUE)).doc
        assert len(base64.b64decode(peek["payload"])) == 1024 * 1024
