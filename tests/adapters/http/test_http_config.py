"""The service configuration: TOML into typed structs, refused at start with the file and key
named; `nereus serve --config` and the no-config defaults (loopback only, `auth_disabled`)."""

from __future__ import annotations

import copy
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from nereus.adapters.cli.main import main
from nereus.adapters.tenancy import ConfigError, Tenancy, load_tenancy, parse_tenancy
from nereus.kernel.config import KernelConfig
from nereus.kernel.timing import TimingLimits
from tests.support.http_harness import KEY_B64, config
from tests.support.serve_process import serve, stop, wait_serving

ROOT = Path(__file__).resolve().parents[3]

GOOD_TOML = f"""
[server]
host = "127.0.0.1"
port = 0
max_body_bytes = 65536

[cell]
horizon_ms = 86400000
max_payload_bytes = 4096

[keys]
k1 = "{KEY_B64}"

[tenants.acme]
horizon_ms = 3600000
max_live_timers = 10
max_bytes = 1000
max_payload_bytes = 512
max_ops_per_s = 50
blocked = false

[[tenants.acme.tokens]]
token_sha256 = "{"a" * 64}"
subject = "billing-service"
grants = ["produce", "read", "admin"]

[[tenants.acme.tokens]]
token = "clear-text-token"
subject = "dashboard"
grants = ["read"]

[tenants.acme.queues.reminders]
encryption_key = "k1"
"""


def _write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "nereus.toml"
    path.write_text(text)
    return str(path)


def test_a_full_config_loads_into_typed_limits(tmp_path: Path) -> None:
    t = load_tenancy(_write(tmp_path, GOOD_TOML))
    assert not t.auth_disabled
    assert t.server.max_body_bytes == 65536
    acme = t.tenants["acme"]
    assert acme.queue_keys == {"reminders": "k1"}
    assert (acme.max_live_timers, acme.max_bytes, acme.max_ops_per_s) == (10, 1000, 50)
    assert acme.max_appending_deletes_per_s == 50.0  # the default: DELETEs are always bounded
    limits = t.limits("acme", KernelConfig())
    assert limits.horizon_ms == 3_600_000  # min(kernel, cell, tenant)
    assert limits.payload_ceiling == 512  # min(1 MiB, cell, plan)
    assert sorted(p.subject or "" for _, p in t.credentials) == ["billing-service", "dashboard"]
    assert "k1" in t.keyring


def test_without_a_config_one_default_tenant_holds_every_grant() -> None:
    t = Tenancy.open_default()
    assert t.auth_disabled and list(t.tenants) == ["default"] and t.credentials == []
    limits = t.limits("default", KernelConfig())
    assert limits.horizon_ms == KernelConfig().limits.max_delay_horizon_ms
    assert limits.payload_ceiling == 1024 * 1024


