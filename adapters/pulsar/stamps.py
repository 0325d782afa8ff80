"""The time a Pulsar record's evidence carries: never earlier than the record's own send.

Theory of operation: the evidence's `timestamp_ms` is what fire lag and the early-delivery
check (`runtime.tally`: `early_delivery` when it is before deliverAt) measure, so it must be
a time before which the record cannot have been visible: its own send, or its requested
reveal time when that is later (a delayed handoff's `nereus-reveal-at`). Then the check
fires exactly when a record was sent (or asked to be revealed) before its deliverAt, by the
sender's clock: never for a record sent on time, always for one sent early.

Pulsar's `publish_timestamp()` is not that time for every record. The client batches sends,
and a batch carries one publish time, its first record's: a record later in the batch reads
a time earlier than its own send (measured with pulsar-client 3.13: 3-20 ms earlier in a
20 ms batching window; issue 30 saw records stamped up to 42 ms before a deliverAt they
were sent after). So every record carries its own send time in `nereus-sent-at`, read just
before the client gets it, and the evidence found by a search is the latest of that, the
publish time and the reveal time (`found_at_ms`). A send's own answer (`live_at_ms`) is
stamped from the same reading, so the two ways of finding an attempt agree.

A record without `nereus-sent-at` (written by an older build, or its value unreadable) is
still found. The first record of its batch, or one sent alone (batch index 0, or -1 for an
unbatched one), has the publish time as its own send time. For a later record the send time
is unknown and the publish time may be earlier than it, so it gets the time the search read
it (the reader's clock): the record was at the broker by then, so that is not earlier than
its send. Fail closed: such a record never looks early when it was not; its fire lag is
overstated (by up to the time between its send and the search), and an early send among
such records is not seen by this check, only prevented by the send gate (P1).

Pure functions of their arguments.
"""

from __future__ import annotations

from collections.abc import Mapping

# On every message: the sender's clock (ms) when it handed the message to the client.
H_SENT_AT = "nereus-sent-at"
# On a handed-off message: the deliver_at the broker was asked for (ms).
H_REVEAL_AT = "nereus-reveal-at"


def sent_at_ms(gate_ms: int, clock_ms: int) -> int:
    """A send's own time: the clock read just before the client gets the message, never
    before the reading that opened its send gate (a clock stepped back in between must not
    stamp the send before the moment it was allowed)."""
    return max(gate_ms, clock_ms)


def live_at_ms(sent_ms: int, reveal_ms: int | None) -> int:
    """The evidence time of a send the client answered: its send, or its reveal if later."""
    return max(sent_ms, reveal_ms or 0)


def found_at_ms(
    properties: Mapping[str, str], publish_ms: int, batch_index: int, read_ms: int
) -> int:
    """The evidence time of a record a search found (see the module doc)."""
    sent_ms = _ms(properties, H_SENT_AT)
    if sent_ms is not None:
        own_ms = max(sent_ms, publish_ms)
    elif batch_index <= 0:
        own_ms = publish_ms  # first in its batch, or alone: the batch's time is its own
    else:
        own_ms = max(read_ms, publish_ms)  # unknown: when it surely was at the broker
    return max(own_ms, _ms(properties, H_REVEAL_AT) or 0)


def _ms(properties: Mapping[str, str], name: str) -> int | None:
    value = properties.get(name)
    if value is None or not value.isascii() or not value.isdigit():
        return None
    return int(value)
