"""Where a tenant's queue is delivered: topic names by tenant and queue, and the start-time
check that two tenants never share a topic unless it is declared shared.

    local_topic("acme", "orders")                        # "acme/orders"
    local_topic(DEFAULT_TENANT, "orders")                # "orders"
    topics = {"acme/orders": "orders-acme", "audit": "audit"}
    broker_topic(topics, "acme", "orders")               # "orders-acme" (that tenant's queue)
    broker_topic(topics, "globex", "audit")              # "audit" (every tenant's `audit`)
    broker_topic(topics, "globex", "orders")             # "globex.orders" (derived)
    broker_topic(topics, DEFAULT_TENANT, "orders")       # "orders" (derived, plain)

Theory of operation: a timer's identity is (tenant, queue, key), and its deliveries go to a
topic chosen by (tenant, queue). The default tenant (the library, `nereus serve` without a
config) keeps the plain queue name everywhere, so a single-tenant deployment names its
topics as it always did. Another tenant's topic is named by both:

* the local destination: `<tenant>/<queue>`. Tenant and queue names never hold '/', so this
  is one topic per (tenant, queue) by construction, and never a default tenant's name.
* a broker (Kafka, a Pulsar target), whose topic names cannot hold '/': first a mapping for
  that tenant's queue (key `tenant/queue`), then one for the queue (a bare key: every
  tenant's queue of that name, as before tenants were part of the name), else the derived
  `<prefix><tenant>.<queue>`. Names may contain '.', so derived names of two tenants meet
  when one tenant's name is another's plus a dot ("a" and "a.b": `a.b.c` is either's), and
  the default tenant's plain names meet every other tenant's (its queue `acme.x` is tenant
  acme's `x`); a mapped topic may also be some other tenant's derived name.

`topic_problem` finds all of these for a set of configured tenants before anything starts:
every tenant's named queues (those in a mapping's key, or routed by name) are resolved, each
mapped topic is matched against every tenant's derived names, and a topic two tenants would
reach is refused unless it is in `shared`. Where queues are open-ended (any queue may reach
the destination by its derived name), tenants whose derived names can meet are refused too:
no mapping can cover queues nobody named. The answer is a `TopicProblem` naming the key;
the callers turn it into their configuration error (file or flag, and key).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import msgspec

from nereus.kernel.keys import DEFAULT_TENANT

# What separates tenant and queue in a local topic: no tenant or queue name holds it.
LOCAL_SEPARATOR = "/"
# What separates them in a derived broker topic ('/' is not a legal Kafka or Pulsar name).
BROKER_SEPARATOR = "."
# The kernel's identity rule for each part (`kernel.validation`): a longer name is refused.
MAX_NAME_BYTES = 150


def name_ok(name: str) -> bool:
    """A valid tenant or queue name: 1..150 bytes, without '/' or NUL."""
    if not name or "\x00" in name or LOCAL_SEPARATOR in name:
        return False
    return len(name.encode()) <= MAX_NAME_BYTES


def local_topic(tenant: str, queue: str) -> str:
    """The local destination's topic of a tenant's queue."""
    if tenant == DEFAULT_TENANT:
        return queue
    return f"{tenant}{LOCAL_SEPARATOR}{queue}"


def split_local_topic(topic: str) -> tuple[str, str]:
    """(tenant, queue) of a local topic: the inverse of `local_topic`."""
    tenant, sep, queue = topic.partition(LOCAL_SEPARATOR)
    return (tenant, queue) if sep else (DEFAULT_TENANT, topic)


def split_key(key: str) -> tuple[str | None, str]:
    """A mapping key: `tenant/queue` -> (tenant, queue); a bare `queue` -> (None, queue)."""
    tenant, sep, queue = key.partition(LOCAL_SEPARATOR)
    return (tenant, queue) if sep else (None, key)


def mapped_topic(topics: Mapping[str, str], tenant: str, queue: str) -> tuple[str, str] | None:
    """(key, topic) of the mapping that applies to the tenant's queue, if one does."""
    for key in (f"{tenant}{LOCAL_SEPARATOR}{queue}", queue):
        topic = topics.get(key)
        if topic:
            return key, topic
    return None


def derived_topic(tenant: str, queue: str, prefix: str = "") -> str:
    if tenant == DEFAULT_TENANT:
        return prefix + queue
    return f"{prefix}{tenant}{BROKER_SEPARATOR}{queue}"


def broker_topic(topics: Mapping[str, str], tenant: str, queue: str, prefix: str = "") -> str:
    """A broker's topic for the tenant's queue: its mapping, else the derived name."""
    found = mapped_topic(topics, tenant, queue)
    return found[1] if found is not None else derived_topic(tenant, queue, prefix)


def legacy_topic(topics: Mapping[str, str], queue: str, prefix: str = "") -> str:
    """The topic any tenant's queue was given before topics were named by tenant: the
    queue's bare mapping, or the queue's own name. An attempt admitted before the upgrade
    was sent there."""
    return topics.get(queue) or prefix + queue


