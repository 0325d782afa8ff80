"""A Pulsar target's configuration, and the `[pulsar]` section of the service's config file.

    [pulsar.targets.main]
    service_url = "pulsar://127.0.0.1:6650"      # or from `nereus serve --pulsar URL`
    admin_url = "http://127.0.0.1:8080"          # read the broker's settings (a handoff needs it)
    delivery = "handoff"                         # "managed" (default) or "handoff"
    handoff_lead_ms = 2000
    clock_ahead_bound_ms = 50                    # certified; without it: never a handoff
    topics = { reminders = "persistent://acme/timers/reminders" }   # every tenant's reminders
    shared_topics = []                           # topics two tenants may both be delivered to
    auth = { kind = "token", token_env = "PULSAR_TOKEN" }

    [pulsar.queues]
    reminders = "main"                           # queue -> target; others: the local destination
    "acme/billing" = "main"                      # one tenant's queue

Theory of operation: parsed with msgspec into frozen structs that refuse unknown keys, and
checked here (a handoff without a certified bound or an admin URL, a negative lead, a queue
naming an unknown target, two tenants' queues on one topic not declared shared
(`adapters.tenant_topics`), ...), so a bad file stops the service at start with a
`ConfigError` naming the key. Keys of `topics` and `[pulsar.queues]` are a queue (every
tenant's) or `tenant/queue`; a queue without a topic publishes to
`persistent://<tenant>/<namespace>/<nereus tenant>.<queue>` (the plain queue for the default
tenant). Secrets are never in the file: `token_env` and `password_env`
name environment variables, read when the client is made (a missing one is refused then, by
name). No Pulsar client is imported here.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from typing import Literal

import msgspec

from nereus.adapters.tenant_topics import broker_topic, name_ok, split_key, topic_problem
from nereus.kernel.keys import DEFAULT_TENANT

Delivery = Literal["managed", "handoff"]


class PulsarAuth(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`token`: a JWT from the environment variable `token_env`. `basic`: `username` and the
    password from `password_env`. `tls`: a client certificate and key (paths)."""

    kind: Literal["token", "basic", "tls"]
    token_env: str | None = None
    username: str | None = None
    password_env: str | None = None
    cert_path: str | None = None
    key_path: str | None = None


class PulsarTargetConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    service_url: str
    name: str = "pulsar"
    # The admin (HTTP) API, read for the broker's delayed-delivery and size settings. A
    # handoff is never offered without it.
    admin_url: str | None = None
    # Queues not in `topics` publish to persistent://tenant/namespace/<Nereus tenant>.<queue>
    # (the default tenant's to .../<queue>). Keys: "queue" (every tenant's) or "tenant/queue".
    tenant: str = "public"
    namespace: str = "default"
    topics: dict[str, str] = msgspec.field(default_factory=dict)
    # Topics more than one tenant may be delivered to (each record names its tenant);
    # any other that two tenants' queues would reach refuses the configuration.
    shared_topics: list[str] = msgspec.field(default_factory=list)
    delivery: Delivery = "managed"
    handoff_lead_ms: int = 0
    # The certified bound on how far the target's clock may run ahead of true time. None:
    # uncertified, so this target never gets a handoff whatever `delivery` says.
    clock_ahead_bound_ms: int | None = None
    # Margin between the largest delay a handoff asks (lead + push-out) and the broker's
    # maximum delivery delay: the broker measures the delay with the producer's clock.
    max_delay_slack_ms: int = 1_000
    # How often the broker's settings are read again (in the background).
    settings_ttl_s: float = 30.0
    # How long the client keeps trying a record; after it the report is Timeout (UNKNOWN).
    send_timeout_ms: int = 30_000
    operation_timeout_s: float = 10.0
    connection_timeout_ms: int = 5_000
    batching: bool = True
    batching_max_publish_delay_ms: int = 1
    max_pending_messages: int = 10_000
    # Producers are named `<prefix>.<store id>.<n>` (stable across restarts, so broker-side
    # deduplication recognises the client's resends); None: "nereus".
    producer_name_prefix: str | None = None
    auth: PulsarAuth | None = None
    tls_trust_certs_path: str | None = None
    tls_allow_insecure: bool = False
    # The largest record, when the admin API cannot say (Pulsar's default maxMessageSize).
    default_max_message_bytes: int = 5 * 1024 * 1024
    # Evidence searches: a record is looked for from its admission time less this slack (the
    # producer's publish timestamps), reading at most this many records for this long.
    find_slack_ms: int = 30_000
    find_max_records: int = 10_000_000
    find_max_seconds: float = 60.0
    close_timeout_s: float = 10.0

    @property
    def topic_prefix(self) -> str:
        return f"persistent://{self.tenant}/{self.namespace}/"

    def topic_for(self, queue: str, *, tenant: str = DEFAULT_TENANT) -> str:
        return broker_topic(self.topics, tenant, queue, self.topic_prefix)


class PulsarSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    # Raw tables, converted one by one so an error names its key (as tenancy does).
    targets: dict[str, object] = {}
    queues: dict[str, str] = {}
    # Where queues not in `queues` go: "local" (the embedded destination) or a target name.
    default: str = "local"


class PulsarRouting(msgspec.Struct, frozen=True):
    """What the `[pulsar]` section (and `--pulsar`) say: the targets, and which queue goes
    where (`queues`; the rest to `default`, a target name or "local")."""

    targets: dict[str, PulsarTargetConfig]
    queues: dict[str, str]
    default: str = "local"

    def target_of(self, queue: str, tenant: str = DEFAULT_TENANT) -> str:
        """Where a tenant's queue goes: its `tenant/queue` route, its `queue` route, else
        the default."""
        return self.queues.get(f"{tenant}/{queue}") or self.queues.get(queue) or self.default


