"""Hypothesis strategies for kernel properties, and the driver that folds them into a log.

Theory of operation: an Admission or an outcome means something only against the state it
lands on (the current generation and version, the attempt ids that exist). So the log
strategies do not draw records; they draw abstract *actions* ("admit identity 3 from a claim
taken earlier, persisted exactly at its expireAt") and `Driver` interprets each action against
the state folded so far, builds the concrete record and its persistence time, and reduces it.
The log is a deterministic function of the action list, and hypothesis shrinks actions.

The identity space is tiny (2 tenants x 2 queues x 3 keys) so that commands and mutations
collide constantly, the config is small (short horizons, three attempts) so that expiry and
dead-lettering happen within a few steps, and every time choice is biased to the boundaries
the rules are written around: exactly actionAt, expireAt - 1, expireAt, deliverAt = expireAt -
minDeliveryWindow, and a clock error that puts an end of the trusted interval on a bound.

`NEREUS_HYPOTHESIS_EXAMPLES`, when set, is the number of examples every property runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Literal, NamedTuple, TypeVar, get_args

import msgspec
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from nereus import kernel as k
from nereus.kernel.effects import Effect, EntryOutcome, Publish
from nereus.kernel.model import OPEN_ATTEMPT_STATUSES
from nereus.kernel.records import IMMEDIATE, ShardStatus
from nereus.kernel.timing import MAX_TIME_MS, MIN_TIME_MS
from tests.support.builders import DIGEST, OTHER_DIGEST, T0_MS

# Settings ----------------------------------------------------------------------------------

EXAMPLES_ENV = "NEREUS_HYPOTHESIS_EXAMPLES"


def max_examples(default: int) -> int:
    raw = os.environ.get(EXAMPLES_ENV, "").strip()
    return int(raw) if raw else default


def props(default: int = 150) -> settings:
    """The settings every property uses: modest by default, scaled by the env var."""
    return settings(
        max_examples=max_examples(default),
        deadline=None,
        suppress_health_check=(HealthCheck.too_slow, HealthCheck.data_too_large),
    )


# The shard under test ----------------------------------------------------------------------

CONFIG = k.KernelConfig(
    limits=k.TimingLimits(
        min_delivery_window_ms=1_000,
        max_delay_horizon_ms=20_000,
        max_message_lifetime_ms=40_000,
    ),
    default_expiry_grace_ms=15_000,
    max_attempts=3,
    backoff_base_ms=100,
    backoff_max_ms=1_600,
    max_handoff_lead_ms=2_000,
    max_clock_ahead_bound_ms=2_000,
)
WINDOW_MS = CONFIG.limits.min_delivery_window_ms
HORIZON_MS = CONFIG.limits.max_delay_horizon_ms
LIFETIME_MS = CONFIG.limits.max_message_lifetime_ms
HANDOFF = k.Capability("delayed_handoff", lead_ms=500, clock_ahead_bound_ms=200)

TENANTS = ("acme", "globex")
QUEUES = ("q1", "q2")
KEYS = ("k1", "k2", "k3")
IDENTITIES: tuple[tuple[str, str, str], ...] = tuple(
    (t, q, key) for t in TENANTS for q in QUEUES for key in KEYS
)
LANES: tuple[tuple[str, str], ...] = tuple((t, q) for t in TENANTS for q in QUEUES)
MESSAGE_IDS: tuple[str, ...] = tuple(k.message_id(*ident) for ident in IDENTITIES)
DESTINATIONS = ("default", "other")


def capability_of(ident: int, flip: bool = False) -> k.Capability:
    """Each identity has a usual capability (k3 hands off), so DESTINATION_CHANGED stays rare."""
    return HANDOFF if (IDENTITIES[ident][2] == "k3") != flip else IMMEDIATE


# The fencing identities producers send under: the first identity's producer cannot be
# fenced (an idempotent producer), the others' can.
FENCES: tuple[str | None, ...] = (None, "fence-a", "fence-b")
OTHER_FENCE = "fence-elsewhere"


def fence_of(ident: int) -> str | None:
    return FENCES[ident % len(FENCES)]


def deliver_action_at_ms(message: k.Message) -> int:
    """The earliest action time deliverAt allows, restated from the seeds rather than read
    from the message's (derived, mutable) action_at_ms."""
    if message.capability.kind == "delayed_handoff":
        return message.deliver_at_ms - message.capability.lead_ms
    return message.deliver_at_ms


# Time: trusted intervals and bounds -------------------------------------------------------

EPOCH_MS = st.integers(T0_MS - 10**9, T0_MS + 10**9)
ANY_TIME_MS = st.integers(MIN_TIME_MS + 1, MAX_TIME_MS)
EDGE_OFFSETS_MS = st.sampled_from((0, -1, 1, -2, 2)) | st.integers(-10_000, 10_000)
CLOCK_ERRORS_MS = st.sampled_from((0, 1, 5, 1_000)) | st.integers(0, 50_000)


