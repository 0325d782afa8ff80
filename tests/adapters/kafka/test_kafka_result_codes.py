"""The Kafka RPC answers with the codes and words of the library and the HTTP API.

A client-only `KafkaNereus` sends each bad command of `tests/service/test_result_codes.py` through
the commands topic to a shard owned by another instance (with a data directory) and reads
the answer from the replies topic: the code and the message must be the ones written in
that table for the embedded library (and over HTTP). A verdict comes back in the same
shape, `raise_for_status()` raises the same exception, and a peek of an owned shard gives
the payload's bytes. Needs the shared Kafka broker (`NEREUS_KAFKA_BOOTSTRAP`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from nereus import NereusRefused
from nereus.adapters.clock import SystemClock
from nereus.adapters.kafka.library import KafkaNereus
from nereus.adapters.kafka.wire import decode_reply
from nereus.kernel.codes import Code
from nereus.kernel.effects import EntryOutcome
from tests.service.test_result_codes import REFUSED_WHOLE, Refusal
from tests.support import kafka_env
from tests.support.kafka_cluster import Topics, wait_until
from tests.support.kafka_env import create_topic, unique_topic

kafka_bootstrap = kafka_env.kafka_bootstrap
SHARDS = 2


def _connect(bootstrap: str, topics: Topics, data_dir: Path | None) -> KafkaNereus:
    return KafkaNereus.connect(
        bootstrap,
        data_dir=str(data_dir) if data_dir is not None else None,
        clock=SystemClock(assumed_error_ms=2),
        commands_topic=topics.commands,
        replies_topic=topics.replies,
        group=topics.group,
        shards=SHARDS,
        destination_topics={"q": topics.destination},
    )


@pytest.fixture(scope="module")
def pair(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[KafkaNereus, KafkaNereus]]:
    """(owner, client): the owner holds every shard; the client's commands travel the RPC."""
    destination = create_topic(
        kafka_bootstrap,
        unique_topic("dest"),
        partitions=1,
        config={"message.timestamp.type": "LogAppendTime"},
    )
    topics = Topics.unique(destination)
    with _connect(kafka_bootstrap, topics, tmp_path_factory.mktemp("owner")) as owner:
        wait_until(
            lambda: list(owner.service.shard_states().values()) == ["active"] * SHARDS,
            60,
            "the owner holds every shard",
        )
        with _connect(kafka_bootstrap, topics, None) as client:
            yield owner, client


@pytest.mark.parametrize("case", REFUSED_WHOLE, ids=[c[0] for c in REFUSED_WHOLE])
def test_a_bad_command_over_the_rpc_gets_the_librarys_code_and_text(
    pair: tuple[KafkaNereus, KafkaNereus], case: Refusal
) -> None:
    _owner, client = pair
    _name, call, _op, _http_status, code, library_text, _http_text = case
    result = call(client)
    assert (result.ok, result.status, result.code) == (False, "rejected", code)
    assert result.message == library_text


def test_verdicts_and_the_exception_over_the_rpc(pair: tuple[KafkaNereus, KafkaNereus]) -> None:
    owner, client = pair
    gone = client.cancel("q", "never")
    assert (gone.ok, gone.status, gone.code, gone.message) == (
        False,
        "absent",
        "absent",
        "no timer is pending under this key (never scheduled, or no longer pending)",
    )
    assert client.schedule("q", "t", b"a", delay_ms=600_000, txn="T1").ok
    again = client.schedule("q", "t", b"b", delay_ms=600_000, txn="T1")
    assert (again.status, again.code, again.message) == (
        "rejected",
        "txn_reused",
        "txn 'T1' is the current generation's: a change needs a new txn",
    )
    with pytest.raises(NereusRefused) as refused:
        client.schedule("q", "far", b"x", delay_ms=90 * 24 * 3600 * 1000 + 1).raise_for_status()
    assert refused.value.code == "horizon_exceeded"
    assert refused.value.message == "delay_ms 7776000001 is beyond the horizon of 7776000000 ms"
    data = b"\x00\xffkafka"
    assert client.schedule("q", "peek", data, delay_ms=600_000).raise_for_status().ok
    # The owner's store may commit its batch a moment after the reply left.
    wait_until(lambda: owner.peek("q", "peek").found, 30, "the owner's store has the timer")
    peek = owner.peek("q", "peek")
    assert isinstance(peek.payload, bytes) and peek.payload == data


def test_a_reply_of_an_earlier_build_keeps_its_meaning() -> None:
    # A process of an earlier build answers the horizon refusal by its old name during a
    # rolling upgrade; the reply decodes to the code it meant.
    outcome = EntryOutcome(7, "SCHEDULE_V1", False, Code.HORIZON_EXCEEDED)
    fields: dict[str, Any] = msgspec.to_builtins(outcome)
    fields["code"] = "deliver_beyond_horizon"
    reply = decode_reply(msgspec.msgpack.encode({"request_id": "r1", "outcome": fields}))
    assert reply.answers()[0].code is Code.HORIZON_EXCEEDED
    assert str(reply.answers()[0].code) == "horizon_exceeded"
    assert Code["DELIVER_BEYOND_HORIZON"] is Code.HORIZON_EXCEEDED  # the deprecated alias
