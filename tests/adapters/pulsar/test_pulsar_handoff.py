"""The fail-closed rules of the Pulsar delayed handoff (adapters/pulsar/handoff.py), as
properties: each "never" of specs/pulsar.md checked over generated settings and timers, and
the `[pulsar]` section's refusals. Pure: no broker."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nereus.adapters.compose.config import parse_configuration, pulsar_routing
from nereus.adapters.pulsar.config import PulsarTargetConfig, routing_for_url
from nereus.adapters.pulsar.handoff import (
    DelaySettings,
    Refusal,
    accepts,
    capability_or_managed,
    early_reveal_ms,
    handoff_capability,
    reveal_at_ms,
)
from nereus.adapters.tenancy import ConfigError
from nereus.kernel.config import KernelConfig
from nereus.kernel.records import IMMEDIATE, Capability
from nereus.kernel.validation import action_at, check_capability

KERNEL = KernelConfig()
MS = st.integers(min_value=0, max_value=120_000)
# Boundaries first: 0, exactly the kernel's limits, one past them.
EDGE_MS = st.sampled_from([0, 1, 999, 1000, 59_999, 60_000, 60_001]) | MS
SETTINGS = st.builds(
    DelaySettings,
    active=st.booleans(),
    tick_ms=EDGE_MS,
    strict=st.booleans(),
    max_delay_ms=st.sampled_from([0, 1, 1000, 5000]) | MS,
    source=st.just("generated"),
)
DELIVER_AT = st.integers(min_value=0, max_value=2**50)


def offer(
    lead: int, bound: int | None, s: DelaySettings | None, slack: int = 1000
) -> Capability | Refusal:
    return handoff_capability(
        lead,
        bound,
        s,
        slack_ms=slack,
        max_push_ms=KERNEL.max_clock_ahead_bound_ms,
        max_lead_ms=KERNEL.max_handoff_lead_ms,
    )


@given(EDGE_MS, SETTINGS | st.none())
def test_a_target_without_a_certified_bound_never_gets_a_handoff(
    lead: int, s: DelaySettings | None
) -> None:
    assert isinstance(offer(lead, None, s), Refusal)
    assert capability_or_managed(offer(lead, None, s)) == IMMEDIATE  # ordinary instead
    for pinned in (Capability("delayed_handoff", lead, 0), Capability("delayed_handoff", 0, lead)):
        assert not accepts(pinned, None, s, slack_ms=1000)


@given(EDGE_MS, EDGE_MS, SETTINGS, DELIVER_AT, EDGE_MS)
def test_a_granted_handoff_never_reveals_before_deliver_at(
    lead: int, bound: int, s: DelaySettings, deliver_at: int, ahead: int
) -> None:
    """The broker reveals at deliver_at less its early-reveal allowance, on a clock that runs
    ahead of true time by at most the certified bound: in true time never before deliverAt."""
    cap = offer(lead, bound, s)
    if isinstance(cap, Refusal):
        return
    assert isinstance(cap, Capability) and check_capability(cap, KERNEL) is None
    reveal = reveal_at_ms(deliver_at, cap)
    assert reveal is not None
    clock_ahead = min(ahead, bound)  # any clock error the certificate covers
    earliest_true_reveal = reveal - early_reveal_ms(s) - clock_ahead
    assert earliest_true_reveal >= deliver_at
    assert action_at(deliver_at, cap) == deliver_at - lead


@given(EDGE_MS, EDGE_MS, SETTINGS, st.integers(min_value=0, max_value=5000))
def test_a_granted_handoff_never_asks_more_than_the_brokers_maximum_delay(
    lead: int, bound: int, s: DelaySettings, slack: int
) -> None:
    cap = offer(lead, bound, s, slack)
    if isinstance(cap, Capability) and s.max_delay_ms > 0:
        # Sent no earlier than deliverAt - lead, asking deliverAt + push-out.
        assert cap.lead_ms + cap.clock_ahead_bound_ms + slack <= s.max_delay_ms


@given(EDGE_MS, EDGE_MS, SETTINGS)
def test_a_handoff_is_never_offered_when_delayed_delivery_is_off(
    lead: int, bound: int, s: DelaySettings
) -> None:
    off = DelaySettings(False, s.tick_ms, s.strict, s.max_delay_ms, "off")
    assert isinstance(offer(lead, bound, off), Refusal)
    assert isinstance(offer(lead, bound, None), Refusal)


@given(EDGE_MS, EDGE_MS, EDGE_MS, SETTINGS, DELIVER_AT)
def test_a_pinned_handoff_is_never_sent_under_settings_that_no_longer_certify_it(
    lead: int, push: int, bound: int, s: DelaySettings, deliver_at: int
) -> None:
    pinned = Capability("delayed_handoff", lead, push)
    if accepts(pinned, bound, s, slack_ms=1000):
        reveal = reveal_at_ms(deliver_at, pinned)
        assert reveal is not None and reveal - early_reveal_ms(s) - bound >= deliver_at
        assert s.active
        assert s.max_delay_ms <= 0 or lead + push + 1000 <= s.max_delay_ms


@given(EDGE_MS, EDGE_MS, SETTINGS)
def test_whatever_is_offered_is_accepted_under_the_same_settings(
    lead: int, bound: int, s: DelaySettings
) -> None:
    cap = capability_or_managed(offer(lead, bound, s))
    assert accepts(cap, bound, s, slack_ms=1000)
    assert accepts(IMMEDIATE, bound, s, slack_ms=1000)  # ordinary delivery is always there


def test_the_non_strict_tick_is_part_of_the_push_out() -> None:
    lax = DelaySettings(True, 1000, False, 0, "broker")
    strict = DelaySettings(True, 1000, True, 0, "broker")
    assert offer(2000, 50, lax) == Capability("delayed_handoff", 2000, 1050)
    assert offer(2000, 50, strict) == Capability("delayed_handoff", 2000, 50)
    # A timer pinned under the strict broker may not go out once it is lax again.
    assert not accepts(Capability("delayed_handoff", 2000, 50), 50, lax, slack_ms=1000)
    assert accepts(Capability("delayed_handoff", 2000, 1050), 50, strict, slack_ms=1000)
    capped = DelaySettings(True, 1000, False, 4000, "topic")
    assert isinstance(offer(2000, 50, capped), Refusal)  # 2000 + 1050 + 1000 > 4000


# The [pulsar] section ---------------------------------------------------------------------

TENANTS = {"tenants": {"acme": {"tokens": [{"subject": "s", "grants": ["produce"], "token": "t"}]}}}


def section(**pulsar: object) -> dict[str, object]:
    return {**TENANTS, "pulsar": pulsar}


@pytest.mark.parametrize(
    ("pulsar", "key", "problem"),
    [
        (
            {"targets": {"p": {"service_url": "pulsar://h:1", "delivery": "handoff"}}},
            "pulsar.targets.p.clock_ahead_bound_ms",
            "certified clock-ahead bound",
        ),
        (
            {
                "targets": {
                    "p": {
                        "service_url": "pulsar://h:1",
                        "delivery": "handoff",
                        "clock_ahead_bound_ms": 5,
                    }
                }
            },
            "pulsar.targets.p.admin_url",
            "admin API",
        ),
        (
            {"targets": {"p": {"service_url": "http://h:1"}}},
            "pulsar.targets.p.service_url",
            "pulsar://",
        ),
        (
            {"targets": {"p": {"service_url": "pulsar://h:1", "handoff_lead_ms": -1}}},
            "pulsar.targets.p.handoff_lead_ms",
            ">= 0",
        ),
        (
            {"targets": {"p": {"service_url": "pulsar://h:1", "colour": "red"}}},
            "pulsar.targets.p.colour",
            "unknown key",
        ),
        ({"queues": {"q": "nowhere"}}, "pulsar.queues.q", "no target 'nowhere'"),
        (
            {"targets": {"p": {"service_url": "pulsar://h:1", "auth": {"kind": "token"}}}},
            "pulsar.targets.p.auth.token_env",
            "required",
        ),
    ],
)
def test_a_bad_pulsar_section_is_refused_naming_its_key(
    pulsar: dict[str, object], key: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_configuration(section(**pulsar), "nereus.toml")
    assert info.value.key == key and problem in info.value.problem


def test_a_good_pulsar_section_routes_queues_and_takes_the_url_from_the_command_line() -> None:
    tenancy = parse_configuration(
        section(
            targets={
                "h": {
                    "admin_url": "http://127.0.0.1:8080",
                    "delivery": "handoff",
                    "handoff_lead_ms": 2000,
                    "clock_ahead_bound_ms": 20,
                    "topics": {"reminders": "persistent://acme/t/reminders"},
                }
            },
            queues={"reminders": "h"},
        ),
        "nereus.toml",
    )
    routing = pulsar_routing(tenancy, "pulsar://127.0.0.1:6650")
    assert routing is not None and routing.default == "local"
    target = routing.targets["h"]
    assert target.service_url == "pulsar://127.0.0.1:6650" and target.name == "h"
    assert target.topic_for("reminders") == "persistent://acme/t/reminders"
    assert target.topic_for("other") == "persistent://public/default/other"
    assert routing.queues == {"reminders": "h"}
    every = routing_for_url("pulsar://x:1", {})
    assert every.default == "pulsar" and every.targets["pulsar"] == PulsarTargetConfig(
        service_url="pulsar://x:1"
    )