Fail = Callable[[str, str], Exception]


def check_target(t: PulsarTargetConfig, at: str, fail: Fail) -> None:
    if not t.service_url.startswith(("pulsar://", "pulsar+ssl://")):
        raise fail(f"{at}.service_url", "must be a pulsar:// or pulsar+ssl:// URL")
    if t.admin_url is not None and not t.admin_url.startswith(("http://", "https://")):
        raise fail(f"{at}.admin_url", "must be an http:// or https:// URL")
    for key in ("handoff_lead_ms", "max_delay_slack_ms", "send_timeout_ms", "find_slack_ms"):
        if getattr(t, key) < 0:
            raise fail(f"{at}.{key}", "must be >= 0")
    if t.clock_ahead_bound_ms is not None and t.clock_ahead_bound_ms < 0:
        raise fail(f"{at}.clock_ahead_bound_ms", "must be >= 0")
    if t.delivery == "handoff":
        if t.clock_ahead_bound_ms is None:
            raise fail(
                f"{at}.clock_ahead_bound_ms",
                "a handoff needs the target's certified clock-ahead bound",
            )
        if t.admin_url is None:
            raise fail(f"{at}.admin_url", "a handoff needs the admin API to check the broker")
    elif t.handoff_lead_ms:
        raise fail(f"{at}.handoff_lead_ms", 'only for delivery = "handoff"')
    if t.auth is not None:
        _check_auth(t.auth, f"{at}.auth", fail)


def _check_auth(a: PulsarAuth, at: str, fail: Fail) -> None:
    needed = {"token": ("token_env",), "basic": ("username", "password_env"), "tls": ()}
    for key in needed[a.kind]:
        if not getattr(a, key):
            raise fail(f"{at}.{key}", f"required for kind = {a.kind!r}")
    if a.kind == "tls" and not (a.cert_path and a.key_path):
        raise fail(at, "kind = 'tls' needs cert_path and key_path")


def secret(env: str, at: str, fail: Fail) -> str:
    """The value of the environment variable a config names for a secret."""
    value = os.environ.get(env)
    if not value:
        raise fail(at, f"the environment variable {env} is not set")
    return value


def parse_section(
    raw: dict[str, object],
    fail: Fail,
    convert: Callable[[object, type[msgspec.Struct], str], msgspec.Struct],
    *,
    service_url: str | None = None,
    tenants: Collection[str] = (DEFAULT_TENANT,),
) -> PulsarRouting:
    """The `[pulsar]` section; `service_url` (from `--pulsar`) fills targets that give none.
    Refused when two of `tenants` would share a topic not declared shared."""
    section = convert(raw, PulsarSection, "pulsar")
    assert isinstance(section, PulsarSection)
    targets: dict[str, PulsarTargetConfig] = {}
    for name, table in section.targets.items():
        at = f"pulsar.targets.{name}"
        if not isinstance(table, dict):
            raise fail(at, "must be a table")
        fields = {**table, "name": name}
        if "service_url" not in fields and service_url is not None:
            fields["service_url"] = service_url
        target = convert(fields, PulsarTargetConfig, at)
        assert isinstance(target, PulsarTargetConfig)
        check_target(target, at, fail)
        targets[name] = target
    for queue, target_name in section.queues.items():
        if target_name not in targets:
            raise fail(f"pulsar.queues.{queue}", f"no target {target_name!r} in [pulsar.targets]")
    if section.default != "local" and section.default not in targets:
        raise fail("pulsar.default", f"no target {section.default!r} in [pulsar.targets]")
    routing = PulsarRouting(targets, dict(section.queues), section.default)
    check_tenant_topics(routing, tenants, fail)
    return routing


def check_tenant_topics(routing: PulsarRouting, tenants: Collection[str], fail: Fail) -> None:
    """Refuse routes or topics that would deliver two tenants to one topic of a target that
    does not declare it shared (`adapters.tenant_topics.topic_problem`), naming the key."""
    for key in routing.queues:
        tenant, queue = split_key(key)
        if not name_ok(queue) or (tenant is not None and not name_ok(tenant)):
            raise fail(f"pulsar.queues.{key}", "a key is QUEUE or TENANT/QUEUE")
        if tenant is not None and tenant not in tenants:
            raise fail(f"pulsar.queues.{key}", f"no tenant {tenant!r} is configured")
    routed = [split_key(key)[1] for key in routing.queues]
    for name, target in routing.targets.items():

        def here(tenant: str, queue: str, name: str = name) -> bool:
            return routing.target_of(queue, tenant) == name

        problem = topic_problem(
            target.topics,
            tenants,
            shared=target.shared_topics,
            prefix=target.topic_prefix,
            routes=here,
            named=routed,
            open_ended=routing.default == name,
        )
        if problem is not None:
            key = f"pulsar.targets.{name}.topics.{problem.key}" if problem.key else "tenants"
            raise fail(key, problem.problem)


def routing_for_url(service_url: str, topics: dict[str, str]) -> PulsarRouting:
    """`nereus serve --pulsar URL` without a `[pulsar]` section: every queue to one target
    with ordinary managed delivery."""
    target = PulsarTargetConfig(service_url=service_url, topics=dict(topics))
    return PulsarRouting({target.name: target}, {}, default=target.name)
