"""One result shape and one code list: the same bad command gets the same code, and the same
words, from the library (`Nereus`) and the HTTP API, on one embedded shard; every refusal
says why; `raise_for_status()` raises `NereusRefused`; a peek's payload is bytes in the
library and base64 over HTTP. The Kafka RPC's half is
`tests/adapters/kafka/test_kafka_result_codes.py`.

Every expected code and message below is written out here, from the rules in
`specs/codes.md` and `specs/http.md`, never read from `service.codes`. The property at the
end drives the kernel with a fixed opening that reaches every code a command can get, then
random commands, and checks that every code a command gets is
documented in `specs/codes.md` with an HTTP status, and that every refusal has a message.
"""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import nereus
from nereus import NereusRefused, Result
from nereus import kernel as k
from nereus.adapters.http.shapes import result_json
from nereus.kernel.records import record_type
from nereus.service.calls import TimerCalls
from nereus.service.codes import NAMES_JSON
from nereus.service.results import to_result
from tests.support.builders import DIGEST, QUEUE, T0_MS, TENANT, Shard
from tests.support.http_harness import Service, start_service, timer_path
from tests.support.strategies import props

SPECS = Path(__file__).resolve().parents[2] / "specs"
CEILING = 1_048_576
HORIZON_MS = 90 * 24 * 3600 * 1000
POST = "/api/v1/timers"


@pytest.fixture(scope="module")
def svc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    # No config: the default tenant, the library's too; the cell's limits are the kernel's.
    with start_service(tmp_path_factory.mktemp("codes")) as service:
        yield service


def _op(key: str, **fields: Any) -> dict[str, Any]:
    payload = fields.pop("payload", b"x")
    op = {"op": "schedule", "queue": "q", "timerKey": key, "delayMs": 60_000, **fields}
    op["payload"] = base64.b64encode(payload).decode()
    return op


# (name, library call, HTTP operation, HTTP status, code, library message, HTTP message)
Refusal = tuple[str, Callable[[TimerCalls], Result], dict[str, Any], int, str, str, str]
REFUSED_WHOLE: list[Refusal] = [
    (
        "a payload over the ceiling",
        lambda n: n.schedule("q", "big", b"x" * 1_125_000, delay_ms=60_000),
        _op("big", payload=b"x" * 1_125_000),
        413,
        "payload_too_large",
        "1125000 bytes > ceiling 1048576",
        "operations[0]: 1125000 bytes > ceiling 1048576",
    ),
    (
        "a delay past the horizon",
        lambda n: n.schedule("q", "far", b"x", delay_ms=HORIZON_MS + 1),
        _op("far", delayMs=HORIZON_MS + 1),
        403,
        "horizon_exceeded",
        "delay_ms 7776000001 is beyond the horizon of 7776000000 ms",
        "operations[0]: delayMs 7776000001 is beyond the horizon of 7776000000 ms",
    ),
    (
        "a negative delay",
        lambda n: n.schedule("q", "neg", b"x", delay_ms=-1),
        _op("neg", delayMs=-1),
        400,
        "invalid_timing",
        "delay_ms must be in [0, 2^53) ms, not -1",
        "operations[0]: delayMs must be in [0, 2^53) ms, not -1",
    ),
    (
        "a queue with a slash",
        lambda n: n.schedule("a/b", "k", b"x", delay_ms=60_000),
        {**_op("k"), "queue": "a/b"},
        400,
        "invalid_identity",
        "queue must be one path segment of 1..150 bytes without NUL",
        "operations[0]: queue must be one path segment of 1..150 bytes without NUL",
    ),
    (
        "a key of 151 bytes",
        lambda n: n.schedule("q", "k" * 151, b"x", delay_ms=60_000),
        _op("k" * 151),
        400,
        "invalid_identity",
        "timer_key must be 1..150 bytes without NUL",
        "operations[0]: timerKey must be 1..150 bytes without NUL",
    ),
    (
        "an empty txn",
        lambda n: n.schedule("q", "t", b"x", delay_ms=60_000, txn=""),
        _op("t", txn=""),
        400,
        "invalid_txn",
        "txn must be 1..256 bytes",
        "operations[0]: txn must be 1..256 bytes",
    ),
    (
        "33 headers",
        lambda n: n.schedule(
            "q", "h", b"x", delay_ms=60_000, headers={f"h{i}": "v" for i in range(33)}
        ),
        _op("h", headers={f"h{i}": "v" for i in range(33)}),
        400,
        "invalid_headers",
        "headers: at most 32, names non-empty and not nereus-*, 16384 bytes in all",
        "operations[0]: headers: at most 32, names non-empty and not nereus-*, 16384 bytes in all",
    ),
]


