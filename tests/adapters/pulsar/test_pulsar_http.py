"""The HTTP API over a service whose config routes one queue to Pulsar and leaves the rest on
the local destination (as `nereus serve --config` builds it): each queue is delivered where
its route says, and the answers that carry evidence (peek, list rows, a too_late cancel)
show Pulsar's message id as `brokerMessageId`, valid against the served OpenAPI document,
while a local delivery's evidence is what it always was. The Pulsar record names its tenant
(property `nereus-tenant`) and its timer (property `nereus-timer-key`)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest

from nereus.adapters.clock import SystemClock
from nereus.adapters.compose.config import parse_configuration, pulsar_routing
from nereus.adapters.compose.destinations import routed_destination
from nereus.adapters.http.api import TimerApi
from nereus.adapters.http.server import HttpServer
from nereus.adapters.local.embedded import Nereus
from nereus.adapters.pulsar.outcomes import broker_message_id
from tests.support import pulsar_env
from tests.support.http_harness import Backend, Service, config, schedule, timer_path
from tests.support.pulsar_env import read_all, unique_topic

pulsar_url = pulsar_env.pulsar_url
pulsar_admin_url = pulsar_env.pulsar_admin_url
pulsar_client = pulsar_env.pulsar_client

TO_PULSAR, LOCAL = "to-pulsar", "stays-local"
MESSAGE_ID = re.compile(r"\d+:\d+:-?\d+:-?\d+")


@pytest.fixture
def routed(tmp_path: Path, pulsar_url: str, pulsar_admin_url: str) -> Iterator[tuple[Service, str]]:
    topic = unique_topic("http")
    doc = {
        **config(),
        "pulsar": {
            "targets": {
                "p": {
                    "service_url": pulsar_url,
                    "admin_url": pulsar_admin_url,
                    # acme's queue: globex's of the same name gets a topic of its own.
                    "topics": {f"acme/{TO_PULSAR}": topic},
                }
            },
            "queues": {TO_PULSAR: "p"},
        },
    }
    tenancy = parse_configuration(doc, "test.toml")
    routing = pulsar_routing(tenancy, None)
    assert routing is not None
    destination = routed_destination(routing, str(tmp_path))
    nereus = Nereus.open(
        str(tmp_path), destination=destination, clock=SystemClock(assumed_error_ms=2)
    )
    backend = Backend(nereus)
    api = TimerApi(backend, tenancy=tenancy)
    server = HttpServer(api, "127.0.0.1", 0)
    nereus.start()
    server.start()
    try:
        yield Service(nereus, backend, api, server), topic
    finally:
        server.stop()
        nereus.close()


def _validator(svc: Service, name: str) -> Any:
    document = svc.call("GET", "/openapi.json", token=None).doc
    return jsonschema_rs.validator_for(
        {"$ref": f"#/components/schemas/{name}", "components": document["components"]}
    )


def test_answers_with_evidence_carry_the_pulsar_message_id(
    routed: tuple[Service, str], pulsar_client: Any
) -> None:
    svc, topic = routed
    svc.post(
        schedule("k", delay_ms=0, queue=TO_PULSAR),
        schedule("k", delay_ms=0, queue=LOCAL),
        schedule("later", delay_ms=600_000, queue=TO_PULSAR),
    )

    def peek(queue: str) -> dict[str, Any]:
        reply = svc.call("GET", timer_path("k", queue))
        assert reply.status == 200, reply.body
        doc: dict[str, Any] = reply.doc
        return doc

    svc.wait_for(
        "both deliveries", lambda: all(peek(q)["status"] == "DELIVERED" for q in (TO_PULSAR, LOCAL))
    )
    peek_schema = _validator(svc, "Peek")

    at_pulsar = peek(TO_PULSAR)
    peek_schema.validate(at_pulsar)
    evidence = at_pulsar["evidence"]
    assert evidence["destination"] == topic and (evidence["partition"], evidence["offset"]) == (
        -1,
        -1,
    )
    assert MESSAGE_ID.fullmatch(evidence["brokerMessageId"]), evidence
    # The id is the one the broker gave the record Nereus wrote there.
    [record] = read_all(pulsar_client, topic)
    assert broker_message_id(record.message_id()) == evidence["brokerMessageId"]
    assert record.properties()["nereus-tenant"] == "acme"  # every record names its tenant

    at_local = peek(LOCAL)
    peek_schema.validate(at_local)
    assert "brokerMessageId" not in at_local["evidence"] and at_local["evidence"]["offset"] >= 0

    late = svc.call("DELETE", timer_path("k", TO_PULSAR))
    assert late.status == 200, late.body
    _validator(svc, "Result").validate(late.doc)
    assert late.doc["status"] == "too_late" and late.doc["evidence"] == evidence

    page = svc.call("GET", f"/api/v1/timers/{TO_PULSAR}")
    _validator(svc, "Page").validate(page.doc)
    [row] = page.doc["rows"]  # a listed timer is live: no evidence yet
    assert row["timerKey"] == "later" and row["evidence"] is None


def test_each_pulsar_message_names_its_timer_in_a_property(
    routed: tuple[Service, str], pulsar_client: Any
) -> None:
    """`nereus-timer-key` is a property on Pulsar too: the key itself, or `b64:` and the
    base64 of its UTF-8 when it is not printable text (or starts with the marker)."""
    svc, topic = routed
    expected = {
        "plain": "plain",
        "zamówienie ✓": "zamówienie ✓",
        "two\nlines": "b64:dHdvCmxpbmVz",
        "\x01" * 150: "b64:" + "AQEB" * 50,  # the longest key, all control characters
    }
    replies = svc.post(*(schedule(key, delay_ms=0, queue=TO_PULSAR) for key in expected))
    assert all(r["ok"] for r in replies), replies
    svc.wait_for(
        "the deliveries",
        lambda: all(
            svc.nereus.peek(TO_PULSAR, key, tenant="acme").status == "DELIVERED" for key in expected
        ),
    )
    records = read_all(pulsar_client, topic)
    assert sorted(r.properties()["nereus-timer-key"] for r in records) == sorted(expected.values())
