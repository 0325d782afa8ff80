"""The library's arguments, checked on the caller's side, and the records built from them.

    record, payload = schedule_record("reminders", "trial:acme:day7", b"{}",
                                      delay_ms=timedelta(days=7), txn="trial-acme-day7-v1")

Theory of operation: a call is turned into a record here, before anything is submitted, and
every argument is checked on the way: a value of the wrong type (a `bool` where an int is
wanted, a naive `datetime`, text where bytes are wanted), text that is not valid Unicode (a
lone surrogate cannot be written as UTF-8), an integer no 64-bit field can hold, or a buffer
that cannot be read raises `TypeError`/`ValueError` naming the argument, and nothing reaches
the shard. What passes is a value the shard log can carry; whether it is *acceptable* is the
kernel's to say, with a rejected outcome and its code (an empty or overlong key, a delay
beyond the horizon, a negative duration, a payload above the ceiling, ...), because those
rules are part of the log's history and replay must reach the same verdicts.

Durations are `int` milliseconds or `datetime.timedelta`; instants are `int` epoch
milliseconds or timezone-aware `datetime`. Sub-millisecond parts are rounded in the safe
direction: a delivery time or delay up (never earlier than asked), an expiry or lifetime
down (never admitted later than asked).

The command builders' parameters are the library's calls' signatures: `service.calls` makes
`schedule`/`schedule_async`, ... from `schedule_record`, ... (names, order, types, defaults),
so a parameter added here is a parameter of those calls, typed, on both facades.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from typing import TypedDict

from nereus.kernel.keys import DEFAULT_TENANT
from nereus.kernel.native import sha256_hex
from nereus.kernel.records import Appendable, Cancel, Reschedule, Schedule

Duration = int | timedelta
Instant = int | datetime
Payload = bytes | bytearray | memoryview
Headers = Sequence[tuple[str, str]] | Mapping[str, str]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)
# The widest integer a record field carries (msgpack's signed 64 bits); the kernel's own
# limits are far inside it and are answered with codes.
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _kind(value: object) -> str:
    return type(value).__name__


def integer(name: str, value: object, what: str = "an int") -> int:
    # bool is an int subclass, but `delay_ms=True` is never meant.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be {what}, not {_kind(value)}")
    number = int(value)
    if not _INT64_MIN <= number <= _INT64_MAX:
        raise ValueError(f"{name}: {number} does not fit in the 64 bits a record field carries")
    return number


def _whole_ms(delta: timedelta, round_up: bool) -> int:
    ms, rest = divmod(delta, _ONE_MS)
    return ms + 1 if round_up and rest else ms


def duration_ms(name: str, value: object, *, round_up: bool) -> int | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        return _whole_ms(value, round_up)
    return integer(name, value, "int milliseconds or a datetime.timedelta")


def instant_ms(name: str, value: object, *, round_up: bool) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.utcoffset() is None:
            raise ValueError(
                f"{name}: a naive datetime (no tzinfo) is refused, its instant would depend "
                "on the host's time zone; give an aware one, e.g. datetime.now(timezone.utc)"
            )
        return _whole_ms(value - _EPOCH, round_up)
    if isinstance(value, date):
        raise TypeError(f"{name}: a date is not an instant; give an aware datetime")
    return integer(name, value, "int epoch milliseconds or an aware datetime")


def text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be str, not {_kind(value)}")
    try:
        value.encode()
    except UnicodeEncodeError:
        raise ValueError(f"{name} is not valid Unicode text (a lone surrogate)") from None
    return str(value)


def optional_text(name: str, value: object) -> str | None:
    return None if value is None else text(name, value)


def flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, not {_kind(value)}")
    return value


def payload_bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return bytes(value)
    if isinstance(value, bytearray | memoryview):
        try:
            return bytes(value)
        except (ValueError, TypeError, BufferError) as exc:
            raise ValueError(f"payload: the buffer cannot be read ({exc})") from None
    hint = "; encode text first, e.g. text.encode()" if isinstance(value, str) else ""
    raise TypeError(f"payload must be bytes, bytearray or memoryview, not {_kind(value)}{hint}")


def header_pairs(value: object) -> tuple[tuple[str, str], ...]:
    if isinstance(value, Mapping):
        items: Sequence[object] = list(value.items())
    elif isinstance(value, list | tuple):
        items = value
    else:
        raise TypeError(
            f"headers must be a sequence of (name, value) pairs or a mapping, not {_kind(value)}"
        )
    pairs: list[tuple[str, str]] = []
    for i, pair in enumerate(items):
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise TypeError(f"headers[{i}] must be a (name, value) pair, not {_kind(pair)}")
        pairs.append((text(f"headers[{i}] name", pair[0]), text(f"headers[{i}] value", pair[1])))
    return tuple(pairs)


def identity(tenant: object, queue: object, timer_key: object) -> tuple[str, str, str]:
    return text("tenant", tenant), text("queue", queue), text("timer_key", timer_key)


def _txn(value: object) -> str:
    # A schedule or reschedule without one gets a fresh txn: each call is a new generation.
    return uuid.uuid4().hex if value is None else text("txn", value)


def _version(value: object) -> int | None:
    return None if value is None else integer("expected_version", value)


class Timing(TypedDict):
    """The four timing fields of a schedule or reschedule, in milliseconds."""

    delay_ms: int | None
    deliver_at_ms: int | None
    expire_at_ms: int | None
    lifetime_ms: int | None


def timing(
    delay_ms: object, deliver_at_ms: object, expire_at_ms: object, lifetime_ms: object
) -> Timing:
    """Checked and in milliseconds; neither delivery form given means at once (delay 0)."""
    delay = duration_ms("delay_ms", delay_ms, round_up=True)
    deliver_at = instant_ms("deliver_at_ms", deliver_at_ms, round_up=True)
    return Timing(
        delay_ms=0 if delay is None and deliver_at is None else delay,
        deliver_at_ms=deliver_at,
        expire_at_ms=instant_ms("expire_at_ms", expire_at_ms, round_up=False),
        lifetime_ms=duration_ms("lifetime_ms", lifetime_ms, round_up=False),
    )


def schedule_record(
    queue: str,
    timer_key: str,
    payload: Payload,
    *,
    delay_ms: Duration | None = None,
    deliver_at_ms: Instant | None = None,
    expire_at_ms: Instant | None = None,
    lifetime_ms: Duration | None = None,
    txn: str | None = None,
    partition: str | None = None,
    headers: Headers = (),
    expected_version: int | None = None,
    tenant: str = DEFAULT_TENANT,
    producer_sub: str | None = None,
    encrypted: bool = False,
) -> Appendable:
    """A SCHEDULE_V1 record and its payload bytes (the log holds only their digest)."""
    tenant, queue, timer_key = identity(tenant, queue, timer_key)
    data = payload_bytes(payload)
    record = Schedule(
        tenant=tenant,
        queue=queue,
        timer_key=timer_key,
        txn=_txn(txn),
        payload_digest=sha256_hex(data),
        payload_size=len(data),
        **timing(delay_ms, deliver_at_ms, expire_at_ms, lifetime_ms),
        partition_key=optional_text("partition", partition),
        headers=header_pairs(headers),
        expected_version=_version(expected_version),
        producer_sub=optional_text("producer_sub", producer_sub),
        encrypted=flag("encrypted", encrypted),
    )
    return record, data


def reschedule_record(
    queue: str,
    timer_key: str,
    *,
    delay_ms: Duration | None = None,
    deliver_at_ms: Instant | None = None,
    expire_at_ms: Instant | None = None,
    lifetime_ms: Duration | None = None,
    txn: str | None = None,
    expected_version: int | None = None,
    tenant: str = DEFAULT_TENANT,
) -> Appendable:
    """A RESCHEDULE_V1 record: new timing for a pending timer, the same content."""
    tenant, queue, timer_key = identity(tenant, queue, timer_key)
    record = Reschedule(
        tenant=tenant,
        queue=queue,
        timer_key=timer_key,
        txn=_txn(txn),
        **timing(delay_ms, deliver_at_ms, expire_at_ms, lifetime_ms),
        expected_version=_version(expected_version),
    )
    return record, None


def cancel_record(
    queue: str,
    timer_key: str,
    *,
    txn: str | None = None,
    expected_version: int | None = None,
    tenant: str = DEFAULT_TENANT,
) -> Appendable:
    """A CANCEL_V1 record. Its txn, if given, is only echoed back in the answer."""
    tenant, queue, timer_key = identity(tenant, queue, timer_key)
    record = Cancel(
        tenant,
        queue,
        timer_key,
        expected_version=_version(expected_version),
        txn=optional_text("txn", txn),
    )
    return record, None
