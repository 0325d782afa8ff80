"""The service configuration (`nereus serve --config FILE`, TOML) and the tenancy it implies.

    tenancy = load_tenancy("nereus.toml")          # or Tenancy.open_default()
    tenancy.check_kernel(kernel_config)           # ConfigError if it would widen the kernel

Theory of operation: the file is parsed with `tomllib` and converted into frozen msgspec
structs that refuse unknown keys (the schema: `adapters.config_file`); every other rule (a
tenant horizon above the cell's, a payload ceiling above 1 MiB, a queue naming an unknown
key, a key that is not 32 bytes, a token listed twice, two tenants mapped to one destination
topic not declared shared (`[kafka_destination]`: `adapters.tenant_topics`), ...) is checked
here too, so a bad file stops the service at start with a `ConfigError` naming the file and
the key, never a traceback. The result is a `Tenancy`: per tenant its derived limits (horizon,
payload ceiling, quotas, rate), its queues' encryption keys, and the bearer credentials that
map to it (kept as sha256 digests only).

Without a file the service has one tenant, `default`, that needs no credential and holds
every grant (`Tenancy.open_default()`, `auth_disabled`).

Secrets need not be written in the file: a value `{ env = "NAME" }` (a key of `[keys]`, a
setting of `[kafka]`) is read from the environment variable NAME when the file is loaded,
and a variable that is not set (or empty) refuses the file, naming both. `[kafka]` holds
librdkafka client settings for Kafka mode (SASL, TLS, socket tuning, ...), given to every
client Nereus makes; dotted names may be quoted (`"sasl.mechanism" = "PLAIN"`) or written
as TOML's nested keys (`sasl.mechanism = "PLAIN"`), which is the same table. The settings
Nereus makes per client itself (ids, idempotence, isolation, timeouts it depends on, the
brokers) are refused here; librdkafka itself judges the rest when Kafka mode starts
(`adapters.kafka.settings`).

No edge is imported here: the grants and the payload ceiling are the service's
(`service.access`), the `[server]` limits the file's (`adapters.config_file`). The `[pulsar]`
section is kept raw: the Pulsar edge's routing is parsed and checked where the service is
composed (`adapters.compose.config`), which also refuses a bad section at load.
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from nereus.adapters.config_file import (
    DEFAULT_APPENDING_DELETES_PER_S,
    CellSection,
    ConfigError,
    ConfigFile,
    HttpLimits,
    KafkaValue,
    QueueSection,
    ServerSection,
    TenantSection,
    TokenSection,
    convert,
    kafka_settings,
    resolve,
)
from nereus.adapters.crypto import Keyring
from nereus.adapters.tenant_topics import KafkaTopicsSection, topic_problem
from nereus.kernel.config import KernelConfig
from nereus.kernel.keys import DEFAULT_TENANT
from nereus.service.access import GRANTS, MAX_PAYLOAD_CEILING_BYTES, Grant

__all__ = [
    "ConfigError",
    "Limits",
    "Principal",
    "Tenancy",
    "TenantPolicy",
    "load_tenancy",
    "parse_tenancy",
]

_HEX64 = re.compile(r"[0-9a-f]{64}")
# Names that become identity parts: the kernel's rules (non-empty, no NUL, no '/').
_MAX_NAME_BYTES = 150
# A burst of connects larger than the backlog is refused or retried by the kernel for
# seconds; a burst of a thousand must be queued.
_MIN_BACKLOG = 1024
Fail = Callable[[str, str], ConfigError]


@dataclass(frozen=True)
class Principal:
    """Who a request is: the credential's tenant, subject (recorded as producerSub) and
    grants."""

    tenant: str
    subject: str | None
    grants: frozenset[Grant]


@dataclass(frozen=True)
class TenantPolicy:
    name: str
    horizon_ms: int | None  # None: the cell's
    max_payload_bytes: int | None  # None: the cell's
    max_live_timers: int | None
    max_bytes: int | None
    max_ops_per_s: float | None
    blocked: bool
    queue_keys: dict[str, str] = field(default_factory=dict)  # queue -> encryption key id
    # Encrypted queues whose headers stay clear (`seal_headers = false`); the rest seal them.
    clear_header_queues: frozenset[str] = frozenset()
    # Per credential (tenant and token subject) and process (specs/http.md, "Rate limit").
    max_appending_deletes_per_s: float = DEFAULT_APPENDING_DELETES_PER_S

    @property
    def has_quota(self) -> bool:
        return self.max_live_timers is not None or self.max_bytes is not None

    def sealed_headers(self, queue: str) -> bool:
        """Whether `queue`'s headers are sealed inside its payload's envelope."""
        return queue in self.queue_keys and queue not in self.clear_header_queues


@dataclass(frozen=True)
class Limits:
    """The derived limits of one tenant in this cell."""

    horizon_ms: int
    payload_ceiling: int


@dataclass
class Tenancy:
    source: str
    server: ServerSection
    cell: CellSection
    tenants: dict[str, TenantPolicy]
    credentials: list[tuple[bytes, Principal]]  # (sha256 digest of the token, principal)
    keyring: Keyring
    auth_disabled: bool = False
    # `[kafka]`: librdkafka client settings for Kafka mode, secrets resolved.
    kafka_settings: dict[str, KafkaValue] = field(default_factory=dict)
    pulsar: dict[str, object] = field(default_factory=dict)  # the raw `[pulsar]` section
    kafka_destination: KafkaTopicsSection = field(default_factory=KafkaTopicsSection)

    @classmethod
    def open_default(cls) -> Tenancy:
        """No configuration: one tenant, no credentials, every grant."""
        tenant = TenantPolicy(DEFAULT_TENANT, None, None, None, None, None, False)
        return cls(
            source="(no --config)",
            server=ServerSection(),
            cell=CellSection(),
            tenants={DEFAULT_TENANT: tenant},
            credentials=[],
            keyring=Keyring({}),
            auth_disabled=True,
        )

    def check_kernel(self, kernel: KernelConfig) -> None:
        """The cell may only narrow what the kernel allows."""
        horizon = kernel.limits.max_delay_horizon_ms
        if self.cell.horizon_ms is not None and self.cell.horizon_ms > horizon:
            raise ConfigError(
                self.source,
                "cell.horizon_ms",
                f"{self.cell.horizon_ms} is above the kernel's max_delay_horizon_ms {horizon}; "
                "the cell may only narrow it",
            )

    def limits(self, tenant: str, kernel: KernelConfig) -> Limits:
        policy = self.tenants[tenant]
        horizon = kernel.limits.max_delay_horizon_ms
        for narrower in (self.cell.horizon_ms, policy.horizon_ms):
            if narrower is not None:
                horizon = min(horizon, narrower)
        ceiling = min(MAX_PAYLOAD_CEILING_BYTES, kernel.max_payload_bytes)
        for narrower in (self.cell.max_payload_bytes, policy.max_payload_bytes):
            if narrower is not None:
                ceiling = min(ceiling, narrower)
        return Limits(horizon_ms=horizon, payload_ceiling=ceiling)


def load_tenancy(path: str, environ: Mapping[str, str] | None = None) -> Tenancy:
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(path, None, f"cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, None, f"not valid TOML: {exc}") from None
    return parse_tenancy(doc, path, environ)


def parse_tenancy(
    doc: dict[str, object], source: str, environ: Mapping[str, str] | None = None
) -> Tenancy:
    """`environ` (default: the process's) resolves `{ env = "NAME" }` values."""
    env = os.environ if environ is None else environ
    return _build(convert(doc, ConfigFile, "", source), source, env)


def _name_ok(name: str) -> bool:
    if not name or "\x00" in name or "/" in name:
        return False
    return len(name.encode()) <= _MAX_NAME_BYTES


def _build(cfg: ConfigFile, source: str, env: Mapping[str, str]) -> Tenancy:
    def fail(key: str, problem: str) -> ConfigError:
        return ConfigError(source, key, problem)

    _check_server(cfg.server, fail)
    _check_cell(cfg.cell, fail)
    keyring = _keyring(cfg.keys, source, env, fail)
    settings = kafka_settings(cfg.kafka, source, env)
    if not cfg.tenants:
        raise fail("tenants", "no tenant is configured: nobody could authenticate")
    tenants: dict[str, TenantPolicy] = {}
    credentials: list[tuple[bytes, Principal]] = []
    seen: dict[bytes, str] = {}
    for name, raw_tenant in cfg.tenants.items():
        at = f"tenants.{name}"
        t = convert(raw_tenant, TenantSection, at, source)
        if not _name_ok(name):
            raise fail(at, f"tenant names are 1..{_MAX_NAME_BYTES} bytes without '/' or NUL")
        _check_tenant(t, at, cfg.cell, fail)
        tenants[name] = _policy(name, t, _queues(t, at, keyring, source, fail))
        credentials.extend(_credentials(name, t, at, seen, fail))
    tenancy = Tenancy(
        source=source,
        server=cfg.server,
        cell=cfg.cell,
        tenants=tenants,
        credentials=credentials,
        keyring=keyring,
        kafka_settings=settings,
        pulsar=cfg.pulsar,
        kafka_destination=cfg.kafka_destination,
    )
    # The mappings themselves; Kafka mode checks the names it derives too
    # (`adapters.compose.destinations.kafka_topics`).
    section = cfg.kafka_destination
    clash = topic_problem(section.topics, tenants, shared=section.shared_topics, open_ended=False)
    if clash is not None:
        key = "kafka_destination.topics" + (f".{clash.key}" if clash.key else "")
        raise fail(key, clash.problem)
    return tenancy


def _check_server(server: ServerSection, fail: Fail) -> None:
    if not 0 <= server.port <= 65535:
        raise fail("server.port", f"{server.port} is not a TCP port")
    for name in HttpLimits.__struct_fields__:
        if getattr(server, name) <= 0:
            raise fail(f"server.{name}", "must be positive")
    if server.backlog < _MIN_BACKLOG:
        raise fail("server.backlog", f"must be at least {_MIN_BACKLOG}")
    if not server.host:
        raise fail("server.host", "must not be empty")


def _check_cell(cell: CellSection, fail: Fail) -> None:
    if cell.horizon_ms is not None and cell.horizon_ms < 0:
        raise fail("cell.horizon_ms", "must be >= 0")
    if cell.max_payload_bytes is not None and not (
        0 <= cell.max_payload_bytes <= MAX_PAYLOAD_CEILING_BYTES
    ):
        raise fail("cell.max_payload_bytes", f"must be in [0, {MAX_PAYLOAD_CEILING_BYTES}] (1 MiB)")


def _keyring(
    raw_keys: Mapping[str, object], source: str, env: Mapping[str, str], fail: Fail
) -> Keyring:
    keys: dict[str, str] = {}
    for key_id, raw_key in raw_keys.items():
        encoded = resolve(raw_key, f"keys.{key_id}", source, env)
        if not isinstance(encoded, str):
            raise fail(f"keys.{key_id}", 'must be a base64 string or { env = "NAME" }')
        try:
            Keyring({key_id: encoded})
        except ValueError as exc:
            raise fail(f"keys.{key_id}", str(exc)) from None
        keys[key_id] = encoded
    return Keyring(keys)


def _check_tenant(t: TenantSection, at: str, cell: CellSection, fail: Fail) -> None:
    """A tenant's own limits: each may only narrow the cell's."""
    if t.horizon_ms is not None:
        if t.horizon_ms < 0:
            raise fail(f"{at}.horizon_ms", "must be >= 0")
        if cell.horizon_ms is not None and t.horizon_ms > cell.horizon_ms:
            raise fail(
                f"{at}.horizon_ms",
                f"{t.horizon_ms} is above the cell's horizon_ms {cell.horizon_ms}; a tenant "
                "may only narrow it",
            )
    if t.max_payload_bytes is not None and not (
        0 <= t.max_payload_bytes <= MAX_PAYLOAD_CEILING_BYTES
    ):
        raise fail(
            f"{at}.max_payload_bytes", f"must be in [0, {MAX_PAYLOAD_CEILING_BYTES}] (1 MiB)"
        )
    for quota in ("max_live_timers", "max_bytes"):
        value = getattr(t, quota)
        if value is not None and value < 0:
            raise fail(f"{at}.{quota}", "must be >= 0")
    if t.max_ops_per_s is not None and not 0 < t.max_ops_per_s < float("inf"):
        raise fail(f"{at}.max_ops_per_s", "must be a positive number")
    if not 0 < t.max_appending_deletes_per_s < float("inf"):
        raise fail(f"{at}.max_appending_deletes_per_s", "must be a positive number")


def _queues(
    t: TenantSection, at: str, keyring: Keyring, source: str, fail: Fail
) -> tuple[dict[str, str], frozenset[str]]:
    """The tenant's encrypted queues (queue -> key id) and those of them whose headers stay
    clear."""
    queue_keys: dict[str, str] = {}
    clear_header_queues: set[str] = set()
    for queue, raw_queue in t.queues.items():
        q = convert(raw_queue, QueueSection, f"{at}.queues.{queue}", source)
        if not _name_ok(queue):
            raise fail(
                f"{at}.queues.{queue}",
                f"queue names are 1..{_MAX_NAME_BYTES} bytes without '/' or NUL",
            )
        if q.encryption_key is not None:
            if q.encryption_key not in keyring:
                raise fail(
                    f"{at}.queues.{queue}.encryption_key",
                    f"key {q.encryption_key!r} is not in [keys]",
                )
            queue_keys[queue] = q.encryption_key
            if not q.seal_headers:
                clear_header_queues.add(queue)
        elif not q.seal_headers:
            raise fail(
                f"{at}.queues.{queue}.seal_headers",
                "only an encrypted queue (encryption_key) seals headers",
            )
    return queue_keys, frozenset(clear_header_queues)


def _credentials(
    name: str, t: TenantSection, at: str, seen: dict[bytes, str], fail: Fail
) -> list[tuple[bytes, Principal]]:
    """The tenant's tokens as (digest, principal); `seen` (digest -> where) spans every
    tenant, so a token listed twice anywhere is refused."""
    credentials: list[tuple[bytes, Principal]] = []
    for index, tok in enumerate(t.tokens):
        where = f"{at}.tokens[{index}]"
        digest = _token_digest(tok, where, fail)
        if digest in seen:
            raise fail(where, f"this token is already listed at {seen[digest]}")
        seen[digest] = where
        if not tok.subject:
            raise fail(f"{where}.subject", "must not be empty")
        unknown = [g for g in tok.grants if g not in GRANTS]
        if unknown:  # pragma: no cover - the Literal already refuses them
            raise fail(f"{where}.grants", f"unknown grants {unknown}")
        credentials.append((digest, Principal(name, tok.subject, frozenset(tok.grants))))
    return credentials


def _policy(
    name: str, t: TenantSection, queues: tuple[dict[str, str], frozenset[str]]
) -> TenantPolicy:
    queue_keys, clear_header_queues = queues
    return TenantPolicy(
        name=name,
        horizon_ms=t.horizon_ms,
        max_payload_bytes=t.max_payload_bytes,
        max_live_timers=t.max_live_timers,
        max_bytes=t.max_bytes,
        max_ops_per_s=t.max_ops_per_s,
        max_appending_deletes_per_s=t.max_appending_deletes_per_s,
        blocked=t.blocked,
        queue_keys=queue_keys,
        clear_header_queues=clear_header_queues,
    )


def _token_digest(tok: TokenSection, where: str, fail: Fail) -> bytes:
    if (tok.token is None) == (tok.token_sha256 is None):
        raise fail(where, "give exactly one of token_sha256 and token")
    if tok.token is not None:
        if not tok.token:
            raise fail(f"{where}.token", "must not be empty")
        return hashlib.sha256(tok.token.encode()).digest()
    assert tok.token_sha256 is not None
    if _HEX64.fullmatch(tok.token_sha256) is None:
        raise fail(f"{where}.token_sha256", "must be 64 lowercase hex digits (sha256)")
    return bytes.fromhex(tok.token_sha256)
