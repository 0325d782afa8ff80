"""The `[kafka]` section of the service configuration, and secrets named as environment
variables (`{ env = "NAME" }`) instead of written in the file, for Kafka settings and for
the AES keys of encrypted queues.

Settings are flattened to librdkafka's dotted names (quoted or as TOML's nested keys); the
ones Nereus sets itself per client are refused with the file and key named; librdkafka
judges the rest when `nereus serve --kafka` starts, before it connects anywhere (so a
misspelled setting is refused at once, naming it). A secret's variable that is not set
refuses the file, naming the key and the variable and never printing a value.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nereus.adapters.compose.destinations import kafka_topics
from nereus.adapters.kafka.settings import refusal
from nereus.adapters.tenancy import ConfigError, Tenancy, load_tenancy
from tests.support.http_harness import KEY_B64

ROOT = Path(__file__).resolve().parents[3]

TENANT = """
[tenants.acme]
[[tenants.acme.tokens]]
token = "tok-acme"
subject = "app"
grants = ["produce", "read"]
"""


def _load(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> dict[str, object]:
    path = tmp_path / "nereus.toml"
    path.write_text(text + TENANT)
    return dict(load_tenancy(str(path), env or {}).kafka_settings)


def test_kafka_settings_are_flat_librdkafka_names_with_secrets_from_the_environment(
    tmp_path: Path,
) -> None:
    settings = _load(
        tmp_path,
        """
[kafka]
"security.protocol" = "SASL_SSL"
sasl.mechanism = "SCRAM-SHA-512"
sasl.username = "nereus"
sasl.password = { env = "KAFKA_PASSWORD" }
ssl.ca.location = "/etc/ssl/certs/ca.pem"
socket.keepalive.enable = true
"reconnect.backoff.ms" = 250
""",
        {"KAFKA_PASSWORD": "s3cret"},
    )
    assert settings == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "nereus",
        "sasl.password": "s3cret",
        "ssl.ca.location": "/etc/ssl/certs/ca.pem",
        "socket.keepalive.enable": True,
        "reconnect.backoff.ms": 250,
    }
    assert _load(tmp_path, "") == {}


@pytest.mark.parametrize(
    ("section", "env", "key", "problem"),
    [
        (
            'sasl.password = { env = "KAFKA_PASSWORD" }',
            {},
            "kafka.sasl.password",
            "KAFKA_PASSWORD is not set",
        ),
        (
            'sasl.password = { env = "KAFKA_PASSWORD" }',
            {"KAFKA_PASSWORD": ""},
            "kafka.sasl.password",
            "KAFKA_PASSWORD is empty",
        ),
        ('"bootstrap.servers" = "b:9092"', {}, "kafka.bootstrap.servers", "--kafka"),
        ('"group.id" = "mine"', {}, "kafka.group.id", "--group"),
        ('"enable.idempotence" = false', {}, "kafka.enable.idempotence", "Nereus sets this"),
        ('"isolation.level" = "read_uncommitted"', {}, "kafka.isolation.level", "Nereus sets"),
        ('"error_cb" = "print"', {}, "kafka.error_cb", "callback"),
        ('"sasl.kerberos.kinit.cmd" = ["kinit"]', {}, "kafka.sasl.kerberos.kinit.cmd", "list"),
    ],
    ids=[
        "unset variable",
        "empty variable",
        "brokers",
        "group",
        "idempotence",
        "isolation",
        "callback",
        "list value",
    ],
)
def test_a_bad_kafka_setting_refuses_the_file_naming_the_key(
    tmp_path: Path, section: str, env: dict[str, str], key: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, f"[kafka]\n{section}\n", env)
    assert caught.value.key == key
    assert problem in caught.value.problem
    assert "s3cret" not in str(caught.value)


def test_aes_keys_may_come_from_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "nereus.toml"
    path.write_text('[keys]\nk1 = { env = "NEREUS_KEY_K1" }\n' + TENANT)
    tenancy = load_tenancy(str(path), {"NEREUS_KEY_K1": KEY_B64})
    assert "k1" in tenancy.keyring
    with pytest.raises(ConfigError) as caught:
        load_tenancy(str(path), {})
    assert (caught.value.key, caught.value.problem) == (
        "keys.k1",
        "the environment variable NEREUS_KEY_K1 is not set",
    )
    with pytest.raises(ConfigError) as caught:
        load_tenancy(str(path), {"NEREUS_KEY_K1": "bm90IDMyIGJ5dGVz"})
    assert caught.value.key == "keys.k1" and "32" in caught.value.problem
    assert "bm90IDMyIGJ5dGVz" not in str(caught.value)


def test_librdkafka_judges_the_settings_it_knows() -> None:
    assert refusal({}) is None
    plain = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"}
    assert refusal({**plain, "sasl.username": "u", "sasl.password": "p"}) is None
    problem = refusal(plain)
    assert problem is not None and "sasl.password must be set" in problem
    assert refusal({"fetch.min.bytes": 10}) is None  # a consumer's setting: fine for all
    problem = refusal({"sasl.pasword": "x"})
    assert problem is not None and "sasl.pasword" in problem
    problem = refusal({"socket.timeout.ms": "soon"})
    assert problem is not None and "socket.timeout.ms" in problem


def test_serve_kafka_refuses_a_misspelled_setting_before_connecting(tmp_path: Path) -> None:
    config = tmp_path / "nereus.toml"
    config.write_text('[kafka]\n"sasl.pasword" = "x"\n' + TENANT)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "nereus",
            "serve",
            "--kafka",
            "127.0.0.1:1",  # nothing listens: the refusal must come first
            "--data",
            str(tmp_path / "data"),
            "--config",
            str(config),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    (refused,) = [
        doc
        for doc in map(json.loads, filter(None, done.stderr.splitlines()))
        if doc["event"] == "refused"
    ]
    assert "sasl.pasword" in refused["detail"] and refused["key"] == "kafka"
    assert refused["config"] == str(config)


# A tenant's deliveries are its own: `[kafka_destination]` and `--topic` ------------------------

TWO_TENANTS = (
    TENANT
    + """
