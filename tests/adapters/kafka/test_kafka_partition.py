"""A network partition in Kafka mode: an owner cut off from the broker keeps no send going past
its send lease while another process takes its shards over (issue 30).

The broker is one of the module's own with two client listeners: one reached directly, one
advertised at the port of a TCP proxy the test controls (`tests.support.tcp_proxy`), so a client
that
bootstraps through the proxy keeps talking through it. Process A runs `nereus serve --kafka`
through the proxy: its group membership and its shard logs (reader and transactional writer)
are behind it. Process B is direct. They share 4 shards; NEREUS_PARTITION_TIMERS timers
(default 2,000) on A's shards come due evenly over 4 s, and once A has published 30 % of them
the proxy cuts A off, mid-fire. B takes A's shards once the group drops A (its session
timeout, always longer than A's lease). Cases:

* **idempotent, destination direct, black hole**: A's destination producer reaches the broker
  by the direct listener, so A, cut off from its log, could still send (the dangerous case);
  the proxy stops forwarding without closing anything, as a partition does. The proxy heals
  as soon as B owns every shard: A learns it was replaced only when it hears the broker
  again (a zombie waking);
* **transactional, destination direct, black hole**, healed only once A has let go of its
  shards by itself while still cut off (its log transaction cannot commit, its group session
  runs out); B's destination producer fences A's when it takes a shard;
* **transactional, destination behind the proxy too, reset**: the proxy closes every
  connection with a reset and refuses new ones (a firewall that rejects), healed as soon as
  B owns every shard.

An auditor then re-reads Kafka (`tests.support.kafka_cluster.audit`: the commands topic folded by
the
kernel, the destination topic read_committed) and checks:

* 0 lost: every timer DELIVERED in the log, with a destination record;
* 0 early: no destination record's LogAppendTime (the broker's clock, which also stamps the
  deliverAt of each schedule) is before the deliverAt in its headers;
* duplicates only of a generation with an attempt recorded UNKNOWN (and with the
  transactional capability neither duplicates nor UNKNOWN at all);
* the lease: A's sends start only within `send_lease_ms` of the start of its last committed
  log transaction, which began before the cut, so no record of an attempt A admitted may be
  stamped later than the cut + the lease + `LANDING_ALLOWANCE_MS` (a send's trip from
  `submit` into the broker's log, on loopback);
* A ends without its shards: each is logged lost (by the group or the fenced log) and closed,
  A's tenures from before the cut write nothing into a shard log after B's first record in it,
  and none of them publishes after the heal.

Each case prints its figures: timers, how long after the cut B's first record landed in each
of A's shards, A's records stamped after the cut and after the lease, duplicates, UNKNOWNs,
early, lost.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from nereus.adapters.kafka.config import KafkaServiceConfig
from nereus.kernel.keys import message_id
from nereus.runtime.destination import H_DELIVER_AT
from tests.support.kafka_cluster import (
    TENANT,
    Audit,
    DestRecord,
    ServiceProc,
    Topics,
    all_delivered,
    audit,
    check_delivery,
    check_stores_are_prefixes,
    keys_on_shards,
    metric_sum,
    recovery_figures,
    schedule_op,
    wait_until,
    writes_after_takeover,
)
from tests.support.kafka_env import create_topic, unique_topic
from tests.support.own_broker import Broker, new_broker, running
from tests.support.tcp_proxy import TcpProxy

SHARDS = 4
DEST_PARTITIONS = 2
TIMERS = int(os.environ.get("NEREUS_PARTITION_TIMERS", "2000"))
FIRST_DUE_MS = 1_500
SPREAD_MS = 4_000
# The owner's lease and the group's session timeout, as `nereus serve --kafka` runs them.
_DEFAULTS = KafkaServiceConfig(bootstrap="-", data_dir="-")
LEASE_MS = _DEFAULTS.send_lease_ms
SESSION_TIMEOUT_MS = _DEFAULTS.session_timeout_ms
# From a send's `submit` to its record in the broker's log: one produce round trip on
# loopback (linger 5 ms; a transaction's records are appended when produced, before the
# commit), with room for a loaded machine's scheduling delays.
LANDING_ALLOWANCE_MS = 500
# How long A, cut off, may take to let go of its shards by itself. Seen: 10 s (a commit that
# timed out) to 30 s (send_offsets_to_transaction, given 10 s, returned only when its request
# timed out after 30 s), and an abort may take its 10 s after either; with room.
A_LETS_GO_S = 90


@dataclass(frozen=True)
class Case:
    delivery: Literal["idempotent", "transactional"]
    destination: Literal["direct", "proxied"]
    cut: Literal["blackhole", "reset"]
    # "takeover": heal as soon as B owns every shard; "a_let_go": only once A, still cut
    # off, has let go of every shard it had.
    heal: Literal["takeover", "a_let_go"] = "takeover"

    @property
    def name(self) -> str:
        return f"{self.delivery}, destination {self.destination}, {self.cut}"


CASES = [
    Case("idempotent", "direct", "blackhole"),
    Case("transactional", "direct", "blackhole", heal="a_let_go"),
    Case("transactional", "proxied", "reset"),
]


@pytest.fixture(scope="module")
def cut_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Broker, TcpProxy]]:
    with TcpProxy() as proxy:
        broker = new_broker(tmp_path_factory.mktemp("partition") / "broker", proxy_port=proxy.port)
        assert broker.proxied_port is not None
        proxy.start(("127.0.0.1", broker.proxied_port))
        with running(broker):
            yield broker, proxy


def _processes(
    broker: Broker, proxy: TcpProxy, case: Case, tmp_path: Path
) -> tuple[Topics, ServiceProc, ServiceProc]:
    dest = create_topic(
        broker.bootstrap,
        unique_topic("dest"),
        partitions=DEST_PARTITIONS,
        config={"message.timestamp.type": "LogAppendTime"},
    )
    topics = Topics.unique(dest)
    delivery: tuple[str, ...] = ("--delivery", case.delivery)
    a_extra = delivery
    if case.destination == "direct":
        a_extra += ("--destination-bootstrap", broker.bootstrap)
    a = ServiceProc("a", proxy.address, topics, tmp_path / "a", shards=SHARDS, extra=a_extra)
    b = ServiceProc("b", broker.bootstrap, topics, tmp_path / "b", shards=SHARDS, extra=delivery)
    return topics, a, b


def _start(a: ServiceProc, b: ServiceProc) -> None:
    """A first, so that it owns every shard, then B, which takes some of them."""
    a.start().wait_serving()
    wait_until(lambda: a.active_shards() == set(range(SHARDS)), 90, "a owns every shard")
    b.start().wait_serving()
    wait_until(
        lambda: (
            bool(b.active_shards()) and a.active_shards() | b.active_shards() == set(range(SHARDS))
        ),
        90,
        "the shards spread over both processes",
    )


def _stop(*procs: ServiceProc) -> None:
    """Stop every process that was started, even when one of them does not stop in time
    (`ServiceProc.stop` kills that one and fails: the first such failure is raised last)."""
    failures: list[AssertionError] = []
    for proc in procs:
        if proc.proc is None:
            continue
        try:
            proc.stop()
        except AssertionError as exc:
            failures.append(exc)
    if failures:
        raise failures[0]


def _schedule(proc: ServiceProc, keys: list[str]) -> None:
    """The timers fall due evenly over SPREAD_MS from FIRST_DUE_MS after the first request:
    each delay is counted from its own request, so slow requests leave no gap in the fire
    (a cut in a gap would catch nothing in flight)."""
    batch = 250
    first_ms = time.time() * 1000 + FIRST_DUE_MS
    for start in range(0, len(keys), batch):
        now_ms = time.time() * 1000
        ops = [
            schedule_op(k, max(0, int(first_ms + SPREAD_MS * (start + i) / len(keys) - now_ms)))
            for i, k in enumerate(keys[start : start + batch])
        ]
        results = proc.schedule(ops)
        assert all(r["status"] == "scheduled" for r in results), results


@dataclass
class Cut:
    at_ms: int  # wall clock just after the proxy stopped forwarding
    a_tenures: set[str]  # A's shard tenures opened before the cut
    a_shards: set[int]
    healed_ms: int = 0
    b_owns_all_s: float = 0.0
    let_go_s: float = 0.0  # from the cut until A had let go of the last of its shards


def _cut_mid_fire(proxy: TcpProxy, case: Case, a: ServiceProc, b: ServiceProc) -> Cut:
    """Cut A off once it has published 30 % of the timers; heal once B owns every shard and
    A's lease has certainly run out (and, if the case says so, A has let go of its shards)."""
    published = {"class": "PUBLISHED"}
    wait_until(
        lambda: metric_sum(a, "nereus_outcomes_total", **published) >= TIMERS * 3 // 10,
        120,
        "30 % of the timers published by a",
    )
    a_shards = a.active_shards()
    a_tenures = set(a.tenures())
    proxy.cut(case.cut)
    cut = Cut(int(time.time() * 1000), a_tenures, a_shards)
    began = time.monotonic()
    wait_until(lambda: b.active_shards() == set(range(SHARDS)), 120, "b owns every shard")
    cut.b_owns_all_s = time.monotonic() - began
    if case.heal == "a_let_go":
        # Still cut off, A must find out by itself that it can no longer prove ownership:
        # its log transaction fails and its group session runs out.
        wait_until(
            lambda: _let_go_at(a, a_shards) is not None,
            A_LETS_GO_S,
            "a lets its shards go while it is cut off",
        )
    time.sleep(max(0.0, (cut.at_ms + LEASE_MS) / 1000 - time.time()))
    proxy.heal()
    cut.healed_ms = int(time.time() * 1000)
    return cut