def _clamp(t_ms: int) -> int:
    """Into (MIN_TIME_MS, MAX_TIME_MS]: bounds the unbounded interval still answers PAUSE for."""
    return max(MIN_TIME_MS + 1, min(MAX_TIME_MS, t_ms))


@st.composite
def timing_bounds(draw: st.DrawFn) -> tuple[int, int]:
    """(action_at_ms, expire_at_ms), mostly near the epoch, sometimes anywhere; expireAt may
    even precede actionAt (decide must still be fail-closed)."""
    action = draw(st.one_of(EPOCH_MS, EPOCH_MS, ANY_TIME_MS))
    gap = draw(st.sampled_from((0, 1, -1, 1_000)) | st.integers(-10_000, 10**7))
    return _clamp(action), _clamp(action + gap)


@st.composite
def trusted_intervals(
    draw: st.DrawFn, action_at_ms: int | None = None, expire_at_ms: int | None = None
) -> k.TrustedInterval:
    """An interval with one end on or next to a bound (or the middle near one), the clock
    error deciding where the other end lands; sometimes the unbounded interval."""
    if draw(one_in(20)):
        return k.UNBOUNDED
    anchors = [a for a in (action_at_ms, expire_at_ms) if a is not None] or [T0_MS]
    anchor = draw(st.sampled_from(anchors)) + draw(EDGE_OFFSETS_MS)
    error = draw(CLOCK_ERRORS_MS)
    side = draw(st.sampled_from(("earliest", "latest", "middle")))
    low, high = {
        "earliest": (anchor, anchor + 2 * error),
        "latest": (anchor - 2 * error, anchor),
        "middle": (anchor - error, anchor + error),
    }[side]
    # Inside the representable range, which is what the unbounded interval spans.
    return k.TrustedInterval(_clamp(low), _clamp(high))


@st.composite
def wider_intervals(draw: st.DrawFn, narrow: k.TrustedInterval) -> k.TrustedInterval:
    """An interval containing `narrow`: earliest moved down and/or latest moved up."""
    if draw(one_in(10)):
        return k.UNBOUNDED
    grow = st.sampled_from((0, 0, 1)) | st.integers(0, 10**7)
    return k.TrustedInterval(narrow.earliest_ms - draw(grow), narrow.latest_ms + draw(grow))


@st.composite
def timing_limits(draw: st.DrawFn) -> k.TimingLimits:
    window = draw(st.sampled_from((0, 1, 1_000)) | st.integers(0, 10**6))
    horizon = draw(st.sampled_from((0, 1, 90 * 86_400_000)) | st.integers(0, 10**9))
    # TimingLimits refuses a lifetime that cannot fit a timer scheduled at the horizon.
    lifetime = horizon + window + draw(st.sampled_from((0, 1)) | st.integers(0, 10**9))
    return k.TimingLimits(window, horizon, lifetime)


@st.composite
def timing_cases(draw: st.DrawFn) -> tuple[int, int, int, k.TimingLimits]:
    """(bp_ms, deliver_at_ms, expire_at_ms, limits) with deliverAt and expireAt on or next
    to the V1 edges: bp, bp + horizon, max(deliverAt, bp) + window, bp + lifetime."""
    limits = draw(timing_limits())
    bp = draw(EPOCH_MS)
    deliver = draw(st.sampled_from((bp, bp + limits.max_delay_horizon_ms, bp - 5_000)))
    deliver += draw(EDGE_OFFSETS_MS)
    expire = draw(
        st.sampled_from(
            (
                max(deliver, bp) + limits.min_delivery_window_ms,
                bp + limits.max_message_lifetime_ms,
                deliver,
                bp,
            )
        )
    )
    expire += draw(EDGE_OFFSETS_MS)
    return bp, deliver, expire, limits


# Abstract log actions ---------------------------------------------------------------------

AtKind = Literal[
    "same",
    "plus",
    "action_at",
    "before_action_at",
    "deliver_at",
    "expire_before",
    "expire_at",
    "regress",
]


@dataclass(frozen=True)
class At:
    """When the entry is persisted. Boundary kinds read identity `ident`'s current message;
    time never moves backwards except for `regress`, which does not move the clock."""

    kind: AtKind = "same"
    ident: int | None = None  # None: the identity the action itself is about
    delta_ms: int = 0


class Timing(NamedTuple):
    deliver_at_ms: int | None
    delay_ms: int | None
    expire_at_ms: int | None
    lifetime_ms: int | None


DeliverKind = Literal["delay", "absolute", "both", "neither"]
ExpireKind = Literal["default", "tight", "absolute", "lifetime", "both"]


