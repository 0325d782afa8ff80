"""What the Pulsar client's answers prove about a record: the outcome classes of a send.

Theory of operation: the class must be the truth, and it is taken from the client's real
results, found by experiment against a real broker (pulsar-client 3.13, broker 4.0.7;
`tests/adapters/pulsar/test_pulsar_destination.py` reproduces them):

* `Ok` with a message id -> PUBLISHED, the id as evidence (`ledger:entry:partition:batch`),
  stamped with the send's own time (`adapters.pulsar.stamps`). `Ok` with ledger and entry
  -1 is how a deduplicating broker answers a record it dropped as a duplicate: an earlier
  copy may be persisted, or none (measured: a batch the client sent after a later
  `deliver_at` record of the same producer is dropped whole, which the destination prevents
  by sending `deliver_at` records on a producer of their own) -> UNKNOWN.
* Refused by the client before anything was sent, so definitely absent:
  `MessageTooBig` (the client checks the broker's maxMessageSize first) -> permanent
  `record_too_large`; `ProducerQueueIsFull`, `MemoryBufferIsFull` -> retriable.
* Refused by the broker for the topic as a whole: `TopicTerminated` -> lane unavailable,
  `ProducerBlockedQuotaExceeded*` -> retriable. The client resends what it has pending after
  a reconnect, and an earlier transmission of the same record may have been persisted with
  its receipt lost; so when the client reported any disturbance (a warning or an error of its
  own) between this send and its answer, these become UNKNOWN instead.
* `Timeout` -> UNKNOWN: seen persisted (a broker stopped with SIGSTOP past the send timeout
  kept the record). `AlreadyClosed` -> UNKNOWN: a pending record failed by a closing
  producer may have reached the broker. Everything else -> UNKNOWN.
* A send the broker refuses because its delay exceeds `maxDeliveryDelayInMillis` never
  answers: the client resends it forever, holding back every record behind it. Nereus never
  makes one (`adapters.pulsar.handoff`).

Before a producer exists nothing can have been sent, so a failed `create_producer` is always
NOT_PUBLISHED (`classify_create_error`): no such topic or namespace -> lane unavailable; an
invalid name, authentication or authorization -> permanent; anything else (connection,
lookup, timeout, a producer of the same name still connected) -> retriable.
"""

from __future__ import annotations

from typing import Any

import pulsar

from nereus.kernel.records import Evidence, NotPublished, Published, Unknown

_R = pulsar.Result
_CLIENT_REFUSED = {
    _R.ProducerQueueIsFull: "queue_full",
    _R.MemoryBufferIsFull: "memory_buffer_full",
}
_BROKER_REFUSED_LANE = {_R.TopicTerminated: "topic_terminated"}
_BROKER_REFUSED_RETRIABLE = {
    _R.ProducerBlockedQuotaExceededError: "quota_exceeded",
    _R.ProducerBlockedQuotaExceededException: "quota_exceeded",
}
_CREATE_LANE = {_R.TopicNotFound: "topic_not_found", _R.TopicTerminated: "topic_terminated"}
_CREATE_PERMANENT = {
    _R.InvalidTopicName: "invalid_topic_name",
    _R.AuthenticationError: "authentication_failed",
    _R.AuthorizationError: "authorization_failed",
    _R.NotAllowedError: "not_allowed",
    _R.InvalidConfiguration: "invalid_configuration",
}


def broker_message_id(msg_id: Any) -> str:
    return f"{msg_id.ledger_id()}:{msg_id.entry_id()}:{msg_id.partition()}:{msg_id.batch_index()}"


def evidence_of(topic: str, msg_id: Any, timestamp_ms: int) -> Evidence:
    return Evidence(topic, int(msg_id.partition()), -1, timestamp_ms, broker_message_id(msg_id))


def classify_send(
    result: Any, msg_id: Any, topic: str, timestamp_ms: int, *, disturbed: bool
) -> Published | NotPublished | Unknown:
    """The outcome a send's answer proves (see the module doc)."""
    name = getattr(result, "name", str(result))
    if result == _R.Ok:
        if msg_id is None or msg_id.ledger_id() < 0 or msg_id.entry_id() < 0:
            return Unknown("persisted_without_position", f"Ok without a message id: {msg_id}")
        return Published(evidence_of(topic, msg_id, timestamp_ms))
    if result == _R.MessageTooBig:
        return NotPublished("permanent", "record_too_large", f"{name}: the client refused it")
    code = _CLIENT_REFUSED.get(result)
    if code is not None:
        return NotPublished("retriable", code, f"{name}: the client refused it")
    code = _BROKER_REFUSED_LANE.get(result) or _BROKER_REFUSED_RETRIABLE.get(result)
    if code is not None:
        if disturbed:
            return Unknown("possibly_persisted", f"{name} after a client disturbance")
        if result in _BROKER_REFUSED_LANE:
            return NotPublished("lane_unavailable", code, name)
        return NotPublished("retriable", code, name)
    if result == _R.Timeout:
        return Unknown("timeout", "no receipt within the send timeout")
    if result == _R.AlreadyClosed:
        return Unknown("producer_closed", "the producer closed with the record pending")
    return Unknown("possibly_persisted", name)


def classify_create_error(exc: BaseException) -> NotPublished:
    """A producer could not be made: nothing was sent."""
    result = _result_of(exc)
    detail = f"{type(exc).__name__}: {exc}"
    code = _CREATE_LANE.get(result) if result is not None else None
    if code is not None:
        return NotPublished("lane_unavailable", code, detail)
    code = _CREATE_PERMANENT.get(result) if result is not None else None
    if code is not None:
        return NotPublished("permanent", code, detail)
    return NotPublished("retriable", "producer_unavailable", detail)


def classify_raised(exc: BaseException) -> NotPublished:
    """`send_async` raised: the record was never queued, so it is absent."""
    result = _result_of(exc)
    if result == _R.MessageTooBig:
        return NotPublished("permanent", "record_too_large", str(exc))
    return NotPublished("retriable", "send_refused", f"{type(exc).__name__}: {exc}")


_EXCEPTIONS: dict[type[BaseException], Any] = {
    getattr(pulsar, name): getattr(_R, name)
    for name in dir(_R)
    if not name.startswith("_") and isinstance(getattr(pulsar, name, None), type)
}


def _result_of(exc: BaseException) -> Any:
    for cls in type(exc).__mro__:
        result = _EXCEPTIONS.get(cls)
        if result is not None:
            return result
    return None