@pytest.mark.parametrize("case", REFUSED_WHOLE, ids=[c[0] for c in REFUSED_WHOLE])
def test_a_bad_command_gets_one_code_and_one_text_from_the_library_and_http(
    svc: Service, case: Refusal
) -> None:
    _name, call, op, http_status, code, library_text, http_text = case
    result = call(svc.nereus)
    assert (result.ok, result.status, result.code) == (False, "rejected", code)
    assert result.message == library_text
    reply = svc.call("POST", POST, {"operations": [op]}, token=None)
    assert reply.status == http_status
    assert reply.doc == {"error": {"code": code, "message": http_text}}


def _delivered(svc: Service, key: str) -> None:
    deadline = time.monotonic() + 30
    while svc.nereus.peek("q", key).status != "DELIVERED":
        assert time.monotonic() < deadline, "the timer was not delivered"
        time.sleep(0.02)


def test_verdicts_have_one_shape_on_both_surfaces(svc: Service) -> None:
    lib = svc.nereus
    # absent: the same code and words from a library cancel, a DELETE and a batch cancel.
    gone = lib.cancel("q", "never-lib")
    absent_text = "no timer is pending under this key (never scheduled, or no longer pending)"
    assert (gone.ok, gone.status, gone.code, gone.message) == (
        False,
        "absent",
        "absent",
        absent_text,
    )
    deleted = svc.call("DELETE", timer_path("never-http", queue="q"), token=None).doc
    assert (deleted["status"], deleted["code"], deleted["message"]) == (
        "absent",
        "absent",
        absent_text,
    )
    (batch,) = svc.post({"op": "cancel", "queue": "q", "timerKey": "never-b"}, token=None)
    assert (batch["ok"], batch["code"], batch["message"]) == (False, "absent", absent_text)

    # txn_reused: a rule only the kernel checks comes back as a `rejected` element.
    reused_text = "txn 'T1' is the current generation's: a change needs a new txn"
    assert lib.schedule("q", "t-lib", b"a", delay_ms=60_000, txn="T1").ok
    again = lib.schedule("q", "t-lib", b"b", delay_ms=60_000, txn="T1")
    assert (again.status, again.code, again.message) == ("rejected", "txn_reused", reused_text)
    svc.post(_op("t-http", payload=b"a", txn="T1"), token=None)
    (element,) = svc.post(_op("t-http", payload=b"b", txn="T1"), token=None)
    assert (element["ok"], element["status"], element["code"], element["message"]) == (
        False,
        "rejected",
        "txn_reused",
        reused_text,
    )

    # too_late: a cancel after delivery names the attempt on both surfaces.
    for key in ("late-lib", "late-http"):
        assert lib.schedule("q", key, b"x", delay_ms=0).ok
        _delivered(svc, key)
    late = lib.cancel("q", "late-lib")
    assert (late.ok, late.status, late.code) == (False, "too_late", "too_late")
    assert late.message == (
        f"the timer crossed Publish Admission (attempt {late.attempt_id}): "
        "it is being or was delivered"
    )
    late_http = svc.call("DELETE", timer_path("late-http", queue="q"), token=None).doc
    assert (late_http["status"], late_http["code"]) == ("too_late", "too_late")
    assert late_http["message"] == (
        f"the timer crossed Publish Admission (attempt {late_http['attemptId']}): "
        "it is being or was delivered"
    )

    # ok: the code is the status, and nothing needs explaining.
    fine = lib.schedule("q", "fine", b"x", delay_ms=60_000)
    assert (fine.ok, fine.status, fine.code, fine.message) == (True, "scheduled", "scheduled", None)
    (ok_element,) = svc.post(_op("fine-http"), token=None)
    assert (ok_element["status"], ok_element["code"]) == ("scheduled", "scheduled")
    assert "message" not in ok_element


def test_a_reserved_header_is_the_one_documented_difference(svc: Service) -> None:
    # Over HTTP a nereus-* header is a server-owned field; the library is the server side
    # and meets the kernel's header rule (specs/codes.md says so).
    lib = svc.nereus.schedule("q", "hdr", b"x", delay_ms=60_000, headers={"nereus-txn": "x"})
    assert (lib.code, lib.message) == (
        "invalid_headers",
        "headers: at most 32, names non-empty and not nereus-*, 16384 bytes in all",
    )
    ops = {"operations": [_op("hdr", headers={"nereus-txn": "x"})]}
    reply = svc.call("POST", POST, ops, token=None)
    assert (reply.status, reply.code) == (400, "server_owned_field")