class KafkaTopicsSection(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`[kafka_destination]` of the service configuration: Kafka mode's destination topics
    (`--topic [TENANT/]QUEUE=TOPIC` adds to them and wins), and the topics declared shared:
    more than one tenant may be delivered to them, each record naming its tenant."""

    topics: dict[str, str] = {}
    shared_topics: list[str] = []


@dataclass(frozen=True)
class TopicProblem:
    """Why a set of mappings is refused: `key` is the mapping key at fault (None: the set
    of tenants itself)."""

    key: str | None
    problem: str


def _everywhere(tenant: str, queue: str) -> bool:
    return True


@dataclass(frozen=True)
class _Use:
    queue: str
    key: str | None  # the mapping that sends it there; None: its derived name


def topic_problem(
    topics: Mapping[str, str],
    tenants: Collection[str],
    *,
    shared: Collection[str] = (),
    prefix: str = "",
    routes: Callable[[str, str], bool] = _everywhere,
    named: Collection[str] = (),
    open_ended: bool = True,
) -> TopicProblem | None:
    """The first reason `topics` (keys `queue` or `tenant/queue`) would deliver two of
    `tenants` to one topic outside `shared`, or None. `routes(tenant, queue)` says whether
    that queue reaches this destination at all; `named` adds queues named elsewhere (a
    routing table); `open_ended` says any other queue may reach it by its derived name."""
    for key in topics:
        problem = _key_problem(key, tenants)
        if problem is not None:
            return problem
    if open_ended:
        problem = _derived_names_meet(tenants)
        if problem is not None:
            return problem
    uses: dict[str, dict[str, _Use]] = {}
    for queue in sorted({split_key(k)[1] for k in topics} | set(named)):
        for tenant in sorted(tenants):
            if not routes(tenant, queue):
                continue
            found = mapped_topic(topics, tenant, queue)
            topic = derived_topic(tenant, queue, prefix) if found is None else found[1]
            uses.setdefault(topic, {})[tenant] = _Use(queue, None if found is None else found[0])
    for topic, users in uses.items():
        # A mapped topic may also be the derived name of a queue nobody named.
        for tenant, queue in _derived_users(topic, tenants, prefix):
            unmapped = mapped_topic(topics, tenant, queue) is None
            if tenant not in users and unmapped and routes(tenant, queue):
                users[tenant] = _Use(queue, None)
    for topic in sorted(uses):
        users = uses[topic]
        if len(users) > 1 and topic not in shared:
            return _shared_problem(topic, users)
    return None


def _key_problem(key: str, tenants: Collection[str]) -> TopicProblem | None:
    tenant, queue = split_key(key)
    if not name_ok(queue) or (tenant is not None and not name_ok(tenant)):
        return TopicProblem(
            key,
            f"a key is QUEUE or TENANT/QUEUE, each 1..{MAX_NAME_BYTES} bytes without '/' or NUL",
        )
    if tenant is not None and tenant not in tenants:
        return TopicProblem(key, f"no tenant {tenant!r} is configured")
    return None


def _derived_names_meet(tenants: Collection[str]) -> TopicProblem | None:
    ordered = sorted(tenants)
    if DEFAULT_TENANT in tenants and len(ordered) > 1:
        other = next(t for t in ordered if t != DEFAULT_TENANT)
        return TopicProblem(
            None,
            f"tenants {DEFAULT_TENANT!r} and {other!r}: the default tenant's topics keep their "
            f"queues' plain names, so its queue '{other}{BROKER_SEPARATOR}<queue>' would be "
            f"delivered to tenant {other!r}'s topic of <queue>; give tenant "
            f"{DEFAULT_TENANT!r} another name",
        )
    for a in ordered:
        for b in ordered:
            if b.startswith(a + BROKER_SEPARATOR):
                rest = b[len(a) + 1 :]
                return TopicProblem(
                    None,
                    f"tenants {a!r} and {b!r}: tenant {a!r}'s queue "
                    f"'{rest}{BROKER_SEPARATOR}<queue>' and tenant {b!r}'s <queue> would share "
                    f"the topic '{b}{BROKER_SEPARATOR}<queue>'; rename one of them",
                )
    return None


def _derived_users(topic: str, tenants: Collection[str], prefix: str) -> list[tuple[str, str]]:
    """Every (tenant, queue) whose derived name is `topic`."""
    if not topic.startswith(prefix):
        return []
    name = topic[len(prefix) :]
    users: list[tuple[str, str]] = []
    for tenant in sorted(tenants):
        if tenant == DEFAULT_TENANT:
            queue = name
        elif name.startswith(tenant + BROKER_SEPARATOR):
            queue = name[len(tenant) + 1 :]
        else:
            continue
        if name_ok(queue):
            users.append((tenant, queue))
    return users


def _shared_problem(topic: str, users: Mapping[str, _Use]) -> TopicProblem:
    (a, use_a), (b, use_b) = sorted(users.items())[:2]
    key = use_b.key if use_b.key is not None else use_a.key

    def how(use: _Use) -> str:
        return f"key {use.key!r}" if use.key is not None else "its derived name"

    return TopicProblem(
        key,
        f"tenants {a!r} (queue {use_a.queue!r}, {how(use_a)}) and {b!r} (queue "
        f"{use_b.queue!r}, {how(use_b)}) would both be delivered to topic {topic!r}: give "
        f"each tenant's queue its own topic (a 'tenant/queue' key), or declare {topic!r} "
        "shared (shared_topics)",
    )


def parse_topic_specs(specs: Collection[str]) -> dict[str, str]:
    """`--topic [TENANT/]QUEUE=TOPIC` flags as a mapping; ValueError names a bad one."""
    topics: dict[str, str] = {}
    for spec in specs:
        key, sep, topic = spec.partition("=")
        if not sep or not key or not topic:
            raise ValueError(f"--topic wants [TENANT/]QUEUE=TOPIC, not {spec!r}")
        topics[key] = topic
    return topics