@dataclass(frozen=True)
class TimingSpec:
    """How a command states its timing. deliver: `delay` (relative), `absolute` (bp +
    deliver_ms), `both`/`neither` (invalid). expire: `default`, `tight` (expireAt =
    max(deliverAt, bp) + window + expire_ms, so 0 is deliverAt = expireAt - window and -1 is
    one short), `absolute` (bp + expire_ms), `lifetime`, `both` (invalid)."""

    deliver: DeliverKind = "delay"
    deliver_ms: int = 1_000
    expire: ExpireKind = "default"
    expire_ms: int = 0

    def resolve(self, bp_ms: int) -> Timing:
        deliver_at = delay = expire_at = lifetime = None
        if self.deliver in ("delay", "both"):
            delay = self.deliver_ms
        if self.deliver in ("absolute", "both"):
            deliver_at = bp_ms + self.deliver_ms
        effective_deliver = bp_ms + self.deliver_ms
        if self.expire == "tight":
            expire_at = max(effective_deliver, bp_ms) + WINDOW_MS + self.expire_ms
        elif self.expire == "absolute":
            expire_at = bp_ms + self.expire_ms
        elif self.expire == "lifetime":
            lifetime = self.expire_ms
        elif self.expire == "both":
            expire_at, lifetime = bp_ms + LIFETIME_MS, LIFETIME_MS
        return Timing(deliver_at, delay, expire_at, lifetime)


Expected = Literal["none", "current", "stale"]
Broken = Literal[
    "empty_key", "slash_queue", "bad_digest", "negative_size",
    "too_large", "reserved_header", "bad_capability", "long_txn",
]  # fmt: skip
EndKind = Literal["bp", "action_at", "action_before", "expire_at", "expire_before", "unbounded"]


@dataclass(frozen=True)
class IntervalSpec:
    """A trusted interval relative to the entry's bp and the message's bounds: `bp` ends are
    bp -/+ error_ms; the others sit exactly on (or one before) actionAt or expireAt."""

    earliest: EndKind = "bp"
    latest: EndKind = "bp"
    error_ms: int = 0


@dataclass(frozen=True)
class DoSchedule:
    at: At
    ident: int
    timing: TimingSpec = field(default_factory=TimingSpec)
    txn: int = 0
    content: int = 0
    destination: int = 0
    flip_capability: bool = False
    expected: Expected = "none"
    broken: Broken | None = None


@dataclass(frozen=True)
class DoRetry:
    """Resend the identity's last valid Schedule record verbatim (a client retry)."""

    at: At
    ident: int


@dataclass(frozen=True)
class DoReschedule:
    at: At
    ident: int
    timing: TimingSpec = field(default_factory=TimingSpec)
    txn: int = 0
    expected: Expected = "none"
    raw: bool = False


@dataclass(frozen=True)
class DoCancel:
    at: At
    ident: int
    expected: Expected = "none"
    with_txn: bool = False
    raw: bool = False


@dataclass(frozen=True)
class DoClaim:
    """A worker claims the identity's current generation once its clock says it is due
    (actionAt + clock error, or now if later): an Admission is prepared from the state as it
    is now, with the interval of that moment, and kept for a later `DoAdmit(source=
    "claimed")`, whose persistence time may then be well after (log lag: after expireAt) or
    before (a worker clock ahead of the log's: before actionAt) that moment. Logs nothing."""

    ident: int
    interval: IntervalSpec = field(default_factory=IntervalSpec)
    raw: bool = False


# `worker` is a well-behaved worker: it proposes once its clock proves actionAt, so its
# Admission is persisted at actionAt + clock error, with the interval around that time (or,
# if that interval proves expireAt passed, it proposes the expiry instead).
# `current` uses the drawn time and interval as they come (often on or across a bound).
AdmitSource = Literal[
    "worker",
    "current",
    "claimed",
    "duplicate",
    "bad_attempt_id",
    "wrong_capability",
    "stale_version",
]


@dataclass(frozen=True)
class DoAdmit:
    at: At
    ident: int
    source: AdmitSource = "current"
    interval: IntervalSpec = field(default_factory=IntervalSpec)
    granted: bool = True
    raw: bool = False


# "proven_absent": NOT_PUBLISHED with a proof under the attempt's own fence (or under some
# fence, for an unfenced attempt); "proven_elsewhere": with a proof under another fence.
ResultKind = Literal[
    "published",
    "retriable",
    "permanent",
    "lane_unavailable",
    "unknown",
    "proven_absent",
    "proven_elsewhere",
]
OutcomeVariant = Literal["exact", "wrong_generation", "no_such_attempt"]


@dataclass(frozen=True)
class DoOutcome:
    """An outcome for the `pick`-th admitted attempt (among the open ones if `open_only`)."""

    at: At
    pick: int
    result: ResultKind
    open_only: bool = True
    variant: OutcomeVariant = "exact"


@dataclass(frozen=True)
class DoClaimResult:
    at: At
    ident: int
    stale: bool = False
    raw: bool = False


@dataclass(frozen=True)
class DoExpire:
    at: At
    ident: int
    interval: IntervalSpec = field(default_factory=IntervalSpec)
    stale: bool = False
    raw: bool = False


@dataclass(frozen=True)
class DoGate:
    at: At
    lane: int
    gate: Literal["OPEN", "CLOSED"]


@dataclass(frozen=True)
class DoShard:
    at: At
    state: ShardStatus


CopyVariant = Literal["owed", "current", "later_generation"]