def _refused(doc: dict[str, Any], key: str | None, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_tenancy(doc, "/etc/nereus.toml")
    err = info.value
    assert err.source == "/etc/nereus.toml"
    assert err.key == key, str(err)
    assert str(err).startswith("/etc/nereus.toml: ")
    assert words in str(err), str(err)


def _with(path: str, value: Any) -> dict[str, Any]:
    doc = config()
    node: Any = doc
    parts = path.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return doc


@pytest.mark.parametrize(
    ("doc", "key", "words"),
    [
        ({**config(), "colour": "red"}, "colour", "unknown key"),
        (_with("server.colour", 1), "server.colour", "unknown key"),
        (_with("tenants.acme.colour", 1), "tenants.acme.colour", "unknown key"),
        (_with("tenants.acme.queues.q.colour", 1), "tenants.acme.queues.q.colour", "unknown key"),
        (_with("server.port", "6632"), "server.port", "expected `int`"),
        (_with("server.port", 70000), "server.port", "not a TCP port"),
        (_with("server.max_body_bytes", 0), "server.max_body_bytes", "must be positive"),
        (_with("cell.max_payload_bytes", 1024 * 1024 + 1), "cell.max_payload_bytes", "1 MiB"),
        (
            _with("tenants.acme.max_payload_bytes", 2 * 1024 * 1024),
            "tenants.acme.max_payload_bytes",
            "1 MiB",
        ),
        (_with("tenants.acme.max_live_timers", -1), "tenants.acme.max_live_timers", ">= 0"),
        (_with("tenants.acme.max_ops_per_s", 0), "tenants.acme.max_ops_per_s", "positive"),
        (
            _with("tenants.acme.max_appending_deletes_per_s", 0),
            "tenants.acme.max_appending_deletes_per_s",
            "positive",
        ),
        (_with("tenants.acme.blocked", "yes"), "tenants.acme.blocked", "expected `bool`"),
        (
            _with("tenants.acme.queues.q.encryption_key", "nope"),
            "tenants.acme.queues.q.encryption_key",
            "not in [keys]",
        ),
        (_with("keys.k2", "c2hvcnQ="), "keys.k2", "32"),
        (_with("keys.k2", "!!!"), "keys.k2", "base64"),
        (_with("tenants", {}), "tenants", "no tenant"),
        (_with("tenants.a/b", {}), "tenants.a/b", "without '/'"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_bad_configs_are_refused_naming_the_key(
    doc: dict[str, Any], key: str | None, words: str
) -> None:
    _refused(doc, key, words)


def test_a_tenant_horizon_may_only_narrow_the_cells() -> None:
    doc = config(acme={"horizon_ms": 2_000})
    doc["cell"] = {"horizon_ms": 1_000}
    _refused(doc, "tenants.acme.horizon_ms", "above the cell's horizon_ms 1000")


def test_the_cell_may_only_narrow_the_kernel_horizon() -> None:
    doc = config()
    doc["cell"] = {"horizon_ms": 10_000}
    t = parse_tenancy(doc, "n.toml")
    t.check_kernel(KernelConfig())  # fine: 10 s < 90 days
    small = KernelConfig(
        limits=TimingLimits(max_delay_horizon_ms=5_000, max_message_lifetime_ms=10_000_000)
    )
    with pytest.raises(ConfigError) as info:
        t.check_kernel(small)
    assert info.value.key == "cell.horizon_ms" and "n.toml" in str(info.value)


def test_token_rules() -> None:
    doc = config()
    dup = copy.deepcopy(doc["tenants"]["acme"]["tokens"][0])
    doc["tenants"]["globex"]["tokens"].append(dup)
    _refused(doc, "tenants.globex.tokens[1]", "already listed at tenants.acme.tokens[0]")
    # The same token once by digest and once in clear is still the same token.
    doc = config()
    doc["tenants"]["acme"]["tokens"].append(
        {"token": "globex-all", "subject": "x", "grants": ["read"]}
    )
    _refused(doc, "tenants.globex.tokens[0]", "already listed at tenants.acme.tokens[5]")
    doc = config()
    doc["tenants"]["acme"]["tokens"][0]["token"] = "both"
    _refused(doc, "tenants.acme.tokens[0]", "exactly one of token_sha256 and token")
    doc = config()
    doc["tenants"]["acme"]["tokens"][0]["token_sha256"] = "ABC"
    _refused(doc, "tenants.acme.tokens[0].token_sha256", "64 lowercase hex")
    doc = config()
    doc["tenants"]["acme"]["tokens"][0]["grants"] = ["produce", "root"]
    _refused(doc, "tenants.acme.tokens[0].grants[1]", "invalid enum value")
    doc = config()
    del doc["tenants"]["acme"]["tokens"][0]["subject"]
    _refused(doc, "tenants.acme.tokens[0].subject", "required key is missing")


def test_unreadable_or_malformed_files_are_refused_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_tenancy(str(tmp_path / "missing.toml"))
    assert "missing.toml" in str(info.value) and "cannot read" in str(info.value)
    with pytest.raises(ConfigError) as info:
        load_tenancy(_write(tmp_path, "[server\nport = 1"))
    assert "nereus.toml" in str(info.value) and "not valid TOML" in str(info.value)


def _log_lines(err: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in err.splitlines() if line.startswith("{")]


def test_serve_refuses_a_bad_config_with_the_file_and_key_and_no_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, GOOD_TOML.replace("blocked = false", "blocked = false\nquota = 1"))
    code = main(["serve", "--data", str(tmp_path / "data"), "--config", path])
    assert code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = [r for r in _log_lines(err) if r["event"] == "refused"]
    assert line["config"] == path and line["key"] == "tenants.acme.quota"
    assert path in line["detail"] and "unknown key" in line["detail"]
    assert not (tmp_path / "data").exists(), "refused before opening the store"


def test_serve_without_config_refuses_a_non_loopback_address(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["serve", "--data", str(tmp_path / "data"), "--http", "0.0.0.0:0"])
    assert code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = [r for r in _log_lines(err) if r["event"] == "refused"]
    assert "loopback" in line["detail"] and "--config" in line["detail"]


def _get(port: int, path: str, token: str | None = None) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return err.code


def test_serve_with_a_config_authenticates(tmp_path: Path) -> None:
    text = GOOD_TOML.replace('token = "clear-text-token"', 'token = "s3cret"')
    proc, port = serve(tmp_path / "data", "--config", _write(tmp_path, text))
    try:
        lines = wait_serving(proc)
        events = [r["event"] for r in lines]
        assert "auth_disabled" not in events
        (tenancy,) = [r for r in lines if r["event"] == "tenancy"]
        assert tenancy["tenants"] == ["acme"] and tenancy["tokens"] == 2
        assert "s3cret" not in json.dumps(lines), "a token must never be logged"
        assert _get(port, "/api/v1/timers/reminders/k") == 401
        assert _get(port, "/api/v1/timers/reminders/k", "wrong") == 401
        assert _get(port, "/api/v1/timers/reminders/k", "s3cret") == 200
        assert _get(port, "/healthz") == 200
    finally:
        stop(proc)


def test_serve_without_a_config_logs_auth_disabled(tmp_path: Path) -> None:
    proc, port = serve(tmp_path / "data")
    try:
        lines = wait_serving(proc)
        assert "auth_disabled" in [r["event"] for r in lines]
        assert _get(port, "/api/v1/timers/reminders/k") == 200  # no credential needed
    finally:
        stop(proc)