[tenants.globex]
[[tenants.globex.tokens]]
token = "tok-globex"
subject = "app"
grants = ["produce", "read"]
"""
)


def _tenancy(tmp_path: Path, destination: str, tenants: str = TWO_TENANTS) -> Tenancy:
    path = tmp_path / "nereus.toml"
    path.write_text(destination + tenants)
    return load_tenancy(str(path), {})


@pytest.mark.parametrize(
    ("topics", "key", "mapping"),
    [
        # A bare key is every tenant's queue.
        ('same = "orders"', "kafka_destination.topics.same", {"same": "orders"}),
        (
            '"acme/same" = "orders"\n"globex/same" = "orders"',
            "kafka_destination.topics.globex/same",
            {"acme/same": "orders", "globex/same": "orders"},
        ),
    ],
)
def test_two_tenants_mapped_to_one_kafka_topic_are_refused_unless_it_is_shared(
    tmp_path: Path, topics: str, key: str, mapping: dict[str, str]
) -> None:
    with pytest.raises(ConfigError) as caught:
        _tenancy(tmp_path, f"[kafka_destination.topics]\n{topics}\n")
    assert caught.value.key == key and caught.value.source == str(tmp_path / "nereus.toml")
    for word in ("'acme'", "'globex'", "'same'", "'orders'", "shared_topics"):
        assert word in caught.value.problem, caught.value.problem
    declared = '[kafka_destination]\nshared_topics = ["orders"]\n'
    shared = _tenancy(tmp_path, f"{declared}[kafka_destination.topics]\n{topics}\n")
    assert kafka_topics(shared, []) == mapping


def test_each_tenant_its_own_topic_and_the_command_line_checked_too(tmp_path: Path) -> None:
    tenancy = _tenancy(
        tmp_path, '[kafka_destination.topics]\n"acme/same" = "same-a"\n"globex/same" = "same-g"\n'
    )
    assert kafka_topics(tenancy, ["acme/audit=audit-a"]) == {
        "acme/same": "same-a",
        "globex/same": "same-g",
        "acme/audit": "audit-a",
    }
    with pytest.raises(ConfigError) as caught:
        kafka_topics(tenancy, ["globex/same=same-a"])  # the flag sends globex to acme's
    assert (caught.value.source, caught.value.key) == ("--topic", "globex/same=same-a")
    with pytest.raises(ConfigError) as nested:
        nested_names = TWO_TENANTS.replace("tenants.globex", 'tenants."acme.eu"')
        kafka_topics(_tenancy(tmp_path, "", nested_names), [])  # acme's `eu.x` is acme.eu's `x`
    assert nested.value.key == "tenants" and "'acme.eu'" in nested.value.problem


def test_serve_kafka_refuses_two_tenants_on_one_topic_before_connecting(tmp_path: Path) -> None:
    config = tmp_path / "nereus.toml"
    config.write_text(TWO_TENANTS)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "nereus",
            "serve",
            "--kafka",
            "127.0.0.1:1",  # nothing listens: the refusal must come first
            "--data",
            str(tmp_path / "data"),
            "--config",
            str(config),
            "--topic",
            "same=orders",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    (refused,) = [
        doc
        for doc in map(json.loads, filter(None, done.stderr.splitlines()))
        if doc["event"] == "refused"
    ]
    assert refused["detail"].startswith("--topic: same=orders: tenants 'acme'")
    assert "'globex'" in refused["detail"] and "'orders'" in refused["detail"]
