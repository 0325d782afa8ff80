"""Every delivered record names its timer: the `nereus-timer-key` header and `LocalRecord
.timer_key` (issue 32, item 3).

The rule (`specs/destinations.md`, "The timer key"): every record Nereus delivers, timer
records and dead-letter copies alike, carries the timer's key in `nereus-timer-key`. A key
whose characters are all printable, and that does not start with `b64:`, is the value
itself; any other key is `b64:` and the standard base64 of its UTF-8 bytes. So the value is
printable text on every destination, and decoding it gives back exactly the key the kernel
accepted. The expected header values below are written from that rule.

Here: the codec (table and hypothesis property over every key the kernel accepts), the
descriptors `runtime.prepare` builds, the library's local records (odd keys, the longest
key), `nereus tail` over an HTTP service, and a local record written before records carried
the key. The dead-letter copy's key is checked on real runs in `test_dead_letters.py`, Kafka
in `test_kafka_tenants.py` and `test_kafka_dead_letters.py`, Pulsar in `test_pulsar_http.py`.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from nereus.adapters.cli.main import main as nereus_cli
from nereus.adapters.local.destination import LocalDestination
from nereus.adapters.local.embedded import Nereus
from nereus.kernel.config import KernelConfig
from nereus.kernel.model import Message
from nereus.kernel.validation import check_identity
from nereus.runtime.destination import H_TIMER_KEY, PreparedPublish
from nereus.runtime.prepare import prepare, prepare_dead_letter
from nereus.runtime.timer_key_header import decode_timer_key, encode_timer_key
from nereus.storage.codec import encode_value
from tests.support.builders import Shard, schedule
from tests.support.http_harness import schedule as http_schedule
from tests.support.http_harness import start_service
from tests.support.old_records import RecordBeforeKeys

KERNEL = KernelConfig()
QUEUE = "q"

# (key, the header value the rule gives it)
ODD_KEYS = [
    ("order-42", "order-42"),
    ("zamówienie/7 ✓ 🎉", "zamówienie/7 ✓ 🎉"),  # printable, not ASCII: itself
    (" spaced ", " spaced "),  # the ASCII space is printable
    ("line\nbreak", "b64:bGluZQpicmVhaw=="),
    ("\t\x1b[31mred", "b64:CRtbMzFtcmVk"),  # control characters
    ("\u200bzero-width", "b64:4oCLemVyby13aWR0aA=="),  # a format character
    ("b64:looks-encoded", "b64:YjY0Omxvb2tzLWVuY29kZWQ="),  # the marker is always encoded
    ("ł" * 75, "ł" * 75),  # the longest key: 150 bytes, printable
    ("\u2028" * 50, "b64:" + "4oCo" * 50),  # the longest key: 150 bytes, a separator
]

# Keys the kernel accepts: 1 to 150 UTF-8 bytes, no NUL. Biased to what needs encoding
# (control and format characters, separators, the marker) and to the length bound.
_ANY_CHAR = st.characters(codec="utf-8", exclude_characters="\x00")
_ODD_CHAR = st.sampled_from(["\n", "\r", "\t", "\x7f", "\x1b", "\u00a0", "\u2028", "\u200b"])
KEYS = st.one_of(
    st.text(_ANY_CHAR, min_size=1, max_size=150),
    st.text(st.one_of(_ANY_CHAR, _ODD_CHAR), min_size=1, max_size=40),
    st.text(_ANY_CHAR, max_size=40).map(lambda s: "b64:" + s),
    st.tuples(st.sampled_from(["a", "ł", "✓", "🎉", "\x01"]), st.integers(1, 150)).map(
        lambda cn: cn[0] * (150 // len(cn[0].encode()))
    ),
).filter(lambda key: check_identity("t", QUEUE, key, KERNEL) is None)


@pytest.mark.parametrize(("key", "header"), ODD_KEYS)
def test_a_key_is_itself_when_printable_else_marked_base64(key: str, header: str) -> None:
    assert encode_timer_key(key) == header
    assert decode_timer_key(header) == key
    assert decode_timer_key(header.encode()) == key  # a Kafka header's bytes


@given(KEYS)
@example("b64:")
@example("\x01" * 150)
def test_every_key_the_kernel_accepts_round_trips_as_printable_text(key: str) -> None:
    value = encode_timer_key(key)
    # Valid on every destination: printable (no control characters for a log or terminal
    # to act on), UTF-8 (a Pulsar property, a Kafka header's bytes), and bounded.
    assert value.isprintable()
    assert len(value.encode()) <= 4 + 200
    assert decode_timer_key(value) == key
    assert decode_timer_key(value.encode()) == key
    assert (value == key) == (key.isprintable() and not key.startswith("b64:"))


@pytest.mark.parametrize("value", ["b64:!!!!", "b64:YQ", "b64:/w==", b"\xff"])
def test_a_value_no_key_encodes_to_is_refused(value: str | bytes) -> None:
    with pytest.raises(ValueError):
        decode_timer_key(value)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Message, LocalDestination]]:
    """A scheduled timer's message row, and a destination to build its records for."""
    shard = Shard()
    digest = hashlib.sha256(b"payload").hexdigest()
    assert shard.apply(schedule("k1", digest=digest, size=7)).code.value == "scheduled"
    message = shard.message("k1")
    assert message is not None
    destination = LocalDestination(str(tmp_path_factory.mktemp("destination")))
    yield message, destination
    destination.close()


