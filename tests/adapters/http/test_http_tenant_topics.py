"""Two tenants, one queue name, one embedded service: each tenant's deliveries are its own.

Issue 31 found tenants acme and globex both scheduling to a queue named `same` over HTTP,
both deliveries landing mixed in one local topic, with no tenant on the record. The rule
(`specs/destinations.md`): a tenant's queue is its own topic (`<tenant>/<queue>`; the
default tenant keeps the plain queue name), every record names its tenant (`LocalRecord
.tenant`, header `nereus-tenant`), and a consumer of a tenant's queue (`Nereus.consumer(queue,
tenant=...)`, `nereus tail --tenant`) reads that tenant's records and nothing else. The
expected tenants, topics and payloads are written here from the rule, never read from the
destination's naming.

`NEREUS_TENANT_TOPIC_TIMERS` (default 300) timers per tenant, scheduled in interleaved
batches so both tenants' sends share every tick of the runtime.
"""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path

import pytest

from nereus.adapters.cli.main import main as nereus_cli
from nereus.adapters.local.consumer import LocalConsumer
from nereus.adapters.local.destination import LocalDestination, LocalRecord
from nereus.kernel.keys import message_id
from nereus.storage.codec import encode_value
from tests.support.http_harness import Service, config, schedule, start_service
from tests.support.old_records import RecordBeforeTenants

TIMERS = int(os.environ.get("NEREUS_TENANT_TOPIC_TIMERS", "300"))
QUEUE = "same"
TOKEN = {"acme": "acme-all", "globex": "globex-all"}
BATCH = 100


def _payload(tenant: str, i: int) -> bytes:
    return f"{tenant}-secret-{i}".encode()


def _schedule_both(svc: Service) -> None:
    for start in range(0, TIMERS, BATCH):
        for tenant, token in TOKEN.items():
            ops = [
                schedule(f"k{i}", delay_ms=0, payload=_payload(tenant, i), queue=QUEUE)
                for i in range(start, min(start + BATCH, TIMERS))
            ]
            assert all(r["ok"] for r in svc.post(*ops, token=token))


def _consume(svc: Service, tenant: str | None) -> list[LocalRecord]:
    """A consumer of `tenant`'s queue (None: the call without `tenant`, the default's)."""
    consumer = (
        svc.nereus.consumer(QUEUE, group="app")
        if tenant is None
        else svc.nereus.consumer(QUEUE, group="app", tenant=tenant)
    )
    with consumer:
        return list(consumer.records(idle_timeout_s=0.5))


def test_each_tenants_consumer_sees_only_its_own_records_and_each_names_its_tenant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with start_service(tmp_path / "data", config()) as svc:
        _schedule_both(svc)
        dest = svc.nereus.destination
        assert isinstance(dest, LocalDestination)
        deadline = time.monotonic() + 60
        # Counted wherever they land (the plain topic too), so a mix-up fails on what it is.
        while sum(dest.end_offset(t) for t in ("acme/same", "globex/same", QUEUE)) < 2 * TIMERS:
            assert svc.nereus.runtime.halted is None
            assert time.monotonic() < deadline, "deliveries did not all arrive"
            time.sleep(0.05)
        for tenant in TOKEN:
            records = _consume(svc, tenant)
            assert len(records) == TIMERS
            assert {r.tenant for r in records} == {tenant}
            assert {r.queue for r in records} == {QUEUE}
            assert sorted(r.payload for r in records) == sorted(
                _payload(tenant, i) for i in range(TIMERS)
            )
            assert {r.message_id for r in records} == {
                message_id(tenant, QUEUE, f"k{i}") for i in range(TIMERS)
            }
            for r in records:
                assert dict(r.headers)["nereus-tenant"] == tenant
        # The default tenant (no tenant named) has no records in `same`: neither tenant's.
        assert _consume(svc, None) == []
        # A queue name cannot spell another tenant's topic.
        with pytest.raises(ValueError, match="'/'"):
            svc.nereus.consumer("acme/same", group="peek")
        doc = {"operations": [schedule("x", queue="acme/same")]}
        refused = svc.call("POST", "/api/v1/timers", doc, token="globex-all")
        assert (refused.status, refused.code) == (400, "invalid_identity")
    data = str(tmp_path / "data")
    assert nereus_cli(["tail", QUEUE, "--data", data, "--tenant", "globex"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == TIMERS
    assert {line["tenant"] for line in lines} == {"globex"}
    assert {base64.b64decode(line["payload"]) for line in lines} == {
        _payload("globex", i) for i in range(TIMERS)
    }
    # The default tenant's queue is empty: said on stderr, status 4 (nothing delivered).
    assert nereus_cli(["tail", QUEUE, "--data", data]) == 4
    assert capsys.readouterr().out == ""
    assert nereus_cli(["tail", "acme/same", "--data", data]) == 2


def test_a_service_without_tenants_keeps_the_plain_queue_topic(tmp_path: Path) -> None:
    with start_service(tmp_path / "data") as svc:
        svc.post(schedule("k", delay_ms=0, payload=b"mine", queue=QUEUE), token=None)
        svc.wait_for("the delivery", lambda: bool(svc.delivered(QUEUE)))
        dest = svc.nereus.destination
        assert isinstance(dest, LocalDestination)
        [record] = dest.iter_all("same")  # the queue's own name, as before tenants
        assert (record.tenant, record.queue, record.payload) == ("default", QUEUE, b"mine")
        assert dict(record.headers)["nereus-tenant"] == "default"
        assert [r.payload for r in _consume(svc, None)] == [b"mine"]


def test_records_written_before_the_upgrade_stay_in_the_plain_topic_without_a_tenant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "data" / "destination"
    dest = LocalDestination(str(path))
    old = RecordBeforeTenants(
        QUEUE, 0, None, "m", 1, "m.1.a", "t", 0, 1, [("nereus-txn", "t")], b"old", None, False
    )
    with dest._env.begin(write=True) as txn:
        txn.put(b"same\x00" + (0).to_bytes(8, "big"), encode_value(old), db=dest._records)
        txn.put(b"same", (1).to_bytes(8, "big"), db=dest._offsets)
    try:
        [record] = dest.read("same")
        assert (record.tenant, record.queue, record.payload) == (None, QUEUE, b"old")
        assert record.timer_key is None  # nor their timer's key
        # The default tenant's consumer still reads it (a single-tenant deployment's old
        # records are its own); another tenant's reads its own topic, where it is not.
        with LocalConsumer(dest, QUEUE, group="app") as mine:
            assert [r.payload for r in mine.poll()] == [b"old"]
        with LocalConsumer(dest, QUEUE, group="app", tenant="acme") as theirs:
            assert theirs.poll() == []
    finally:
        dest.close()
    assert nereus_cli(["tail", QUEUE, "--data", str(tmp_path / "data")]) == 0
    [line] = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert line["tenant"] is None and base64.b64decode(line["payload"]) == b"old"
    assert line["timerKey"] is None
    assert nereus_cli(["tail", QUEUE, "--data", str(tmp_path / "data"), "--tenant", "acme"]) == 4
    assert capsys.readouterr().out == ""  # acme's topic is empty: said on stderr, status 4