@dataclass(frozen=True)
class DoCopyWritten:
    """The runtime's report that a dead-letter copy is written: `owed` names the `pick`-th
    copy still owed (any identity's, a superseded generation's too), else an identity's
    current generation (a copy already recorded: a duplicate of an at-least-once write; or
    never owed), or a generation not made yet. Persisted in any shard state."""

    at: At
    pick: int
    variant: CopyVariant = "owed"


@dataclass(frozen=True)
class DoBadPosition:
    """A misplaced entry (duplicate or gap) carrying a FROZEN shard change: it must be
    refused without consuming the position or freezing anything."""

    at: At
    offset: int


# Actions that need a timer to act on. Their `ident` indexes the identities that have one
# (those with timeline work first, where only those can win) unless `raw`, which takes it as is.
Targeted = DoReschedule | DoCancel | DoClaim | DoAdmit | DoClaimResult | DoExpire
Action = (
    DoSchedule | DoRetry | DoReschedule | DoCancel | DoClaim | DoAdmit | DoOutcome
    | DoClaimResult | DoExpire | DoGate | DoShard | DoBadPosition | DoCopyWritten
)  # fmt: skip

# Action strategies ------------------------------------------------------------------------

T = TypeVar("T")


def weighted(*choices: tuple[T, int]) -> st.SearchStrategy[T]:
    """sampled_from with repeats; shrinks towards the first choice."""
    return st.sampled_from([value for value, weight in choices for _ in range(weight)])


def one_in(n: int) -> st.SearchStrategy[bool]:
    """True one time in n (st.integers is biased towards small values, so not that)."""
    return weighted((False, n - 1), (True, 1))


def mix(*choices: tuple[st.SearchStrategy[T], int]) -> st.SearchStrategy[T]:
    """one_of with weights (one_of itself drops repeated strategies); shrinks towards the
    first strategy."""
    pool = weighted(*choices)

    @st.composite
    def one(draw: st.DrawFn) -> T:
        return draw(draw(pool))

    return one()


# Skewed so that one history keeps returning to the same few timers (12 is already small, but
# a 20-step history spread evenly over 12 identities rarely gets past the first schedule).
idents: st.SearchStrategy[int] = weighted(*((i, max(1, 8 - 2 * i)) for i in range(len(IDENTITIES))))
expecteds: st.SearchStrategy[Expected] = weighted(("none", 8), ("current", 2), ("stale", 1))
# Commands and most mutations move time a little; the jumps to expireAt belong mostly to
# expiries (and a few Admissions), or every history would expire its timers at once.
at_kinds: st.SearchStrategy[AtKind] = weighted(
    ("same", 10), ("plus", 6), ("action_at", 4), ("before_action_at", 2), ("deliver_at", 2),
    ("regress", 1),
)  # fmt: skip
admit_at_kinds: st.SearchStrategy[AtKind] = weighted(
    ("action_at", 8), ("same", 3), ("plus", 3), ("before_action_at", 1), ("deliver_at", 1),
    ("expire_before", 1), ("expire_at", 1),
)  # fmt: skip
expire_at_kinds: st.SearchStrategy[AtKind] = weighted(
    ("expire_at", 4), ("expire_before", 2), ("same", 2), ("plus", 2), ("regress", 1)
)


ONE_IN_4 = one_in(4)
deltas_ms = st.sampled_from((1, CONFIG.backoff_base_ms, WINDOW_MS)) | st.integers(0, 3_000)


@st.composite
def at_steps(draw: st.DrawFn, kinds: st.SearchStrategy[AtKind] = at_kinds) -> At:
    """Boundary kinds usually look at the action's own identity (None), sometimes at another's."""
    kind = draw(kinds)
    ident = draw(idents) if draw(ONE_IN_4) else None
    return At(kind, ident, draw(deltas_ms) if kind in ("plus", "regress") else 0)


ats = at_steps()
deliver_kinds: st.SearchStrategy[DeliverKind] = weighted(
    ("delay", 8), ("absolute", 5), ("both", 1), ("neither", 1)
)
expire_kinds: st.SearchStrategy[ExpireKind] = weighted(
    ("default", 6), ("tight", 5), ("absolute", 2), ("lifetime", 2), ("both", 1)
)
deliver_ms = st.sampled_from(
    (0, 1, WINDOW_MS, HORIZON_MS, HORIZON_MS + 1, -1, -WINDOW_MS)
) | st.integers(0, HORIZON_MS)
expire_ms = {
    "tight": st.sampled_from((0, 0, -1, 1)) | st.integers(0, 5_000),
    "absolute": st.sampled_from((LIFETIME_MS, LIFETIME_MS + 1, WINDOW_MS))
    | st.integers(0, LIFETIME_MS + 1_000),
    "lifetime": st.sampled_from((LIFETIME_MS, LIFETIME_MS + 1, WINDOW_MS, WINDOW_MS - 1, -1))
    | st.integers(0, LIFETIME_MS),
}


