"""The service configuration file's schema (`nereus serve --config FILE`, TOML), and its
refusals' shape.

Theory of operation: the file is parsed with `tomllib` and converted (`convert`) into the
frozen msgspec structs below, which refuse unknown keys; msgspec's own message is rewritten
as a `ConfigError` naming the file and the dotted key, never a traceback. Secrets may be
given as `{ env = "NAME" }` (`resolve`), read from the environment when the file is loaded.
`[kafka]` is flattened into librdkafka settings (`kafka_settings`), refusing the ones Nereus
sets per client itself. The rules between values (a tenant's horizon within the cell's, a
token listed twice, ...) are `adapters.tenancy`'s; the sections of one edge (`[pulsar]`)
are checked where the service is composed (`adapters.compose.config`). Nothing here imports
an edge: the HTTP server's limits (`HttpLimits`, the `[server]` keys) are defined here and
the HTTP edge reads them from here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final, TypeVar

import msgspec

from nereus.adapters.tenant_topics import KafkaTopicsSection
from nereus.service.access import Grant

_T = TypeVar("_T")
# Request bodies larger than this are refused unread unless the config says otherwise.
DEFAULT_MAX_BODY_BYTES: Final = 16 * 1024 * 1024
# How many DELETEs a credential may append per second (per process) when none is set: a
# bound on what a credential without grants can add to the log, far above what a client
# cancelling its own finished timers by mistake needs, and never applied to a pending
# timer's cancel.
DEFAULT_APPENDING_DELETES_PER_S = 50.0


class ConfigError(Exception):
    """A configuration the service refuses to start with; the message names file and key."""

    def __init__(self, source: str, key: str | None, problem: str) -> None:
        where = f"{source}: {key}: " if key else f"{source}: "
        super().__init__(where + problem)
        self.source = source
        self.key = key
        self.problem = problem


class HttpLimits(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What one process's HTTP server holds at most and waits at most: every connection and
    request has a bound, so hostile or slow clients cost a bounded amount (`[server]` keys
    of the config file; the defaults are the service's)."""

    # Pending connections the kernel queues before accept (also capped by somaxconn).
    backlog: int = 2048
    # Open connections; past this a new connection's request is answered 503 server_busy.
    max_connections: int = 1024
    # Requests being handled at once (waiting for their commit included); past this 503.
    max_inflight: int = 512
    # An idle keep-alive connection (no byte of a next request) is closed after this.
    keep_alive_timeout_s: float = 5.0
    # The request line and headers must be complete this long after their first byte.
    header_timeout_s: float = 10.0
    # The declared body must be complete this long after the headers.
    body_timeout_s: float = 30.0
    max_request_line_bytes: int = 8192
    # The header block (every header line, without the request line).
    max_header_bytes: int = 16384
    max_headers: int = 100
    # Larger declared bodies are refused before a byte of them is read.
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # Input read ahead of the request being answered (pipelined requests): reading pauses
    # while this much is held, so a client that does not wait for its answers costs at
    # most this (raised to one largest head if the head limits are larger).
    max_read_ahead_bytes: int = 65536


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
    # The destinations of queues (`adapters.pulsar.config`): checked where the service is
    # composed (`adapters.compose.config`).
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


def secret_name(value: object) -> str | None:
    """NAME if `value` is the table `{ env = "NAME" }`."""
    if isinstance(value, dict) and set(value) == {"env"} and isinstance(value["env"], str):
        return value["env"]
    return None


def resolve(value: object, key: str, source: str, env: Mapping[str, str]) -> object:
    name = secret_name(value)
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
        if isinstance(raw, dict) and secret_name(raw) is None:
            settings.update(kafka_settings(raw, source, env, setting))
            continue
        value = resolve(raw, key, source, env)
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


def convert(value: object, typ: type[_T], at: str, source: str) -> _T:
    try:
        return msgspec.convert(value, typ)
    except msgspec.ValidationError as exc:
        key, problem = _explain(exc)
        if key and at:
            key = at + key if key.startswith("[") else f"{at}.{key}"
        raise ConfigError(source, key or at or None, problem) from None
