"""`nereus serve --kafka` reaches a cluster that needs a login, with the `[kafka]` settings of
its config file and the password taken from an environment variable.

A broker of this module's own has a SASL_PLAINTEXT listener (mechanism PLAIN) beside its
plaintext one (`tests/support/own_broker.py`). The service is pointed at the SASL listener only:
with
the right password (from `NEREUS_TEST_KAFKA_PASSWORD`, never in the file) it creates its
topics, owns the shard, schedules over HTTP and delivers to the destination topic, read back
here; with a wrong one it refuses to start within seconds, saying the login failed.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.support.kafka_cluster import ServiceProc, Topics, schedule_op
from tests.support.kafka_env import create_topic, unique_topic
from tests.support.own_broker import SASL_PASSWORD, SASL_USER, Broker, own_broker_fixture

broker = own_broker_fixture("sasl-broker", sasl=True)

PASSWORD_ENV = "NEREUS_TEST_KAFKA_PASSWORD"
CONFIG = f"""
[kafka]
security.protocol = "SASL_PLAINTEXT"
sasl.mechanism = "PLAIN"
sasl.username = "{SASL_USER}"
sasl.password = {{ env = "{PASSWORD_ENV}" }}

[tenants.acme]
[[tenants.acme.tokens]]
token = "tok-acme"
subject = "sasl-test"
grants = ["produce", "read"]
"""


def _service(broker: Broker, tmp_path: Path) -> ServiceProc:
    assert broker.sasl_bootstrap is not None
    destination = create_topic(broker.bootstrap, unique_topic("dest"))  # over plaintext
    config = tmp_path / "nereus.toml"
    config.write_text(CONFIG)
    proc = ServiceProc(
        "sasl",
        broker.sasl_bootstrap,
        Topics.unique(destination),
        tmp_path / "data",
        shards=1,
        extra=("--config", str(config)),
    )
    proc.token = "tok-acme"
    return proc


def _read(bootstrap: str, topic: str, timeout_s: float) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique_topic("reader"),
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and m.error() is None:
                return [m.value() or b""]
        return []
    finally:
        consumer.close()


def test_serve_kafka_logs_in_with_the_password_from_the_environment(
    broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PASSWORD_ENV, SASL_PASSWORD)
    proc = _service(broker, tmp_path).start()
    try:
        proc.wait_serving(120)
        deadline = time.monotonic() + 120
        while proc.active_shards() != {0}:
            assert time.monotonic() < deadline, proc.log_tail()
            time.sleep(0.2)
        (result,) = proc.schedule([schedule_op("k1", 200)])
        assert result["status"] == "scheduled", result
        delivered = _read(broker.bootstrap, proc.topics.destination, 60)
        assert delivered == [b"payload-k1"], proc.log_tail()
    finally:
        assert proc.stop() == 0, proc.log_tail()
    assert SASL_PASSWORD not in proc.log_path.read_text()


def test_a_wrong_password_refuses_to_start_saying_why(
    broker: Broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PASSWORD_ENV, "not-the-password")
    proc = _service(broker, tmp_path).start()
    assert proc.proc is not None
    assert proc.proc.wait(60) == 2, proc.log_tail()
    (refused,) = [e for e in proc.events() if e.get("event") == "refused"]
    assert "Authentication failed" in refused["detail"], refused
    assert proc.bootstrap in refused["detail"]
