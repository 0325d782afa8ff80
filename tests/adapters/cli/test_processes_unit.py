"""The parts of `serve --processes` that need no broker: each process's command line, the
merge of listing parts, the sibling registry, the private read port's token, and a scrape
merged over the siblings that answer."""

from __future__ import annotations

import http.client
from pathlib import Path

import msgspec
import pytest

from nereus.adapters.cli.main import main
from nereus.adapters.compose.processes import child_argv
from nereus.adapters.kafka.siblings import (
    TOKEN_HEADER,
    Part,
    PeekAnswer,
    SiblingDirectory,
    SiblingReader,
    Siblings,
    merge_parts,
)
from nereus.kernel.model import Message, Table
from nereus.runtime.metrics import Metrics
from nereus.service.errors import ShardNotLocal
from nereus.service.results import Peek
from tests.support.builders import schedule
from tests.support.strategies import drive


def _messages(keys: list[str]) -> list[Message]:
    d = drive([])
    for k in keys:
        d.append(schedule(k, delay_ms=1_000))
    rows = [m for _, m in d.state.items(Table.MESSAGES) if isinstance(m, Message)]
    return sorted(rows, key=lambda m: m.timer_key)


def test_each_process_gets_the_command_line_without_the_supervisors_own_options() -> None:
    argv = [
        "serve", "--kafka", "b:9092", "--processes", "3", "--data", "/d", "--http=0.0.0.0:80",
        "--topic", "q=t", "--processes=3",
    ]  # fmt: skip
    assert child_argv(argv, "/d/process-1", 7, "/d/siblings", "process-1", lifeline_fd=8) == [
        "serve", "--kafka", "b:9092", "--topic", "q=t",
        "--data", "/d/process-1", "--http-fd", "7", "--sibling-dir", "/d/siblings",
        "--process-name", "process-1", "--supervisor-fd", "8",
    ]  # fmt: skip


def test_processes_need_kafka_mode(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--data", str(tmp_path), "--processes", "2"]) == 2
    assert "--processes needs Kafka mode" in capsys.readouterr().err


def test_parts_merge_in_key_order_and_every_shard_must_be_read() -> None:
    rows = _messages(["a", "b", "c", "d"])
    one = Part([0, 2], [rows[0], rows[2]], False)
    two = Part([1], [rows[1], rows[3]], True)
    merged, more = merge_parts([two, one], shards=3, limit=3)
    assert [m.timer_key for m in merged] == ["a", "b", "c"] and more
    merged, more = merge_parts([one, two], shards=3, limit=10)
    assert [m.timer_key for m in merged] == ["a", "b", "c", "d"] and more
    with pytest.raises(ShardNotLocal, match=r"shards \[1\]"):
        merge_parts([one], shards=3, limit=3)
    # A shard in two parts (moving while the listing ran): refused, not merged twice.
    with pytest.raises(ShardNotLocal, match="moving"):
        merge_parts([one, Part([2, 1], [rows[1]], False)], shards=3, limit=3)
    # A part wholly read by another part already is skipped.
    merged, _ = merge_parts([one, two, Part([0], [rows[0]], False)], shards=3, limit=10)
    assert [m.timer_key for m in merged] == ["a", "b", "c", "d"]


def _get(address: str, path: str, token: str | None = None) -> tuple[int, bytes]:
    """GET `path` from a sibling's private port, with the token header if given."""
    host, port = address.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        conn.request("GET", path, headers={TOKEN_HEADER: token} if token else {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_the_private_read_port_answers_only_with_the_token(tmp_path: Path) -> None:
    found = Peek(found=True, queue="q", timer_key="k")

    def peek(tenant: str, queue: str, key: str) -> Peek:
        if key == "elsewhere":
            raise ShardNotLocal("not here")
        return found

    def part(tenant: str, queue: str, after: str | None, limit: int) -> Part:
        return Part([0], [], False)

    reader = SiblingReader("secret", peek, part, lambda: "")
    reader.start()
    try:
        assert _get(reader.address, "/peek?tenant=t&queue=q&key=k")[0] == 403
        status, body = _get(reader.address, "/peek?tenant=t&queue=q&key=k", "secret")
        assert status == 200 and msgspec.msgpack.decode(body, type=PeekAnswer).peek == found

        registry = SiblingDirectory(str(tmp_path), "process-0")
        registry.register("127.0.0.1:1")  # itself: never asked
        SiblingDirectory(str(tmp_path), "process-1").register(reader.address)
        siblings = Siblings(registry, "secret")
        assert siblings.peek("t", "q", "k") == found
        with pytest.raises(ShardNotLocal):
            siblings.peek("t", "q", "elsewhere")
        assert siblings.parts("t", "q", None, 5) == [Part([0], [], False)]
        assert Siblings(registry, "wrong").parts("t", "q", None, 5) == []
        registry.unregister()
        assert SiblingDirectory(str(tmp_path), "process-1").others() == []
    finally:
        reader.stop()


def _registry(fired: float) -> Metrics:
    m = Metrics()
    m.describe("nereus_outcomes_total", "counter", "Publish outcomes recorded, by class.")
    m.describe("process_open_fds", "gauge", "Open file descriptors.")
    m.inc("nereus_outcomes_total", fired, {"class": "PUBLISHED", "shard": "0"})
    m.set("process_open_fds", fired)
    return m


def test_a_scrape_sums_the_siblings_that_answer_and_counts_the_others(tmp_path: Path) -> None:
    own, theirs = _registry(3), _registry(4)

    def no_peek(tenant: str, queue: str, key: str) -> Peek:
        raise ShardNotLocal("not here")

    def no_part(tenant: str, queue: str, after: str | None, limit: int) -> Part:
        return Part([], [], False)

    reader = SiblingReader("secret", no_peek, no_part, theirs.render)
    reader.start()
    try:
        assert _get(reader.address, "/metrics")[0] == 403
        registry = SiblingDirectory(str(tmp_path), "process-0")
        SiblingDirectory(str(tmp_path), "process-1").register(reader.address)
        # Registered, then gone without unregistering (killed): nothing listens there.
        SiblingDirectory(str(tmp_path), "process-2").register("127.0.0.1:1")
        lines = Siblings(registry, "secret").metrics(own.render()).splitlines()
    finally:
        reader.stop()
    assert 'nereus_outcomes_total{class="PUBLISHED",shard="0"} 7' in lines
    assert 'process_open_fds{process="process-0"} 3' in lines
    assert 'process_open_fds{process="process-1"} 4' in lines
    assert "nereus_metrics_processes 2" in lines
    assert "nereus_metrics_siblings_missing 1" in lines
    assert not any("process-2" in line for line in lines)
