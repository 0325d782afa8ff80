"""Faults with the Pulsar destination on a real broker: a shard owner killed with SIGKILL
while hundreds of attempts are in flight, restarted on its data; the broker itself stopped
and restarted during a fire (a broker of this test's own, on its own ports and data, so the
shared one is never disturbed). Each ends with: nothing lost, and a message written twice
only where its ledger holds an UNKNOWN attempt (the only way Nereus may duplicate)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulsar
import pytest

from nereus import Nereus
from nereus.adapters.pulsar.config import PulsarTargetConfig
from nereus.adapters.pulsar.destination import PulsarDestination
from nereus.kernel.keys import attempt_prefix
from nereus.kernel.model import Attempt, AttemptStatus, Table
from tests.support.pulsar_env import pulsar_client, pulsar_url, read_all, unique_topic

__all__ = ["pulsar_client", "pulsar_url"]

ROOT = Path(__file__).resolve().parents[3]
IN_FLIGHT = int(os.environ.get("NEREUS_PULSAR_KILL_TIMERS", "600"))


def _settle(n: Nereus, count: int, timeout_s: float) -> dict[str, str]:
    """Wait until every timer is DELIVERED (an UNKNOWN one found by the recovery search is
    PUBLISHED); the statuses at the end."""
    deadline = time.monotonic() + timeout_s
    while True:
        statuses = {f"k{i}": n.peek("q", f"k{i}").status or "" for i in range(count)}
        if all(s == "DELIVERED" for s in statuses.values()) or time.monotonic() > deadline:
            return statuses
        time.sleep(0.2)


def _check_ledger(n: Nereus, client: Any, topic: str, count: int) -> Counter[str]:
    copies = Counter(m.properties()["nereus-message-id"] for m in read_all(client, topic))
    with n.store.read() as view:
        for i in range(count):
            peek = n.peek("q", f"k{i}")
            assert peek.message_id in copies, f"k{i} lost"
            if copies[peek.message_id or ""] > 1:
                prefix = attempt_prefix(peek.message_id or "", peek.generation or 1).encode()
                attempts = [a for _, a in view.range(Table.ATTEMPTS, prefix, prefix + b"\xff")]
                assert (
                    any(
                        isinstance(a, Attempt) and a.status is AttemptStatus.UNKNOWN
                        for a in attempts
                    )
                    or len(attempts) > 1
                ), f"k{i} written twice without an uncertain attempt"
    return copies


def test_kill_9_mid_fire_and_restart_loses_nothing(
    tmp_path: Path, pulsar_url: str, pulsar_client: Any
) -> None:
    topic = unique_topic("kill")
    data = str(tmp_path / "data")
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.support.pulsar_worker",
            data,
            pulsar_url,
            topic,
            str(IN_FLIGHT),
            "1500",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )
    try:
        assert worker.stdout is not None
        word, base = worker.stdout.readline().split()
        assert word == b"scheduled"
        # A third of the way through the fire (3 s from base).
        time.sleep(max(int(base) + 1_000 - int(time.time() * 1000), 0) / 1000)
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
    before = len(read_all(pulsar_client, topic))
    assert 0 < before < IN_FLIGHT, "the kill should come mid-fire"
    dest = PulsarDestination(PulsarTargetConfig(service_url=pulsar_url, topics={"q": topic}))
    with Nereus.open(data, destination=dest, assume_clock_error_ms=5) as n:
        n.start()
        statuses = _settle(n, IN_FLIGHT, 90)
        assert set(statuses.values()) == {"DELIVERED"}, Counter(statuses.values())
        copies = _check_ledger(n, pulsar_client, topic, IN_FLIGHT)
    assert len(copies) == IN_FLIGHT


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    env = {
        **os.environ,
        "NEREUS_PULSAR_PORT": "26650",
        "NEREUS_PULSAR_WEB_PORT": "28080",
        "NEREUS_PULSAR_DIR": str(tmp_path / "broker"),
        "NEREUS_PULSAR_KEEP_DATA": "1",
    }
    script = str(ROOT / "scripts" / "pulsar")
    subprocess.run([script, "start"], env=env, check=True, timeout=300)
    try:
        yield "pulsar://127.0.0.1:26650", env
    finally:
        subprocess.run(
            [script, "stop"], check=False, env={**env, "NEREUS_PULSAR_KEEP_DATA": ""}, timeout=120
        )


def test_the_broker_stopped_and_restarted_during_a_fire(
    tmp_path: Path, own_broker: tuple[str, dict[str, str]]
) -> None:
    url, env = own_broker
    script = str(ROOT / "scripts" / "pulsar")
    topic, count = unique_topic("restart"), 300
    client = pulsar.Client(url)
    consumer = client.subscribe(topic, "shared", consumer_type=pulsar.ConsumerType.Shared)
    dest = PulsarDestination(
        PulsarTargetConfig(service_url=url, topics={"q": topic}, send_timeout_ms=120_000)
    )
    seen: list[tuple[int, str, int]] = []
    try:
        with Nereus.open(str(tmp_path / "data"), destination=dest, assume_clock_error_ms=5) as n:
            n.start()
            base = int(time.time() * 1000) + 500
            for i in range(count):
                n.schedule("q", f"k{i}", b"x", deliver_at_ms=base + i * 10, txn=f"t{i}")
            time.sleep(1.5)  # part of them fired
            subprocess.run([script, "stop"], env=env, check=True, timeout=120)
            subprocess.run([script, "start"], env=env, check=True, timeout=300)
            statuses = _settle(n, count, 120)
            assert set(statuses.values()) == {"DELIVERED"}, Counter(statuses.values())
            deadline = time.monotonic() + 30
            while len({mid for _, mid, _ in seen}) < count and time.monotonic() < deadline:
                try:
                    msg = consumer.receive(500)
                except pulsar.Timeout:
                    continue
                props = msg.properties()
                seen.append(
                    (
                        int(time.time() * 1000),
                        props["nereus-message-id"],
                        int(props["nereus-deliver-at"]),
                    )
                )
                consumer.acknowledge(msg)
            copies = _check_ledger(n, client, topic, count)
        assert len(copies) == count
        assert all(at >= deliver for at, _, deliver in seen), "visible before deliverAt"
    finally:
        client.close()
