"""When a Pulsar target may hold a timer for Nereus (certified delayed handoff), and when not.

Theory of operation: a delayed handoff sends the record before deliverAt with Pulsar's own
`deliver_at`, so the broker holds it. Pulsar can reveal such a record early in two ways, and
the push-out asked of it must cover both:

* its clock may run ahead of true time: by at most the target's *certified* clock-ahead
  bound (configured per target; a target without one never gets a handoff);
* with `isDelayedDeliveryDeliverAtTimeStrict=false` (Pulsar's default) the broker dispatches
  a delayed record up to one tick (`delayedDeliveryTickTimeMillis`, or the topic's or
  namespace's `tickTime`) before its `deliver_at`.

So the capability's `clock_ahead_bound_ms` (the push-out, `kernel.validation.visible_at`) is
the certified bound plus that early-reveal allowance: a broker that runs ahead by the whole
bound and reveals a whole tick early still reveals at or after deliverAt. The send starts
`lead_ms` before deliverAt (`kernel.validation.action_at`). A handoff is refused — the queue
gets ordinary managed delivery instead (send at deliverAt, no `deliver_at`) — when the target
is uncertified, the broker's settings are unknown, delayed delivery is off for the topic, the
push-out exceeds what the kernel allows, or the largest delay it would ask (lead + push-out +
a clock slack) exceeds the broker's `maxDeliveryDelayInMillis` (such a send is refused by the
broker, and the C++ client resends it forever, blocking every record behind it).

A timer already pinned to a handoff is sent only while the current settings still certify
it (`accepts`): its push-out at least what they require and its delay within their maximum.
Everything here is a pure function of its arguments.
"""

from __future__ import annotations

import msgspec

from nereus.kernel.records import IMMEDIATE, Capability
from nereus.kernel.validation import visible_at


class DelaySettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The delayed-delivery settings that apply to one topic, as the broker reports them."""

    active: bool
    tick_ms: int
    strict: bool
    max_delay_ms: int  # 0: no maximum
    source: str = ""  # where they were read, for logs


class Refusal(msgspec.Struct, frozen=True):
    reason: str


def early_reveal_ms(settings: DelaySettings) -> int:
    """How much before its `deliver_at` the broker may dispatch a delayed record."""
    return 0 if settings.strict else max(settings.tick_ms, 0)


def required_push_ms(bound_ms: int, settings: DelaySettings) -> int:
    return bound_ms + early_reveal_ms(settings)


def handoff_capability(
    lead_ms: int,
    bound_ms: int | None,
    settings: DelaySettings | None,
    *,
    slack_ms: int,
    max_push_ms: int,
    max_lead_ms: int,
) -> Capability | Refusal:
    """The handoff a target may offer now, or why it may not."""
    if bound_ms is None:
        return Refusal("the target's clock-ahead bound is not certified")
    if bound_ms < 0 or lead_ms < 0 or slack_ms < 0:
        return Refusal("a negative bound, lead or slack certifies nothing")
    if settings is None:
        return Refusal("the broker's delayed-delivery settings are not known")
    if not settings.active:
        return Refusal(f"delayed delivery is off ({settings.source})")
    push_ms = required_push_ms(bound_ms, settings)
    if push_ms > max_push_ms:
        return Refusal(f"push-out {push_ms} ms exceeds the kernel's {max_push_ms} ms")
    if lead_ms > max_lead_ms:
        return Refusal(f"lead {lead_ms} ms exceeds the kernel's {max_lead_ms} ms")
    if not _within_max_delay(lead_ms, push_ms, slack_ms, settings):
        return Refusal(
            f"lead {lead_ms} + push-out {push_ms} + slack {slack_ms} ms exceeds the broker's "
            f"maximum delivery delay {settings.max_delay_ms} ms ({settings.source})"
        )
    return Capability("delayed_handoff", lead_ms, push_ms)


def capability_or_managed(capability: Capability | Refusal) -> Capability:
    """What a queue is pinned to: the handoff, or ordinary managed delivery when refused."""
    return capability if isinstance(capability, Capability) else IMMEDIATE


def accepts(
    pinned: Capability, bound_ms: int | None, settings: DelaySettings | None, *, slack_ms: int
) -> bool:
    """Whether a timer pinned to `pinned` may be sent under the current settings."""
    if pinned.kind == "immediate":
        return pinned == IMMEDIATE
    if bound_ms is None or settings is None or not settings.active:
        return False
    if pinned.clock_ahead_bound_ms < required_push_ms(bound_ms, settings):
        return False
    return _within_max_delay(pinned.lead_ms, pinned.clock_ahead_bound_ms, slack_ms, settings)


def _within_max_delay(lead_ms: int, push_ms: int, slack_ms: int, s: DelaySettings) -> bool:
    return s.max_delay_ms <= 0 or lead_ms + push_ms + slack_ms <= s.max_delay_ms


def reveal_at_ms(deliver_at_ms: int, capability: Capability) -> int | None:
    """The `deliver_at` to send, or None for ordinary managed delivery."""
    if capability.kind != "delayed_handoff":
        return None
    return visible_at(deliver_at_ms, capability)