def test_raise_for_status_returns_an_ok_result_and_raises_a_refusal(svc: Service) -> None:
    lib = svc.nereus
    assert nereus.NereusRefused is NereusRefused  # exported from the package
    fine = lib.schedule("q", "raise-ok", b"x", delay_ms=60_000)
    assert fine.raise_for_status() is fine
    with pytest.raises(NereusRefused) as refused:
        lib.schedule("q", "raise-big", b"x" * (CEILING + 1), delay_ms=60_000).raise_for_status()
    assert refused.value.code == "payload_too_large"
    assert refused.value.message == "1048577 bytes > ceiling 1048576"
    assert str(refused.value) == "payload_too_large: 1048577 bytes > ceiling 1048576"
    assert refused.value.result.timer_key == "raise-big"
    # absent is ok: false, so it raises too: "no longer pending" must never read as success.
    with pytest.raises(NereusRefused) as absent:
        lib.cancel("q", "raise-never").raise_for_status()
    assert absent.value.code == "absent"


def test_a_peek_payload_is_bytes_in_the_library_and_base64_over_http(svc: Service) -> None:
    data = b"\x00\xff{json}\n"
    assert svc.nereus.schedule("q", "peek", data, delay_ms=60_000).ok
    peek = svc.nereus.peek("q", "peek")
    assert isinstance(peek.payload, bytes) and peek.payload == data
    doc = svc.call("GET", timer_path("peek", queue="q"), token=None).doc
    assert doc["payload"] == "AP97anNvbn0K"  # base64 of data, written out
    assert svc.nereus.list("q").rows[0].payload is None  # a listing carries no payloads


# The property ------------------------------------------------------------------------------


def _documented() -> dict[str, int]:
    """code -> HTTP status, from the "Answers to clients" tables of specs/codes.md."""
    text = (SPECS / "codes.md").read_text()
    answers = text[text.index("# Answers to clients") :]
    rows = re.findall(r"^\| `([a-z_]+)` \| (\d{3})\b", answers, flags=re.MULTILINE)
    return {code: int(status) for code, status in rows}


DOCUMENTED = _documented()
# The closed status list of the seed, written out.
STATUSES = {"scheduled", "rescheduled", "unchanged", "canceled", "too_late", "absent", "rejected"}
OK = {"scheduled", "rescheduled", "unchanged", "canceled"}
CONFIG = k.KernelConfig()
LIFETIME_MS = CONFIG.limits.max_message_lifetime_ms

GOOD_TIMING: dict[str, Any] = {"delay_ms": 1_000}
# At most one fault per command, so that commands also get past the checks to the table.
FAULTS: list[dict[str, Any]] = [
    {"timer_key": ""},
    {"timer_key": "k" * 151},
    {"queue": "q/x"},
    {"txn": ""},
    {"txn": "x" * 257},
    {"expected_version": 0},
    {"expected_version": 1},
    {"expected_version": 7},
    {"delay_ms": -1},
    {"delay_ms": 2**53},
    {"delay_ms": HORIZON_MS + 1},
    {"delay_ms": None, "deliver_at_ms": T0_MS + 2 * HORIZON_MS},
    {"delay_ms": None},
    {"deliver_at_ms": T0_MS + 5_000},
    {"expire_at_ms": T0_MS + 500},
    {"lifetime_ms": 10},
    {"lifetime_ms": LIFETIME_MS + 1},
    {"expire_at_ms": T0_MS + 60_000, "lifetime_ms": 60_000},
]
SCHEDULE_FAULTS: list[dict[str, Any]] = [
    *FAULTS,
    {"payload_size": CONFIG.max_payload_bytes + 1},
    {"payload_size": -1},
    {"payload_digest": "not-a-digest"},
    {"headers": (("nereus-x", "1"),)},
    {"headers": tuple((f"h{i}", "v") for i in range(33))},
    {"capability": k.Capability("delayed_handoff", lead_ms=10**9)},
    {"capability": k.Capability("immediate", lead_ms=5)},
]
keys = st.sampled_from(["a", "b"])
txns = st.sampled_from(["t1", "t2", "t3"])


