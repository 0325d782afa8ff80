"""The real Pulsar broker the tests use, and helpers around it.

`scripts/pulsar start` runs a standalone broker on loopback and `scripts/test` exports its
service and admin URLs as NEREUS_PULSAR_URL and NEREUS_PULSAR_ADMIN_URL (CI always does). A
test that needs Pulsar takes the `pulsar_url` fixture, which FAILS (never skips) when the
variable is missing: a Pulsar test that silently does not run would prove nothing.

For the tests that drive a `PulsarDestination` directly: `prepared_send` builds an attempt as a
claim would, `poll_results` collects the answers to submitted sends, and `search_until_complete`
repeats a bulk evidence search, as the runtime does, until one is complete.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pulsar
import pytest

from nereus.adapters.pulsar.config import PulsarTargetConfig
from nereus.adapters.pulsar.destination import PulsarDestination
from nereus.kernel.records import IMMEDIATE, Capability
from nereus.runtime.destination import Lookup, PreparedPublish, SearchOutcome, Send, SendResult

ENV = "NEREUS_PULSAR_URL"
ADMIN_ENV = "NEREUS_PULSAR_ADMIN_URL"


@pytest.fixture(scope="session")
def pulsar_url() -> str:
    url = os.environ.get(ENV, "").strip()
    if not url:
        pytest.fail(
            f"{ENV} is not set: these tests need a real Pulsar broker. Run "
            f"`./scripts/pulsar start` and `export {ENV}=$(./scripts/pulsar url) "
            f"{ADMIN_ENV}=$(./scripts/pulsar admin-url)`, or run the whole suite with "
            "./scripts/test, which does both (CI always has it).",
            pytrace=False,
        )
    return url


@pytest.fixture(scope="session")
def pulsar_admin_url(pulsar_url: str) -> str:
    return os.environ.get(ADMIN_ENV, "").strip() or "http://127.0.0.1:18080"


@pytest.fixture
def pulsar_client(pulsar_url: str) -> Iterator[Any]:
    client = pulsar.Client(pulsar_url, logger=_quiet())
    yield client
    client.close()


def _quiet() -> Any:
    import logging  # noqa: PLC0415

    log = logging.getLogger("tests.pulsar")
    log.setLevel(logging.ERROR)
    return log


def unique_topic(prefix: str = "t") -> str:
    return f"persistent://public/default/{prefix}-{uuid.uuid4().hex[:12]}"


def target(url: str, admin: str, topics: dict[str, str], **options: Any) -> PulsarTargetConfig:
    return PulsarTargetConfig(service_url=url, admin_url=admin, topics=topics, **options)


def admin_call(admin: str, method: str, path: str, body: object = None) -> int:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        admin + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return int(response.status)


def now_ms() -> int:
    return int(time.time() * 1000)


def read_all(client: Any, topic: str) -> list[Any]:
    """Every message of the topic, from the start, with a reader (sees held messages too)."""
    reader = client.create_reader(topic, pulsar.MessageId.earliest)
    out = []
    try:
        while reader.has_message_available():
            out.append(reader.read_next(5000))
    finally:
        reader.close()
    return out


def prepared_send(
    topic: str,
    attempt_id: str,
    *,
    message_id: str | None = None,
    value: bytes = b"v",
    deliver_at_ms: int = 0,
    capability: Capability = IMMEDIATE,
) -> Send:
    """A send of generation 1 of a timer to `topic`, prepared as a claim would prepare it; the
    message id (in its header too) is the attempt id unless one is given."""
    mid = attempt_id if message_id is None else message_id
    prepared = PreparedPublish(
        destination="pulsar",
        topic=topic,
        key=None,
        value=value,
        headers=(("nereus-message-id", mid.encode()),),
        message_id=mid,
        generation=1,
        txn="t",
        deliver_at_ms=deliver_at_ms,
        producer_sub=None,
        encrypted=False,
        capability=capability,
    )
    return Send(attempt_id, prepared)


def poll_results(dest: PulsarDestination, count: int, timeout_s: float) -> dict[str, SendResult]:
    """Answers to submitted sends, by attempt id, until `count` came or `timeout_s` passed."""
    out: dict[str, SendResult] = {}
    deadline = time.monotonic() + timeout_s
    while len(out) < count and time.monotonic() < deadline:
        out.update((r.attempt_id, r) for r in dest.poll(0))
        time.sleep(0.02)
    return out


def search_until_complete(
    dest: PulsarDestination, lookups: Sequence[Lookup], timeout_s: float
) -> SearchOutcome:
    """One bulk search, made again while it ends incomplete, as the runtime does: a broker
    still recovering from a SIGSTOP answers some reads with errors, and a client still
    reconnecting fails a search. The last outcome, which may be incomplete once `timeout_s`
    has passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        handle = dest.search(lookups, lambda: None)
        while not handle.done() and time.monotonic() < deadline:
            time.sleep(0.05)
        outcome = handle.outcome()
        if outcome.complete or time.monotonic() > deadline:
            return outcome
        time.sleep(0.5)


def admin_get(admin: str, path: str) -> Any:
    """The decoded JSON body of a GET on the admin API (None for an empty one)."""
    with urllib.request.urlopen(admin + path, timeout=10) as response:
        body = response.read()
    return json.loads(body) if body.strip() else None


def deduplicated_topic(client: Any, admin: str, prefix: str) -> str:
    """A fresh topic whose own policy turns broker-side deduplication on, whatever the
    broker's or namespace's default, waited for until the broker reports it."""
    topic = unique_topic(prefix)
    client.create_producer(topic).close()  # a topic policy needs the topic
    path = "/admin/v2/persistent/public/default/" + topic.rsplit("/", 1)[1]
    admin_call(admin, "POST", path + "/deduplicationEnabled", True)
    deadline = time.monotonic() + 15
    while admin_get(admin, path + "/deduplicationEnabled") is not True:
        assert time.monotonic() < deadline, f"deduplication not enabled on {topic}"
        time.sleep(0.2)
    return topic
