"""The service configuration (`nereus serve --config FILE`, TOML) and the tenancy it implies.

    tenancy = load_tenancy("nereus.toml")          # or Tenancy.open_default()
    tenancy.check_kernel(kernel_config)           # ConfigError if it would widen the kernel

Theory of operation: the file is parsed with `tomllib` and converted into frozen msgspec
structs that refuse unknown keys; every other rule (a tenant horizon above the cell's, a
payload ceiling above 1 MiB, a queue naming an unknown key, a key that is not 32 bytes, a
token listed twice, two tenants mapped to one destination topic not declared shared
(`[kafka_destination]`, `[pulsar]`: `adapters.tenant_topics`), ...) is checked here too,
so a bad file stops the service at start with a `ConfigError` naming the file and the key,
never a traceback. The result is a `Tenancy`: per tenant its derived limits (horizon,
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
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import msgspec

from nereus.adapters.crypto import Keyring
from nereus.adapters.http.contract import GRANTS, MAX_PAYLOAD_CEILING_BYTES, Grant, HttpLimits
from nereus.adapters.pulsar.config import PulsarRouting, parse_section, routing_for_url
from nereus.adapters.tenant_topics import KafkaTopicsSection, topic_problem
from nereus.kernel.config import KernelConfig
from nereus.kernel.keys import DEFAULT_TENANT

_T = TypeVar("_T")
_HEX64 = re.compile(r"[0-9a-f]{64}")
# Names that become identity parts: the kernel's rules (non-empty, no NUL, no '/').
_MAX_NAME_BYTES = 150
# How many DELETEs a credential may append per second (per process) when none is set: a
# bound on what a credential without grants can add to the log, far above what a client
# cancelling its own finished timers by mistake needs, and never applied to a pending
# timer's cancel.
DEFAULT_APPENDING_DELETES_PER_S = 50.0
# A burst of connects larger than the backlog is refused or retried by the kernel for
# seconds; a burst of a thousand must be queued.
_MIN_BACKLOG = 1024


class ConfigError(Exception):
    """A configuration the service refuses to start with; the message names file and key."""

    def __init__(self, source: str, key: str | None, problem: str) -> None:
        where = f"{source}: {key}: " if key else f"{source}: "
        super().__init__(where + problem)
        self.source = source
        self.key = key
        self.problem = problem


# The file's schema ------------------------------------------------------------------------


class _Strict(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    pass


class ServerSection(HttpLimits, frozen=True, forbid_unknown_fields=True):
    """`[server]`: where to listen, the HTTP limits (`HttpLimits`), the access log and the
    operator block."""

    host: str = "127.0.0.1"
    port: int = 6632
    access_log: bool = True
    blocked: bool = False


class CellSection(_Strict, frozen=True):
    # None: the kernel's own horizon / min(1 MiB, the kernel's payload ceiling).
    horizon_ms: int | None = None
    max_payload_bytes: int | None = None


class TokenSection(_Strict, frozen=True):
    subject: str
    grants: list[Grant]
    token_sha256: str | None = None
    token: str | None = None


class QueueSection(_Strict, frozen=True):
    encryption_key: str | None = None
    # With a key, the headers are sealed inside the payload's envelope unless this says no.
    seal_headers: bool = True


class TenantSection(_Strict, frozen=True):
    horizon_ms: int | None = None
    max_live_timers: int | None = None
    max_bytes: int | None = None
    max_payload_bytes: int | None = None
    max_ops_per_s: float | None = None
    # Per credential and process: DELETEs that append (specs/http.md, "Rate limit").
    max_appending_deletes_per_s: float = DEFAULT_APPENDING_DELETES_PER_S
    blocked: bool = False
    tokens: list[TokenSection] = []
    # Tables keyed by name are converted one by one (msgspec names a dict key only as
    # `[...]`, and an error must name the key): raw here, `QueueSection` each.
    queues: dict[str, object] = {}


class ConfigFile(_Strict, frozen=True):
    server: ServerSection = ServerSection()
    cell: CellSection = CellSection()
    keys: dict[str, object] = {}
    kafka: dict[str, object] = {}  # librdkafka settings, see `kafka_settings`
    tenants: dict[str, object] = {}  # `TenantSection` each
    # The destinations of queues (`adapters.pulsar.config`): checked by `pulsar_routing`.
    pulsar: dict[str, object] = {}
    kafka_destination: KafkaTopicsSection = KafkaTopicsSection()


KafkaValue = str | int | float | bool

# librdkafka settings that Nereus sets for each client it makes, from its own rules (and
# the brokers from the command line): a value from the file would be overridden or would
# break what Nereus relies on (idempotence, read_committed, fencing ids, its timeouts).
RESERVED_KAFKA_SETTINGS: dict[str, str] = {
    "bootstrap.servers": "give the brokers with --kafka (and --destination-bootstrap)",
    "group.id": "the owners' group is --group",
    "session.timeout.ms": "use --session-timeout-ms",
    "linger.ms": "use --destination-linger-ms",
    **{
        name: ""
        for name in (
            "client.id",
            "group.instance.id",
            "transactional.id",
            "enable.idempotence",
            "acks",
            "batch.size",
            "partitioner",
            "message.max.bytes",
            "message.timeout.ms",
            "transaction.timeout.ms",
            "topic.metadata.propagation.max.ms",
            "enable.auto.commit",
            "enable.auto.offset.store",
            "isolation.level",
            "enable.partition.eof",
            "auto.offset.reset",
            "fetch.wait.max.ms",
            "partition.assignment.strategy",
            "heartbeat.interval.ms",
            "max.poll.interval.ms",
        )
    },
}


# What the service runs with ---------------------------------------------------------------


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

    def pulsar_routing(self, service_url: str | None) -> PulsarRouting | None:
        """Which queues go to which Pulsar target (`[pulsar]`, `--pulsar URL`), or None when
        every queue stays on the local destination. `--topic` mappings and the check of
        `--pulsar URL`'s routing: `adapters.cli.destinations`."""
        if self.pulsar:
            return parse_section(
                self.pulsar,
                lambda key, problem: ConfigError(self.source, key, problem),
                lambda value, typ, at: _convert(value, typ, at, self.source),
                service_url=service_url,
                tenants=self.tenants,
            )
        if service_url is not None:
            return routing_for_url(service_url, {})
        return None

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