def _fault(faults: list[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(st.just({}), st.just({}), st.sampled_from(faults))


# A pending timer scheduled again with the other capability is `destination_changed`.
HANDOFF = k.Capability("delayed_handoff", lead_ms=500, clock_ahead_bound_ms=200)
schedules = st.builds(
    lambda key, txn, size, capability, fault: k.Schedule(
        **{
            "tenant": TENANT,
            "queue": QUEUE,
            "timer_key": key,
            "txn": txn,
            "payload_digest": DIGEST,
            "payload_size": size,
            "capability": capability,
            **GOOD_TIMING,
            **fault,
        }
    ),
    keys,
    txns,
    st.sampled_from([7, 8]),
    st.sampled_from([k.Capability(), k.Capability(), k.Capability(), HANDOFF]),
    _fault(SCHEDULE_FAULTS),
)
reschedules = st.builds(
    lambda key, txn, fault: k.Reschedule(
        **{"tenant": TENANT, "queue": QUEUE, "timer_key": key, "txn": txn, **GOOD_TIMING, **fault}
    ),
    keys,
    txns,
    _fault(FAULTS),
)
cancels = st.builds(
    lambda key, version: k.Cancel(TENANT, QUEUE, key, expected_version=version),
    st.sampled_from(["a", "b", "", "never"]),
    st.sampled_from([None, None, None, 0, 1, 3]),
)
# Besides commands: admit a key (so later commands are too late), freeze or thaw the shard.
actions = st.one_of(
    schedules,
    schedules,
    reschedules,
    cancels,
    st.sampled_from(["admit:a", "admit:b", "FROZEN", "ACTIVE_FOR_COMMANDS"]),
)


def _admit(shard: Shard, key: str) -> None:
    m = shard.message(key)
    if m is None or m.status is not k.Status.SCHEDULED:
        return
    if shard.state.meta.shard_status != "ACTIVE_FOR_COMMANDS":
        return
    shard.now_ms = max(shard.now_ms, m.action_at_ms + 10)
    shard.apply(shard.admission(key))


def _check(shard: Shard, step: Any, seen: set[str]) -> None:
    if step in ("FROZEN", "ACTIVE_FOR_COMMANDS"):
        shard.apply(k.ShardState(step))
        return
    if isinstance(step, str):
        _admit(shard, step.split(":")[1])
        return
    outcome = shard.apply(step)
    code = str(outcome.code)
    seen.add(code)
    assert code in DOCUMENTED, f"{code} is not in specs/codes.md's answers"
    assert DOCUMENTED[code] in {200, 400, 403, 413}, (code, DOCUMENTED[code])
    result = to_result(outcome, step, CONFIG)
    assert result.status in STATUSES and result.ok == (result.status in OK)
    assert result.code == code
    assert result.ok or result.message, f"{code} without a message"
    kind = record_type(step).split("_")[0].lower()  # SCHEDULE_V1 -> schedule
    element = result_json(to_result(outcome, step, CONFIG, NAMES_JSON), kind)
    assert element["code"] == code and element["status"] == result.status
    assert ("message" in element) == (not result.ok)


def _schedule(key: str = "a", **fields: Any) -> k.Schedule:
    base: dict[str, Any] = {
        "tenant": TENANT,
        "queue": QUEUE,
        "timer_key": key,
        "txn": "t1",
        "payload_digest": DIGEST,
        "payload_size": 7,
        **GOOD_TIMING,
    }
    return k.Schedule(**{**base, **fields})


# A fixed opening that reaches every code a command can get, before the random steps: the
# property checks each of them (and whatever the random steps reach after it).
OPENING: list[Any] = [
    _schedule(),
    _schedule(),
    _schedule(txn="t2", payload_size=8),
    _schedule(txn="t2", payload_size=7),
    _schedule(txn="t3", capability=HANDOFF),
    k.Reschedule(TENANT, QUEUE, "a", "t4", delay_ms=1_000),
    k.Cancel(TENANT, QUEUE, "never"),
    *(_schedule("b", **{"txn": "t9", **fault}) for fault in SCHEDULE_FAULTS),
    _schedule("b", txn="t9", expected_version=7),
    "admit:a",
    k.Cancel(TENANT, QUEUE, "a"),
    _schedule("c"),
    k.Cancel(TENANT, QUEUE, "c"),
    "FROZEN",
    _schedule("d"),
    "ACTIVE_FOR_COMMANDS",
]


def test_every_code_a_command_can_get_is_documented_with_an_http_status() -> None:
    seen: set[str] = set()

    @props(300)
    @given(st.lists(actions, max_size=14))
    def run(steps: list[Any]) -> None:
        shard = Shard()
        for step in [*OPENING, *steps]:
            _check(shard, step, seen)

    run()
    # The codes the kernel gives a command, written out: the property met each of them.
    expected = {
        "scheduled",
        "rescheduled",
        "unchanged",
        "canceled",
        "too_late",
        "absent",
        "txn_reused",
        "shard_not_active",
        "invalid_identity",
        "invalid_txn",
        "invalid_payload_ref",
        "payload_too_large",
        "invalid_headers",
        "invalid_capability",
        "invalid_timing",
        "horizon_exceeded",
        "lifetime_exceeded",
        "expire_before_window",
        "version_mismatch",
        "destination_changed",
    }
    assert expected <= seen, sorted(expected - seen)