@given(key=KEYS)
def test_the_timer_record_and_its_dead_letter_copy_both_carry_the_key(
    built: tuple[Message, LocalDestination], key: str
) -> None:
    row, destination = built
    message = msgspec.structs.replace(row, timer_key=key)
    record = prepare(message, b"payload", destination, "node-a")
    assert isinstance(record, PreparedPublish)
    copies = [
        prepare_dead_letter(
            message, payload, destination, attempts_spent=3, failures=3, last_error="x"
        )
        for payload in (b"payload", None)  # with its payload, and without it
    ]
    for prepared in (record, *copies):
        [value] = [v for k, v in prepared.headers if k == H_TIMER_KEY]
        assert decode_timer_key(value) == key


def _wait_delivered(nereus: Nereus, keys: list[str]) -> None:
    deadline = time.monotonic() + 30
    while not all(nereus.peek(QUEUE, k).status == "DELIVERED" for k in keys):
        assert nereus.runtime.halted is None, nereus.runtime.halted
        assert time.monotonic() < deadline, "the timers were not delivered"
        time.sleep(0.02)


def test_the_librarys_local_records_name_each_timer_however_odd_its_key(tmp_path: Path) -> None:
    keys = [key for key, _ in ODD_KEYS]
    with Nereus.open(str(tmp_path / "data"), assume_clock_error_ms=2) as nereus:
        nereus.start()
        for key in keys:
            assert nereus.schedule(QUEUE, key, key.encode(), delay_ms=0).ok
        _wait_delivered(nereus, keys)
        with nereus.consumer(QUEUE, group="app") as consumer:
            records = list(consumer.records(limit=len(keys), idle_timeout_s=5))
    assert len(records) == len(keys)
    expected = dict(ODD_KEYS)
    for record in records:
        key = record.payload.decode()
        assert record.timer_key == key and record.queue == QUEUE
        assert dict(record.headers)["nereus-timer-key"] == expected[key]


def test_tail_prints_the_key_of_what_an_http_service_delivered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = ["plain", "two\nlines", "b64:x"]
    with start_service(tmp_path / "data") as svc:
        replies = svc.post(*(http_schedule(k, delay_ms=0, queue=QUEUE) for k in keys), token=None)
        assert all(r["ok"] for r in replies), replies
        svc.wait_for("the deliveries", lambda: len(svc.delivered(QUEUE)) == len(keys))
    assert nereus_cli(["tail", QUEUE, "--data", str(tmp_path / "data")]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(line["timerKey"] for line in lines) == sorted(keys)
    assert sorted(line["headers"]["nereus-timer-key"] for line in lines) == sorted(
        ["plain", "b64:dHdvCmxpbmVz", "b64:YjY0Ong="]
    )
    assert {line["queue"] for line in lines} == {QUEUE}


def test_a_record_written_before_records_carried_the_key_reads_with_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = LocalDestination(str(tmp_path / "data" / "destination"))
    old = RecordBeforeKeys(
        QUEUE, 0, None, "m", 1, "m.1.a", "t", 0, 1, [], b"old", None, False, "default"
    )
    try:
        with dest._env.begin(write=True) as txn:
            txn.put(QUEUE.encode() + b"\x00" + bytes(8), encode_value(old), db=dest._records)
            txn.put(QUEUE.encode(), (1).to_bytes(8, "big"), db=dest._offsets)
        [record] = dest.read(QUEUE)
        assert (record.timer_key, record.tenant, record.payload) == (None, "default", b"old")
    finally:
        dest.close()
    assert nereus_cli(["tail", QUEUE, "--data", str(tmp_path / "data")]) == 0
    [line] = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert line["timerKey"] is None and line["tenant"] == "default"
