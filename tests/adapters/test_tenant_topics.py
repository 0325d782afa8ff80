"""A tenant's deliveries are its own: topic names by tenant and queue
(`adapters.tenant_topics`), and the start-time refusal of any configuration that would
deliver two tenants to one topic not declared shared.

The rule, from `specs/destinations.md`: the default tenant keeps plain queue names; another
tenant's local topic is `<tenant>/<queue>`, its broker topic its `tenant/queue` mapping, its
queue's bare mapping, or `<tenant>.<queue>`. The never-rule ("two tenants never reach one
topic outside `shared`") is a hypothesis property over tenant and queue names built from a
tiny alphabet with dots, so that nested names and names that spell another's derived topic
come up all the time; the HTTP test (`test_http_tenant_topics.py`) and the Kafka config tests
(`test_kafka_config.py`) guard it at the edges.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nereus.adapters.compose.config import parse_configuration, pulsar_routing
from nereus.adapters.kafka.destination import KafkaDestination, KafkaDestinationConfig
from nereus.adapters.local.destination import LocalDestination
from nereus.adapters.pulsar.config import PulsarTargetConfig
from nereus.adapters.tenancy import ConfigError
from nereus.adapters.tenant_topics import (
    broker_topic,
    derived_topic,
    legacy_topic,
    local_topic,
    name_ok,
    split_local_topic,
    topic_problem,
)
from nereus.kernel.keys import DEFAULT_TENANT
from nereus.runtime.destination import DLQ_SUFFIX, H_TENANT, Lookup
from nereus.runtime.prepare import PrepareFailure, prepare, prepare_dead_letter
from tests.support.builders import Shard, mid, schedule

PULSAR_PREFIX = "persistent://public/default/"


# Naming tables: the expected names are written out here, from the rule ------------------------


@pytest.mark.parametrize(
    ("tenant", "queue", "topic"),
    [
        (DEFAULT_TENANT, "same", "same"),
        ("acme", "same", "acme/same"),
        ("globex", "same", "globex/same"),
        ("acme.eu", "same.dlq", "acme.eu/same.dlq"),
    ],
)
def test_local_topic_names(tenant: str, queue: str, topic: str) -> None:
    assert local_topic(tenant, queue) == topic
    assert split_local_topic(topic) == (tenant, queue)


TOPICS = {"acme/orders": "orders-acme", "audit": "audit-all", "default/plain": "plain-default"}


@pytest.mark.parametrize(
    ("tenant", "queue", "kafka", "pulsar"),
    [
        (DEFAULT_TENANT, "orders", "orders", PULSAR_PREFIX + "orders"),
        ("acme", "orders", "orders-acme", "orders-acme"),
        ("globex", "orders", "globex.orders", PULSAR_PREFIX + "globex.orders"),
        ("globex", "audit", "audit-all", "audit-all"),
        (DEFAULT_TENANT, "audit", "audit-all", "audit-all"),
        (DEFAULT_TENANT, "plain", "plain-default", "plain-default"),
        ("acme", "plain", "acme.plain", PULSAR_PREFIX + "acme.plain"),
    ],
)
def test_broker_topic_names(tenant: str, queue: str, kafka: str, pulsar: str) -> None:
    assert broker_topic(TOPICS, tenant, queue) == kafka
    assert broker_topic(TOPICS, tenant, queue, PULSAR_PREFIX) == pulsar
    target = PulsarTargetConfig(service_url="pulsar://h:1", topics=TOPICS)
    assert target.topic_for(queue, tenant=tenant) == pulsar


def test_the_name_before_tenants_is_the_queue_mapping_or_the_queue() -> None:
    assert legacy_topic(TOPICS, "audit") == "audit-all"
    assert legacy_topic(TOPICS, "orders") == "orders"  # "acme/orders" is tenant acme's only
    assert legacy_topic(TOPICS, "orders", PULSAR_PREFIX) == PULSAR_PREFIX + "orders"


# The start-time refusal ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("topics", "tenants", "shared", "key", "words"),
    [
        # A bare key is every tenant's queue: two tenants on one topic.
        ({"same": "orders"}, ["acme", "globex"], [], "same", ["acme", "globex", "same", "orders"]),
        (
            {"acme/same": "orders", "globex/same": "orders"},
            ["acme", "globex"],
            [],
            "globex/same",
            ["acme", "globex", "'same'", "orders"],
        ),
        # A mapped topic that is another tenant's derived name.
        ({"acme/x": "globex.y"}, ["acme", "globex"], [], "acme/x", ["acme", "globex", "'y'"]),
        # Derived names that could meet for queues nobody named.
        ({}, ["a", "a.b"], [], None, ["'a'", "'a.b'"]),
        ({}, [DEFAULT_TENANT, "acme"], [], None, [DEFAULT_TENANT, "acme"]),
        ({"nobody/q": "t"}, ["acme"], [], "nobody/q", ["no tenant 'nobody'"]),
        ({"acme/a/b": "t"}, ["acme"], [], "acme/a/b", ["TENANT/QUEUE"]),
    ],
)
def test_a_shared_topic_is_refused_naming_both_tenants_queue_and_topic(
    topics: dict[str, str], tenants: list[str], shared: list[str], key: str | None, words: list[str]
) -> None:
    problem = topic_problem(topics, tenants, shared=shared)
    assert problem is not None and problem.key == key
    for word in words:
        assert word in problem.problem, (word, problem.problem)


@pytest.mark.parametrize(
    ("topics", "tenants", "shared"),
    [
        ({"same": "orders"}, ["acme", "globex"], ["orders"]),  # declared shared
        ({"same": "orders"}, ["acme"], []),  # one tenant
        ({"acme/same": "orders-a", "globex/same": "orders-g"}, ["acme", "globex"], []),
        ({}, ["acme", "globex"], []),  # acme.<q> and globex.<q> never meet
        ({"same": "orders"}, [DEFAULT_TENANT], []),  # `nereus serve` without a config
    ],
)
def test_separate_or_declared_topics_are_accepted(
    topics: dict[str, str], tenants: list[str], shared: list[str]
) -> None:
    assert topic_problem(topics, tenants, shared=shared) is None


NAME = st.text(alphabet="ab.", min_size=1, max_size=3).filter(name_ok)
# Every queue name up to 4 characters of that alphabet: the derived names of all of them.
POOL = ["".join(p) for n in range(1, 5) for p in itertools.product("ab.", repeat=n)]


@st.composite
def configurations(draw: st.DrawFn) -> tuple[list[str], dict[str, str], list[str], str]:
    tenants = draw(st.lists(NAME | st.just(DEFAULT_TENANT), min_size=1, max_size=3, unique=True))
    owners = st.sampled_from([None, *tenants])
    keys = st.tuples(owners, NAME).map(lambda tq: tq[1] if tq[0] is None else f"{tq[0]}/{tq[1]}")
    prefix = draw(st.sampled_from(["", PULSAR_PREFIX]))
    # Biased to the names that matter: other tenants' derived topics.
    derived = [derived_topic(t, q, prefix) for t in tenants for q in ("a", "b.a")]
    targets = NAME.map(lambda n: prefix + n) | st.sampled_from(["t1", "t2", *derived])
    topics = draw(st.dictionaries(keys, targets, max_size=4))
    shared = draw(st.lists(st.sampled_from(sorted(set(topics.values())) or ["t1"]), max_size=2))
    return tenants, topics, shared, prefix


@settings(max_examples=600, deadline=None)
@given(configurations())
def test_an_accepted_configuration_never_delivers_two_tenants_to_one_undeclared_topic(
    config: tuple[list[str], dict[str, str], list[str], str],
) -> None:
    tenants, topics, shared, prefix = config
    if topic_problem(topics, tenants, shared=shared, prefix=prefix) is not None:
        return
    reached: dict[str, set[str]] = {}
    for tenant in tenants:
        for queue in POOL:
            if name_ok(queue):
                topic = broker_topic(topics, tenant, queue, prefix)
                reached.setdefault(topic, set()).add(tenant)
    for topic, who in reached.items():
        assert len(who) == 1 or topic in shared, (topic, who, topics, shared)


@settings(max_examples=300, deadline=None)
@given(NAME | st.just(DEFAULT_TENANT), NAME, NAME | st.just(DEFAULT_TENANT), NAME)
def test_local_topics_of_two_tenants_queues_never_meet(t1: str, q1: str, t2: str, q2: str) -> None:
    if (t1, q1) != (t2, q2):
        assert local_topic(t1, q1) != local_topic(t2, q2)
        assert local_topic(t1, q1) + DLQ_SUFFIX != local_topic(t2, q2) + DLQ_SUFFIX


# The Pulsar section, checked when the file is loaded (no broker) -----------------------------

TWO_TENANTS = {
    "tenants": {
        name: {"tokens": [{"subject": "s", "grants": ["produce"], "token": f"tok-{name}"}]}
        for name in ("acme", "globex")
    }
}


def _pulsar(targets: dict[str, object], queues: dict[str, str]) -> dict[str, object]:
    return {**TWO_TENANTS, "pulsar": {"targets": targets, "queues": queues}}


def test_a_pulsar_topic_two_tenants_reach_is_refused_at_load_unless_shared() -> None:
    topic = "persistent://acme/t/same"
    target = {"service_url": "pulsar://h:1", "topics": {"same": topic}}
    with pytest.raises(ConfigError) as info:
        parse_configuration(_pulsar({"p": target}, {"same": "p"}), "nereus.toml")
    assert info.value.key == "pulsar.targets.p.topics.same"
    for word in ("acme", "globex", "'same'", topic, "shared_topics"):
        assert word in info.value.problem
    declared = {**target, "shared_topics": [topic]}
    assert parse_configuration(_pulsar({"p": declared}, {"same": "p"}), "nereus.toml")
    # One tenant's queue routed there, the other's left on the local destination.
    only_acme = parse_configuration(_pulsar({"p": target}, {"acme/same": "p"}), "nereus.toml")
    routing = pulsar_routing(only_acme, None)
    assert routing is not None
    assert routing.target_of("same", "acme") == "p"
    assert routing.target_of("same", "globex") == "local"
    with pytest.raises(ConfigError) as unknown:
        parse_configuration(_pulsar({"p": target}, {"nobody/same": "p"}), "nereus.toml")
    assert unknown.value.key == "pulsar.queues.nobody/same"


def test_pulsar_targets_name_each_tenants_topic() -> None:
    target = {
        "service_url": "pulsar://h:1",
        "topics": {"acme/same": "persistent://acme/t/same", "globex/same": "persistent://g/t/same"},
    }
    tenancy = parse_configuration(_pulsar({"p": target}, {"same": "p"}), "nereus.toml")
    routing = pulsar_routing(tenancy, None)
    assert routing is not None
    p = routing.targets["p"]
    assert p.topic_for("same", tenant="acme") == "persistent://acme/t/same"
    assert p.topic_for("same", tenant="globex") == "persistent://g/t/same"
    assert p.topic_for("other", tenant="globex") == PULSAR_PREFIX + "globex.other"


# Every record carries its tenant ------------------------------------------------------------


@pytest.mark.parametrize("tenant", [DEFAULT_TENANT, "acme", "globex"])
def test_a_prepared_record_and_its_dead_letter_copy_name_their_tenant_and_its_topic(
    tenant: str, tmp_path: Path
) -> None:
    shard = Shard()
    payload = b"payload"
    shard.apply(schedule("k", tenant=tenant, queue="same", size=len(payload)))
    message = shard.state.message(mid("k", tenant, "same").encode())
    assert message is not None
    destination = LocalDestination(str(tmp_path / "destination"))
    try:
        prepared = prepare(message, payload, destination, "owner")
        assert not isinstance(prepared, PrepareFailure)
        copy = prepare_dead_letter(
            message, payload, destination, attempts_spent=3, failures=3, last_error="x"
        )
    finally:
        destination.close()
    expected_topic = "same" if tenant == DEFAULT_TENANT else f"{tenant}/same"
    assert prepared.topic == expected_topic
    assert copy.topic == expected_topic + ".dlq"
    for record in (prepared, copy):
        assert [v for k, v in record.headers if k == H_TENANT] == [tenant.encode()]


# The upgrade: an attempt sent before topics were named by tenant ------------------------------


class _Asked:
    """Stands in for the evidence reader to see which topics a search is asked to read (the
    real read is `test_kafka_tenants.py`'s, on the broker)."""

    def __init__(self) -> None:
        self.lookups: list[Lookup] = []

    def search(self, lookups: list[Lookup], wake: object) -> None:
        self.lookups = list(lookups)


def test_a_kafka_search_for_a_tenants_topic_also_reads_the_queues_old_topic() -> None:
    dest = KafkaDestination(
        KafkaDestinationConfig(
            bootstrap="127.0.0.1:1", delivery="idempotent", topics={"mapped": "m-all"}
        )
    )
    try:
        asked = _Asked()
        dest._reader = asked  # type: ignore[assignment]
        topics = {
            (tenant, queue): dest.topic_for(queue, tenant=tenant)
            for tenant in ("acme", DEFAULT_TENANT)
            for queue in ("q", "mapped")
        }
        assert topics == {
            ("acme", "q"): "acme.q",
            ("acme", "mapped"): "m-all",
            (DEFAULT_TENANT, "q"): "q",
            (DEFAULT_TENANT, "mapped"): "m-all",
        }
        wanted = [Lookup("a1", "acme.q", 5), Lookup("a2", "acme.q.dlq", 6)]
        wanted += [Lookup("a3", "m-all", 7), Lookup("a4", "q", 8)]
        dest.search(wanted, lambda: None)
        assert sorted((lk.attempt_id, lk.topic) for lk in asked.lookups) == [
            ("a1", "acme.q"),
            ("a1", "q"),  # where acme's q went before the upgrade
            ("a2", "acme.q.dlq"),
            ("a2", "q.dlq"),
            ("a3", "m-all"),  # a bare mapping did not move: one topic
            ("a4", "q"),
        ]
    finally:
        dest._reader = None
        dest.close()