def _let_go_at(a: ServiceProc, shards: set[int]) -> float | None:
    """When (Unix s, A's own log) A had logged every shard it owned at the cut lost (by the
    group, or by its fenced or failing log) and closed it; None if it has not yet."""
    lost: set[int] = set()
    closed: dict[int, float] = {}
    for e in a.events():
        event = e.get("event")
        if event == "shards_lost":
            lost.update(int(p) for p in e.get("removed", []))
        elif event == "shard_lost" and "shard" in e:
            lost.add(int(e["shard"]))
        elif event == "shard_closed" and e.get("reason") in ("lost", "revoked"):
            closed.setdefault(int(e["shard"]), float(e["ts"]))
    if not shards <= lost or not shards <= set(closed):
        return None
    return max(closed[p] for p in shards)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_an_owner_cut_off_from_the_broker_sends_nothing_past_its_lease(
    cut_broker: tuple[Broker, TcpProxy], tmp_path: Path, case: Case
) -> None:
    broker, proxy = cut_broker
    assert LEASE_MS < SESSION_TIMEOUT_MS, "the lease must run out before the group moves a shard"
    topics, a, b = _processes(broker, proxy, case, tmp_path)
    try:
        _start(a, b)
        keys = keys_on_shards("p", TIMERS, SHARDS, a.active_shards())
        _schedule(b, keys)
        cut = _cut_mid_fire(proxy, case, a, b)
        wait_until(all_delivered([a, b], keys), 180, "every timer DELIVERED")
        wait_until(lambda: _let_go_at(a, cut.a_shards) is not None, 60, "a lets its shards go")
        cut.let_go_s = (_let_go_at(a, cut.a_shards) or 0.0) - cut.at_ms / 1000
        time.sleep(1.0)  # anything a tenure of A still did after letting go would show now
    finally:
        proxy.heal()
        _stop(a, b)
    result = audit(broker.bootstrap, topics, SHARDS, DEST_PARTITIONS)
    where = f"partition ({case.name})"
    counts = check_delivery(result, keys, where=where)
    check_stores_are_prefixes(result, [a.data, b.data], where=where)
    b_tenures = set(b.tenures())
    late = writes_after_takeover(result, cut.a_shards, cut.a_tenures, b_tenures)
    assert not late, f"{where}: a tenure of A wrote after B took its shard: {late[:3]}"
    after_cut, after_lease = _sends_of_a(result, cut, where)
    figures = recovery_figures(result, cut.a_tenures, cut.at_ms)
    assert figures.in_flight > 0, f"{where}: the cut caught no attempt of A in flight"
    unknown = len(result.unknown_generations)
    if case.delivery == "transactional":
        assert not counts.get("duplicates") and unknown == 0, (where, counts, unknown)
    # The delivery checks above, counted for the report (each must be 0 to get here).
    margins_ms = [r.timestamp_ms - int(r.headers[H_DELIVER_AT]) for r in result.records]
    early = sum(1 for m in margins_ms if m < 0)
    lost = sum(1 for k in keys if not result.by_message.get(message_id(TENANT, "reminders", k)))
    last_ms = max((r.timestamp_ms - cut.at_ms for r in after_cut), default=None)
    print(
        f"{where}: {TIMERS} timers; B's first record in A's shards "
        f"{_takeover_ms(result, cut, b_tenures)} ms after the cut (B owned every shard "
        f"{cut.b_owns_all_s:.1f} s after it, healed {(cut.healed_ms - cut.at_ms) / 1000:.1f} s "
        f"after it, A let go of its shards {cut.let_go_s:.1f} s after it); A's records after "
        f"the cut {len(after_cut)} (last {last_ms} ms after it), after the lease ({LEASE_MS} "
        f"ms) {len(after_lease)}; {figures.in_flight} of A's attempts settled by B "
        f"({figures.found} found, {figures.absent} proven absent, {figures.unknown} UNKNOWN); "
        f"{counts.get('records', 0)} records, {counts.get('duplicates', 0)} duplicates, "
        f"{unknown} generations with an UNKNOWN attempt; {early} early (the earliest "
        f"{min(margins_ms)} ms after its deliverAt), {lost} lost"
    )