@st.composite
def timing_specs(draw: st.DrawFn) -> TimingSpec:
    deliver = draw(deliver_kinds)
    expire = draw(expire_kinds)
    extra = draw(expire_ms[expire]) if expire in expire_ms else 0
    return TimingSpec(deliver, draw(deliver_ms), expire, extra)


broken: st.SearchStrategy[Broken | None] = st.sampled_from((None,) * 40 + get_args(Broken))
interval_specs = st.builds(
    IntervalSpec,
    weighted(
        ("bp", 10), ("action_at", 1), ("action_before", 1),
        ("expire_at", 1), ("expire_before", 1), ("unbounded", 1),
    ),
    weighted(("bp", 10), ("expire_before", 1), ("expire_at", 1), ("unbounded", 1)),
    mix((st.just(0), 4), (st.sampled_from((1, 5)), 1), (st.integers(0, 2_000), 1)),
)  # fmt: skip
schedules = st.builds(
    DoSchedule,
    ats,
    idents,
    timing_specs(),
    st.integers(0, 9),
    st.integers(0, 1),
    weighted((0, 4), (1, 1)),
    one_in(10),
    expecteds,
    broken,
)
admissions = st.builds(
    DoAdmit,
    at_steps(admit_at_kinds),
    idents,
    weighted(
        ("worker", 6), ("current", 4), ("claimed", 3), ("duplicate", 1),
        ("bad_attempt_id", 1), ("wrong_capability", 1), ("stale_version", 1),
    ),
    interval_specs,
    one_in(16).map(lambda bad: not bad),
    one_in(6),
)  # fmt: skip
outcomes = st.builds(
    DoOutcome,
    ats,
    st.integers(0, 50),
    st.sampled_from(get_args(ResultKind)),
    one_in(4).map(lambda any_attempt: not any_attempt),
    weighted(("exact", 8), ("wrong_generation", 1), ("no_such_attempt", 1)),
)
shard_statuses: st.SearchStrategy[ShardStatus] = weighted(
    ("ACTIVE_FOR_COMMANDS", 6), ("PAUSED", 1), ("FROZEN", 1)
)
actions: st.SearchStrategy[Action] = mix(
    (schedules, 6),
    (st.builds(DoRetry, ats, idents), 2),
    (
        st.builds(
            DoReschedule, ats, idents, timing_specs(), st.integers(0, 9), expecteds, one_in(6)
        ),
        3,
    ),
    (st.builds(DoCancel, ats, idents, expecteds, st.booleans(), one_in(6)), 3),
    (st.builds(DoClaim, idents, interval_specs, one_in(6)), 3),
    (admissions, 12),
    (outcomes, 10),
    (st.builds(DoClaimResult, at_steps(admit_at_kinds), idents, one_in(6), one_in(6)), 1),
    (
        st.builds(
            DoExpire, at_steps(expire_at_kinds), idents, interval_specs, one_in(6), one_in(6)
        ),
        3,
    ),
    (
        st.builds(
            DoGate, ats, st.integers(0, len(LANES) - 1), weighted(("OPEN", 1), ("CLOSED", 1))
        ),
        1,
    ),
    (st.builds(DoShard, ats, shard_statuses), 1),
    (st.builds(DoBadPosition, ats, st.sampled_from((-1, 1, 2))), 1),
    (
        st.builds(
            DoCopyWritten,
            ats,
            st.integers(0, 20),
            weighted(("owed", 6), ("current", 3), ("later_generation", 1)),
        ),
        3,
    ),
)


# A few plain valid schedules open every history, so the mutations have timers to act on.
opening_schedules = st.lists(
    st.builds(
        DoSchedule,
        ats,
        idents,
        st.builds(
            TimingSpec,
            st.just("delay"),
            st.integers(0, 5_000),
            weighted(("default", 1), ("tight", 1)),
            st.just(0),
        ),
        st.integers(0, 2),
        st.integers(0, 1),
    ),
    min_size=1,
    max_size=4,
)


def _focus(action: Action, spread: int) -> Action:
    """The same action with its identities folded into the first `spread` ones."""
    if isinstance(action, DoGate | DoShard | DoBadPosition | DoOutcome | DoCopyWritten):
        return action
    if isinstance(action, DoClaim):
        return replace(action, ident=action.ident % spread)
    at = (
        action.at if action.at.ident is None else replace(action.at, ident=action.at.ident % spread)
    )
    return replace(action, ident=action.ident % spread, at=at)


@st.composite
def action_lists(draw: st.DrawFn, max_size: int = 40) -> list[Action]:
    """Abstract log actions after a few opening schedules. The length is drawn uniformly
    (st.lists averages only ~6 elements, too few for admissions and outcomes to pile up)
    and shrinks towards zero; each action's kind is weighted and shrinks towards a schedule.
    Half the histories fold all identities into one or two, so single timers live long
    enough to reach the deep states (uncertain retries, late outcomes, dead letters)."""
    spread = draw(weighted((len(IDENTITIES), 2), (1, 1), (2, 1)))
    opening = draw(opening_schedules)
    size = draw(st.sampled_from(range(max_size + 1)))
    return [_focus(a, spread) for a in [*opening, *(draw(actions) for _ in range(size))]]