def _explain(exc: msgspec.ValidationError) -> tuple[str | None, str]:
    """msgspec's "Object contains unknown field `x` - at `$.a.b`" as (key "a.b.x", problem)."""
    text = str(exc)
    problem, sep, at = text.partition(" - at `")
    key = at.rstrip("`").removeprefix("$").lstrip(".") if sep else ""
    key = re.sub(r"\[(\d+)\]", r"[\1]", key)
    unknown = re.fullmatch(r"Object contains unknown field `(.+)`", problem)
    if unknown:
        name = unknown.group(1)
        return (f"{key}.{name}" if key else name), "unknown key"
    missing = re.fullmatch(r"Object missing required field `(.+)`", problem)
    if missing:
        name = missing.group(1)
        return (f"{key}.{name}" if key else name), "required key is missing"
    return (key or None), problem[:1].lower() + problem[1:]


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
    return _build(_convert(doc, ConfigFile, "", source), source, env)


def _secret_name(value: object) -> str | None:
    """NAME if `value` is the table `{ env = "NAME" }`."""
    if isinstance(value, dict) and set(value) == {"env"} and isinstance(value["env"], str):
        return value["env"]
    return None


def _resolve(value: object, key: str, source: str, env: Mapping[str, str]) -> object:
    name = _secret_name(value)
    if name is None:
        return value
    if not name:
        raise ConfigError(source, key, "env must name an environment variable")
    found = env.get(name)
    if found is None:
        raise ConfigError(source, key, f"the environment variable {name} is not set")
    if not found:
        raise ConfigError(source, key, f"the environment variable {name} is empty")
    return found


def kafka_settings(
    table: Mapping[str, object], source: str, env: Mapping[str, str], prefix: str = ""
) -> dict[str, KafkaValue]:
    """`[kafka]` as flat librdkafka settings ("sasl.mechanism": "PLAIN"), secrets read."""
    settings: dict[str, KafkaValue] = {}
    for name, raw in table.items():
        setting = f"{prefix}.{name}" if prefix else name
        key = f"kafka.{setting}"
        if isinstance(raw, dict) and _secret_name(raw) is None:
            settings.update(kafka_settings(raw, source, env, setting))
            continue
        value = _resolve(raw, key, source, env)
        if setting in RESERVED_KAFKA_SETTINGS:
            hint = RESERVED_KAFKA_SETTINGS[setting]
            raise ConfigError(
                source,
                key,
                "Nereus sets this itself for each client it makes" + (f"; {hint}" if hint else ""),
            )
        if setting.endswith("_cb") or setting == "logger":
            raise ConfigError(source, key, "a callback cannot be configured from a file")
        if not isinstance(value, str | int | float | bool):
            raise ConfigError(
                source, key, f"must be a string, number or boolean, not {type(value).__name__}"
            )
        settings[setting] = value
    return settings


