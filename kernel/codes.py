"""The closed list of outcome codes.

Theory of operation: every log entry the reducer sees ends in exactly one outcome (a batch
record, one per item), and the outcome carries exactly one code from this module. A code is
either *applied* (the entry changed state, or deliberately changed nothing, as `unchanged`
does) or *rejected* (the entry was consumed at its position but changed nothing except the
position and counters). Clients switch on these strings, so the list is closed: adding a
code is a protocol change and is recorded in `specs/codes.md`, which is generated from
`CODE_DOCS` below.
"""

from __future__ import annotations

from enum import StrEnum


class Code(StrEnum):
    # Applied: client command verdicts (the HTTP status taxonomy uses the first four).
    SCHEDULED = "scheduled"
    RESCHEDULED = "rescheduled"
    UNCHANGED = "unchanged"
    CANCELED = "canceled"
    # Applied: system mutations.
    ADMITTED = "admitted"
    OUTCOME_RECORDED = "outcome_recorded"
    CLAIM_RESULT_RECORDED = "claim_result_recorded"
    DEAD_LETTER_RECORDED = "dead_letter_recorded"
    EXPIRED = "expired"
    RETRY_WINDOW_CLOSED = "retry_window_closed"
    GATE_CHANGED = "gate_changed"
    SHARD_STATE_CHANGED = "shard_state_changed"

    # Rejected: verdicts a client must handle (HTTP `ok: false` statuses).
    TOO_LATE = "too_late"
    ABSENT = "absent"
    TXN_REUSED = "txn_reused"

    # Rejected: log structure. These do not consume the position.
    POSITION_DUPLICATE = "position_duplicate"
    POSITION_GAP = "position_gap"
    # Rejected: consumes the position.
    PERSISTED_AT_REGRESSED = "persisted_at_regressed"
    PERSISTED_AT_OUT_OF_RANGE = "persisted_at_out_of_range"

    # Rejected: command validation, in the order they are checked.
    SHARD_NOT_ACTIVE = "shard_not_active"
    INVALID_IDENTITY = "invalid_identity"
    INVALID_TXN = "invalid_txn"
    INVALID_PAYLOAD_REF = "invalid_payload_ref"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    INVALID_HEADERS = "invalid_headers"
    INVALID_CAPABILITY = "invalid_capability"
    INVALID_TIMING = "invalid_timing"
    HORIZON_EXCEEDED = "horizon_exceeded"
    LIFETIME_EXCEEDED = "lifetime_exceeded"
    EXPIRE_BEFORE_WINDOW = "expire_before_window"
    VERSION_MISMATCH = "version_mismatch"
    DESTINATION_CHANGED = "destination_changed"

    # Rejected: Publish Admission that does not qualify (never yields a publish effect).
    ADMISSION_BAD_ATTEMPT_ID = "admission_bad_attempt_id"
    ADMISSION_DUPLICATE_ATTEMPT = "admission_duplicate_attempt"
    ADMISSION_STALE = "admission_stale"
    ADMISSION_LANE_CLOSED = "admission_lane_closed"
    ADMISSION_CAPABILITY_MISMATCH = "admission_capability_mismatch"
    ADMISSION_EVIDENCE_INVALID = "admission_evidence_invalid"
    ADMISSION_BEFORE_ACTION_TIME = "admission_before_action_time"
    ADMISSION_AFTER_EXPIRE = "admission_after_expire"

    # Rejected: outcomes that cannot be recorded.
    OUTCOME_UNKNOWN_ATTEMPT = "outcome_unknown_attempt"
    OUTCOME_MISMATCH = "outcome_mismatch"
    OUTCOME_ALREADY_RECORDED = "outcome_already_recorded"
    OUTCOME_ABSENCE_NOT_EVIDENCE = "outcome_absence_not_evidence"
    OUTCOME_PROOF_INVALID = "outcome_proof_invalid"

    # Rejected: claim results and expiry.
    CLAIM_RESULT_STALE = "claim_result_stale"
    EXPIRE_STALE = "expire_stale"
    EXPIRE_PREMATURE = "expire_premature"
    EXPIRE_EVIDENCE_INVALID = "expire_evidence_invalid"

    # Rejected: dead-letter copies.
    DEAD_LETTER_NOT_PENDING = "dead_letter_not_pending"

    # Deprecated alias (same member): the horizon code's name before the library, HTTP and
    # Kafka answers shared one list, which took the HTTP API's name.
    DELIVER_BEYOND_HORIZON = "horizon_exceeded"

    @classmethod
    def _missing_(cls, value: object) -> Code | None:
        # An outcome encoded by a process of an earlier build (a Kafka reply during a
        # rolling upgrade) still decodes, to the code it meant.
        return cls.HORIZON_EXCEEDED if value == "deliver_beyond_horizon" else None


APPLIED_CODES: frozenset[Code] = frozenset(
    {
        Code.SCHEDULED,
        Code.RESCHEDULED,
        Code.UNCHANGED,
        Code.CANCELED,
        Code.ADMITTED,
        Code.OUTCOME_RECORDED,
        Code.CLAIM_RESULT_RECORDED,
        Code.DEAD_LETTER_RECORDED,
        Code.EXPIRED,
        Code.RETRY_WINDOW_CLOSED,
        Code.GATE_CHANGED,
        Code.SHARD_STATE_CHANGED,
    }
)

# Rejections that leave the shard position where it was: the entry is not part of the log.
POSITION_CODES: frozenset[Code] = frozenset({Code.POSITION_DUPLICATE, Code.POSITION_GAP})