def _sends_of_a(result: Audit, cut: Cut, where: str) -> tuple[list[DestRecord], list[DestRecord]]:
    """The destination records of attempts A's tenures from before the cut admitted, stamped
    after the cut and after its lease ran out; none may be later than the lease allows."""
    lease_end_ms = cut.at_ms + LEASE_MS
    by_a = [r for r in result.records if result.admitted_by.get(r.attempt_id) in cut.a_tenures]
    after_cut = [r for r in by_a if r.timestamp_ms >= cut.at_ms]
    after_lease = [r for r in by_a if r.timestamp_ms > lease_end_ms]
    assert not [r for r in by_a if r.timestamp_ms > lease_end_ms + LANDING_ALLOWANCE_MS], (
        f"{where}: A published past its lease: "
        f"{[(r.attempt_id, r.timestamp_ms - cut.at_ms) for r in after_lease[:5]]}"
    )
    assert not [r for r in by_a if r.timestamp_ms >= cut.healed_ms], f"{where}: after the heal"
    return after_cut, after_lease


def _takeover_ms(result: Audit, cut: Cut, b_tenures: set[str]) -> list[int]:
    """For each of A's shards, from the cut to the first record B wrote there."""
    return [
        min(
            x.entry.persisted_at_ms
            for x in result.logs[p]
            if x.envelope.request_id.partition(":")[0] in b_tenures
        )
        - cut.at_ms
        for p in sorted(cut.a_shards)
    ]