def _convert(value: object, typ: type[_T], at: str, source: str) -> _T:
    try:
        return msgspec.convert(value, typ)
    except msgspec.ValidationError as exc:
        key, problem = _explain(exc)
        if key and at:
            key = at + key if key.startswith("[") else f"{at}.{key}"
        raise ConfigError(source, key or at or None, problem) from None


def _name_ok(name: str) -> bool:
    if not name or "\x00" in name or "/" in name:
        return False
    return len(name.encode()) <= _MAX_NAME_BYTES


def _build(cfg: ConfigFile, source: str, env: Mapping[str, str]) -> Tenancy:
    def fail(key: str, problem: str) -> ConfigError:
        return ConfigError(source, key, problem)

    server, cell = cfg.server, cfg.cell
    if not 0 <= server.port <= 65535:
        raise fail("server.port", f"{server.port} is not a TCP port")
    for name in HttpLimits.__struct_fields__:
        if getattr(server, name) <= 0:
            raise fail(f"server.{name}", "must be positive")
    if server.backlog < _MIN_BACKLOG:
        raise fail("server.backlog", f"must be at least {_MIN_BACKLOG}")
    if not server.host:
        raise fail("server.host", "must not be empty")
    if cell.horizon_ms is not None and cell.horizon_ms < 0:
        raise fail("cell.horizon_ms", "must be >= 0")
    if cell.max_payload_bytes is not None and not (
        0 <= cell.max_payload_bytes <= MAX_PAYLOAD_CEILING_BYTES
    ):
        raise fail("cell.max_payload_bytes", f"must be in [0, {MAX_PAYLOAD_CEILING_BYTES}] (1 MiB)")
    keys: dict[str, str] = {}
    for key_id, raw_key in cfg.keys.items():
        encoded = _resolve(raw_key, f"keys.{key_id}", source, env)
        if not isinstance(encoded, str):
            raise fail(f"keys.{key_id}", 'must be a base64 string or { env = "NAME" }')
        try:
            Keyring({key_id: encoded})
        except ValueError as exc:
            raise fail(f"keys.{key_id}", str(exc)) from None
        keys[key_id] = encoded
    keyring = Keyring(keys)
    settings = kafka_settings(cfg.kafka, source, env)
    if not cfg.tenants:
        raise fail("tenants", "no tenant is configured: nobody could authenticate")

    tenants: dict[str, TenantPolicy] = {}
    credentials: list[tuple[bytes, Principal]] = []
    seen: dict[bytes, str] = {}
    for name, raw_tenant in cfg.tenants.items():
        at = f"tenants.{name}"
        t = _convert(raw_tenant, TenantSection, at, source)
        if not _name_ok(name):
            raise fail(at, f"tenant names are 1..{_MAX_NAME_BYTES} bytes without '/' or NUL")
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
        queue_keys: dict[str, str] = {}
        clear_header_queues: set[str] = set()
        for queue, raw_queue in t.queues.items():
            q = _convert(raw_queue, QueueSection, f"{at}.queues.{queue}", source)
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
        tenants[name] = TenantPolicy(
            name=name,
            horizon_ms=t.horizon_ms,
            max_payload_bytes=t.max_payload_bytes,
            max_live_timers=t.max_live_timers,
            max_bytes=t.max_bytes,
            max_ops_per_s=t.max_ops_per_s,
            max_appending_deletes_per_s=t.max_appending_deletes_per_s,
            blocked=t.blocked,
            queue_keys=queue_keys,
            clear_header_queues=frozenset(clear_header_queues),
        )
    tenancy = Tenancy(
        source=source,
        server=server,
        cell=cell,
        tenants=tenants,
        credentials=credentials,
        keyring=keyring,
        kafka_settings=settings,
        pulsar=cfg.pulsar,
        kafka_destination=cfg.kafka_destination,
    )
    # The mappings themselves; Kafka mode checks the names it derives too
    # (`adapters.cli.destinations.kafka_topics`).
    section = cfg.kafka_destination
    clash = topic_problem(section.topics, tenants, shared=section.shared_topics, open_ended=False)
    if clash is not None:
        key = "kafka_destination.topics" + (f".{clash.key}" if clash.key else "")
        raise fail(key, clash.problem)
    if cfg.pulsar:
        tenancy.pulsar_routing(None if _has_urls(cfg.pulsar) else "pulsar://unset")
    return tenancy


def _has_urls(section: dict[str, object]) -> bool:
    """Whether every target names its service URL (else `--pulsar URL` must)."""
    targets = section.get("targets")
    return isinstance(targets, dict) and all(
        isinstance(t, dict) and "service_url" in t for t in targets.values()
    )


def _token_digest(tok: TokenSection, where: str, fail: Callable[[str, str], ConfigError]) -> bytes:
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