CODE_DOCS: dict[Code, str] = {
    Code.SCHEDULED: "A new generation was created for an absent or finished timer.",
    Code.RESCHEDULED: "A pending timer was superseded by a new generation.",
    Code.UNCHANGED: "An identical retry of the current generation's schedule; nothing changed.",
    Code.CANCELED: "A pending timer was canceled before any Publish Admission.",
    Code.ADMITTED: "Publish Admission won: the attempt is PUBLISHING and the send may start.",
    Code.OUTCOME_RECORDED: "A publish outcome was recorded against its attempt.",
    Code.CLAIM_RESULT_RECORDED: "A proven permanent pre-send error spent one attempt.",
    Code.DEAD_LETTER_RECORDED: "A dead-lettered generation's copy is in the dead-letter queue; "
    "the owed copy is closed with its evidence.",
    Code.EXPIRED: "The timer expired: the mutation's persistence time proves expireAt passed.",
    Code.RETRY_WINDOW_CLOSED: "expireAt passed for an UNCERTAIN timer: no more retries.",
    Code.GATE_CHANGED: "A lane admission gate was opened or closed.",
    Code.SHARD_STATE_CHANGED: "The shard state was changed by an operator.",
    Code.TOO_LATE: "The current generation crossed Publish Admission; the answer carries evidence.",
    Code.ABSENT: "No pending timer under this identity (never scheduled, or already finished).",
    Code.TXN_REUSED: "A new generation must carry a new txn: this command changes the timer but "
    "repeats the txn of its current generation.",
    Code.POSITION_DUPLICATE: "The entry's position is at or below the applied position.",
    Code.POSITION_GAP: "The entry's position skips ahead of the next expected position.",
    Code.PERSISTED_AT_REGRESSED: "The entry's persistence time is earlier than its predecessor's.",
    Code.PERSISTED_AT_OUT_OF_RANGE: "The entry's persistence time is outside [0, 2^53) ms.",
    Code.SHARD_NOT_ACTIVE: "The shard does not accept this record in its current state.",
    Code.INVALID_IDENTITY: "Tenant, queue or key empty, too long or with NUL; '/' in tenant/queue.",
    Code.INVALID_TXN: "The txn is empty or too long.",
    Code.INVALID_PAYLOAD_REF: "The payload digest is not a sha256 hex digest or the size is < 0.",
    Code.PAYLOAD_TOO_LARGE: "The payload is larger than the configured ceiling.",
    Code.INVALID_HEADERS: "Too many headers, too large, or a name that is empty or reserved.",
    Code.INVALID_CAPABILITY: "The destination capability is malformed or its lead is too large.",
    Code.INVALID_TIMING: "Both or neither of absolute and relative time; negative; beyond 2^53 ms.",
    Code.HORIZON_EXCEEDED: "deliverAt is later than persistence time plus the horizon "
    "(named `deliver_beyond_horizon` by earlier builds).",
    Code.LIFETIME_EXCEEDED: "expireAt is later than persistence time plus the maximum lifetime.",
    Code.EXPIRE_BEFORE_WINDOW: "expireAt leaves less than the minimum delivery window.",
    Code.VERSION_MISMATCH: "The command's expected version does not match the current version.",
    Code.DESTINATION_CHANGED: "A live timer's destination or capability cannot be changed.",
    Code.ADMISSION_BAD_ATTEMPT_ID: "The attempt id does not start with message_id.generation.",
    Code.ADMISSION_DUPLICATE_ATTEMPT: "This attempt id is already in the ledger (enqueue retry).",
    Code.ADMISSION_STALE: "The claim precondition (generation, version, status) no longer holds.",
    Code.ADMISSION_LANE_CLOSED: "The lane's admission gate was closed before this Admission.",
    Code.ADMISSION_CAPABILITY_MISMATCH: "The capability differs from the one pinned at schedule.",
    Code.ADMISSION_EVIDENCE_INVALID: "The recorded clock or capacity decision was not ADMIT.",
    Code.ADMISSION_BEFORE_ACTION_TIME: "The Admission was persisted before actionAt.",
    Code.ADMISSION_AFTER_EXPIRE: "The Admission was persisted at or after expireAt.",
    Code.OUTCOME_UNKNOWN_ATTEMPT: "No attempt with this id was ever admitted.",
    Code.OUTCOME_MISMATCH: "The attempt exists but belongs to another message or generation.",
    Code.OUTCOME_ALREADY_RECORDED: "The attempt is already resolved (or already UNKNOWN).",
    Code.OUTCOME_ABSENCE_NOT_EVIDENCE: "An UNKNOWN attempt can be resolved only to PUBLISHED.",
    Code.OUTCOME_PROOF_INVALID: "A proof of absence names a fence the attempt's producer was "
    "not under (or the attempt's producer cannot be fenced).",
    Code.CLAIM_RESULT_STALE: "The claim's generation, version or status no longer matches.",
    Code.EXPIRE_STALE: "The generation, version or status no longer allows expiry.",
    Code.EXPIRE_PREMATURE: "The expiry's persistence time is before expireAt.",
    Code.EXPIRE_EVIDENCE_INVALID: "The recorded clock interval does not prove expireAt passed.",
    Code.DEAD_LETTER_NOT_PENDING: "No copy of this generation is owed: never dead-lettered, or "
    "its copy already recorded (a duplicate copy of an at-least-once write).",
}