# The driver -------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepRecord:
    action: Action | None
    entry: k.LogEntry
    before: k.State
    after: k.State
    effects: tuple[Effect, ...]

    @property
    def outcome(self) -> EntryOutcome:
        first = self.effects[0]
        assert isinstance(first, EntryOutcome)
        return first

    @property
    def publishes(self) -> list[Publish]:
        return [e for e in self.effects if isinstance(e, Publish)]


def resolve_interval(
    spec: IntervalSpec, bp_ms: int, message: k.Message | None
) -> k.TrustedInterval:
    action = message.action_at_ms if message else bp_ms
    expire = message.expire_at_ms if message else bp_ms
    ends = {
        "bp": None,
        "action_at": action,
        "action_before": action - 1,
        "expire_at": expire,
        "expire_before": expire - 1,
    }
    earliest = ends.get(spec.earliest) if spec.earliest != "unbounded" else MIN_TIME_MS
    latest = ends.get(spec.latest) if spec.latest != "unbounded" else MAX_TIME_MS
    earliest = bp_ms - spec.error_ms if earliest is None else earliest
    latest = bp_ms + spec.error_ms if latest is None else latest
    return k.TrustedInterval(min(earliest, latest), max(earliest, latest))


class Driver:
    """Interprets actions against the folded state; keeps every step for the properties."""

    def __init__(self, config: k.KernelConfig = CONFIG, *, check_invariants: bool = True) -> None:
        self.config = config
        self.check_invariants = check_invariants
        self.state = k.State.initial(config)
        self.now_ms = T0_MS
        self.steps: list[StepRecord] = []
        self.last_schedule: dict[int, k.Schedule] = {}
        self.claims: dict[int, k.PublishAdmission] = {}
        self.admitted: list[str] = []  # attempt ids that won Admission, in log order
        self._seq = 0

    @property
    def entries(self) -> list[k.LogEntry]:
        return [s.entry for s in self.steps]

    def message(self, ident: int) -> k.Message | None:
        return self.state.message(MESSAGE_IDS[ident].encode())

    def run(self, actions: Iterable[Action]) -> Driver:
        for action in actions:
            self.apply(action)
        return self

    def target(self, action: Action) -> int:
        ident = getattr(action, "ident", 0)
        assert isinstance(ident, int)
        if not isinstance(action, Targeted) or action.raw:
            return ident
        present = [i for i in range(len(IDENTITIES)) if self.message(i) is not None]
        if isinstance(action, DoClaim | DoAdmit | DoClaimResult | DoExpire):
            # Timers with timeline work: SCHEDULED, or UNCERTAIN with a retry armed.
            armed = [i for i in present if self._has_work(i)]
            present = armed or present
        return present[ident % len(present)] if present else ident

    def _has_work(self, ident: int) -> bool:
        message = self.message(ident)
        return message is not None and message.has_work

    def apply(self, action: Action) -> StepRecord | None:
        ident = self.target(action)
        if isinstance(action, DoClaim):
            self._claim(action, ident)
            return None
        # A worker whose clock error is e first sees actionAt arrive at actionAt + e, so
        # that is where "at actionAt" puts its Admission (exactly actionAt when e is 0).
        lead_ms = 0
        if isinstance(action, DoAdmit) and action.interval.earliest == "bp":
            lead_ms = action.interval.error_ms
        at = action.at
        if isinstance(action, DoAdmit) and action.source == "worker":
            at = At("action_at", None)
            action = replace(action, interval=replace(action.interval, earliest="bp", latest="bp"))
            lead_ms = action.interval.error_ms
        bp_ms = self._persist_time(at, ident, lead_ms)
        position = self.state.meta.position + 1
        record = self._record(action, ident, bp_ms)
        if isinstance(action, DoBadPosition):
            position += action.offset
        return self.append(record, at_ms=bp_ms, position=position, action=action)

    def append(
        self,
        record: k.Record,
        *,
        at_ms: int | None = None,
        position: int | None = None,
        action: Action | None = None,
    ) -> StepRecord:
        """Reduce one concrete record (directed tests use this directly)."""
        bp_ms = self.now_ms if at_ms is None else at_ms
        self.now_ms = max(self.now_ms, bp_ms)
        entry = k.LogEntry(
            self.state.meta.position + 1 if position is None else position, bp_ms, record
        )
        before = self.state
        self.state, effects = k.reduce(before, entry)
        if self.check_invariants:
            k.assert_invariants(self.state)
        step = StepRecord(action, entry, before, self.state, effects)
        self.steps.append(step)
        if step.outcome.code is k.Code.ADMITTED and step.outcome.attempt_id is not None:
            self.admitted.append(step.outcome.attempt_id)
        return step

    # Interpretation ------------------------------------------------------------------------

    def _persist_time(self, at: At, own_ident: int, lead_ms: int = 0) -> int:
        if at.kind == "regress":
            return self.now_ms - 1 - at.delta_ms
        target = self.now_ms
        message = self.message(own_ident if at.ident is None else at.ident)
        if at.kind == "plus":
            target = self.now_ms + at.delta_ms
        elif message is not None and at.kind != "same":
            target = {
                "action_at": message.action_at_ms + lead_ms,
                "before_action_at": message.action_at_ms - 1,
                "deliver_at": message.deliver_at_ms,
                "expire_before": message.expire_at_ms - 1,
                "expire_at": message.expire_at_ms,
            }[at.kind]
        self.now_ms = max(self.now_ms, target)
        return self.now_ms

    def _expected(self, expected: Expected, ident: int) -> int | None:
        if expected == "none":
            return None
        message = self.message(ident)
        current = message.version if message else 0
        return current if expected == "current" else current + 1

    def _record(self, action: Action, ident: int, bp_ms: int) -> k.Record:
        match action:
            case DoSchedule():
                return self._schedule(action, bp_ms)
            case DoRetry():
                if ident not in self.last_schedule:
                    return self._schedule(DoSchedule(At(), ident), bp_ms)
                return self.last_schedule[ident]
            case DoReschedule():
                tenant, queue, key = IDENTITIES[ident]
                t = action.timing.resolve(bp_ms)
                return k.Reschedule(
                    tenant,
                    queue,
                    key,
                    f"txn-r{action.txn}",
                    deliver_at_ms=t.deliver_at_ms,
                    delay_ms=t.delay_ms,
                    expire_at_ms=t.expire_at_ms,
                    lifetime_ms=t.lifetime_ms,
                    expected_version=self._expected(action.expected, ident),
                )
            case DoCancel():
                tenant, queue, key = IDENTITIES[ident]
                txn = "txn-cancel" if action.with_txn else None
                return k.Cancel(tenant, queue, key, self._expected(action.expected, ident), txn)
            case DoAdmit():
                return self._admission(action, ident, bp_ms)
            case DoOutcome():
                return self._outcome(action, bp_ms)
            case DoClaimResult():
                message = self.message(ident)
                generation, version = (message.generation, message.version) if message else (1, 1)
                return k.ClaimResult(
                    MESSAGE_IDS[ident],
                    generation,
                    version + (1 if action.stale else 0),
                    f"claim-{ident}",
                    "payload_missing",
                )
            case DoExpire():
                message = self.message(ident)
                generation, version = (message.generation, message.version) if message else (1, 1)
                return k.Expire(
                    MESSAGE_IDS[ident],
                    generation,
                    version + (1 if action.stale else 0),
                    resolve_interval(action.interval, bp_ms, message),
                )
            case DoGate(lane=lane, gate=gate):
                return k.LaneGate(*LANES[lane], gate)
            case DoShard(state=state):
                return k.ShardState(state)
            case DoBadPosition():
                return k.ShardState("FROZEN", reason="misplaced")
            case DoCopyWritten():
                return self._copy_written(action, bp_ms)
            case DoClaim():
                raise AssertionError("claims log nothing")

    def _schedule(self, a: DoSchedule, bp_ms: int) -> k.Schedule:
        tenant, queue, key = IDENTITIES[a.ident]
        t = a.timing.resolve(bp_ms)
        txn = f"txn-{a.txn}"
        digest, size = (DIGEST, 7) if a.content == 0 else (OTHER_DIGEST, 13)
        headers: tuple[tuple[str, str], ...] = ()
        capability = capability_of(a.ident, a.flip_capability)
        match a.broken:
            case "empty_key":
                key = ""
            case "slash_queue":
                queue = "q/1"
            case "bad_digest":
                digest = "not-a-digest"
            case "negative_size":
                size = -1
            case "too_large":
                size = self.config.max_payload_bytes + 1
            case "reserved_header":
                headers = (("nereus-attempt-id", "forged"),)
            case "bad_capability":
                capability = k.Capability("immediate", lead_ms=5)
            case "long_txn":
                txn = "t" * (self.config.max_txn_bytes + 1)
            case None:
                pass
        record = k.Schedule(
            tenant,
            queue,
            key,
            txn,
            digest,
            size,
            deliver_at_ms=t.deliver_at_ms,
            delay_ms=t.delay_ms,
            expire_at_ms=t.expire_at_ms,
            lifetime_ms=t.lifetime_ms,
            headers=headers,
            destination=DESTINATIONS[a.destination],
            capability=capability,
            expected_version=self._expected(a.expected, a.ident),
        )
        if a.broken is None:
            self.last_schedule[a.ident] = record
        return record

    def fresh_admission(
        self, ident: int, interval: k.TrustedInterval, *, granted: bool = True
    ) -> k.PublishAdmission:
        """What a worker that claimed the current generation right now would propose."""
        message = self.message(ident)
        mid = MESSAGE_IDS[ident]
        generation, version = (message.generation, message.version) if message else (1, 1)
        self._seq += 1
        return k.PublishAdmission(
            message_id=mid,
            generation=generation,
            version=version,
            attempt_id=f"{k.attempt_prefix(mid, generation)}{self._seq}",
            claim_id=f"claim-{self._seq}",
            owner="node-a",
            descriptor_hash=f"desc-{ident}-{generation}",
            capability=message.capability if message else capability_of(ident),
            interval=interval,
            capacity=k.Capacity(granted),
            fence_id=fence_of(ident),
        )

    def _claim(self, a: DoClaim, ident: int) -> None:
        message = self.message(ident)
        if message is not None:
            due_ms = max(self.now_ms, message.action_at_ms + a.interval.error_ms)
            interval = resolve_interval(a.interval, due_ms, message)
            self.claims[ident] = self.fresh_admission(ident, interval)

    def _admission(self, a: DoAdmit, ident: int, bp_ms: int) -> k.PublishAdmission | k.Expire:
        if a.source == "claimed" and ident in self.claims:
            return self.claims[ident]
        message = self.message(ident)
        interval = resolve_interval(a.interval, bp_ms, message)
        if (
            a.source == "worker"
            and message is not None
            and k.decide(interval, message.action_at_ms, message.expire_at_ms) is k.Decision.EXPIRE
        ):
            # A worker that finds the timer past expireAt proposes its expiry instead.
            return k.Expire(message.message_id, message.generation, message.version, interval)
        record = self.fresh_admission(ident, interval, granted=a.granted)
        if message is None:
            return record
        replace = msgspec.structs.replace
        match a.source:
            case "duplicate":
                mine = [x for x in self.admitted if x.startswith(message.message_id)]
                if mine or self.admitted:
                    record = replace(record, attempt_id=(mine or self.admitted)[-1])
            case "bad_attempt_id":
                wrong = k.attempt_prefix(message.message_id, message.generation + 1)
                record = replace(record, attempt_id=f"{wrong}{self._seq}")
            case "wrong_capability":
                other = IMMEDIATE if message.capability != IMMEDIATE else HANDOFF
                record = replace(record, capability=other)
            case "stale_version":
                record = replace(record, version=message.version - 1)
            case "worker" | "current" | "claimed":
                pass
        return record

    def _outcome(self, a: DoOutcome, bp_ms: int) -> k.PublishOutcome:
        result: k.Published | k.NotPublished | k.Unknown
        match a.result:
            case "published":
                evidence = k.Evidence("default", 0, self.state.meta.position + 1, bp_ms)
                result = k.Published(evidence)
            case "retriable":
                result = k.NotPublished("retriable", "broker_down")
            case "permanent":
                result = k.NotPublished("permanent", "record_too_large")
            case "lane_unavailable":
                result = k.NotPublished("lane_unavailable", "lane_closed")
            case "unknown":
                result = k.Unknown("timeout")
            case "proven_absent" | "proven_elsewhere":
                result = k.NotPublished("retriable", "absent_after_fence")  # proof set below
        pool = self.admitted
        if a.open_only:
            pool = [x for x in pool if self._attempt_open(x)] or pool
        if not pool or a.variant == "no_such_attempt":
            mid = MESSAGE_IDS[a.pick % len(MESSAGE_IDS)]
            return k.PublishOutcome(f"{k.attempt_prefix(mid, 1)}missing", mid, 1, result)
        attempt_id = pool[a.pick % len(pool)]
        attempt = self.state.attempt(attempt_id.encode())
        assert attempt is not None
        if a.result in ("proven_absent", "proven_elsewhere"):
            fence = OTHER_FENCE if a.result == "proven_elsewhere" else attempt.fence_id or "fence-a"
            proof = k.AbsenceProof(fence, bp_ms, "everything read")
            result = msgspec.structs.replace(result, proof=proof)
        generation = attempt.generation + (1 if a.variant == "wrong_generation" else 0)
        return k.PublishOutcome(attempt_id, attempt.message_id, generation, result)

    def _copy_written(self, a: DoCopyWritten, bp_ms: int) -> k.DeadLetterWritten:
        evidence = k.Evidence("default.dlq", 0, self.state.meta.position + 1, bp_ms)
        owed = [v for _, v in self.state.items(k.Table.DEAD_LETTERS)]
        if a.variant == "owed" and owed:
            pending = owed[a.pick % len(owed)]
            assert isinstance(pending, k.DeadLetterPending)
            return k.DeadLetterWritten(pending.message_id, pending.generation, evidence)
        present = [i for i in range(len(IDENTITIES)) if self.message(i) is not None]
        ident = present[a.pick % len(present)] if present else a.pick % len(IDENTITIES)
        message = self.message(ident)
        generation = message.generation if message else 1
        if a.variant == "later_generation":
            generation += 1
        return k.DeadLetterWritten(MESSAGE_IDS[ident], generation, evidence)

    def _attempt_open(self, attempt_id: str) -> bool:
        attempt = self.state.attempt(attempt_id.encode())
        return attempt is not None and attempt.status in OPEN_ATTEMPT_STATUSES


def drive(actions: Iterable[Action], *, check_invariants: bool = True) -> Driver:
    """Fold an action list from the initial state."""
    return Driver(check_invariants=check_invariants).run(actions)
