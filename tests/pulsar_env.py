"""The real Pulsar broker the tests use, and helpers around it.

`scripts/pulsar start` runs a standalone broker on loopback and `scripts/test` exports its
service and admin URLs as NEREUS_PULSAR_URL and NEREUS_PULSAR_ADMIN_URL (CI always does). A
test that needs Pulsar takes the `pulsar_url` fixture, which FAILS (never skips) when the
variable is missing: a Pulsar test that silently does not run would prove nothing.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pulsar
import pytest

from nereus.adapters.pulsar.config import PulsarTargetConfig

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
