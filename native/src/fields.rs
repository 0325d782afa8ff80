//! The stored field order of the rows the compiled folds read and write, and the place of
//! each field they touch. `storage.published` and `storage.admitted` compare the orders with
//! `kernel.model` before using a fold, so a field added or moved there turns the folds off
//! rather than making them write the wrong field.

/// `kernel.model.Message`'s fields in stored order.
pub const MESSAGE_FIELDS: [&str; 35] = [
    "message_id",
    "tenant",
    "queue",
    "timer_key",
    "generation",
    "version",
    "status",
    "txn",
    "payload_digest",
    "payload_size",
    "partition_key",
    "headers",
    "destination",
    "capability",
    "producer_sub",
    "encrypted",
    "deliver_at_ms",
    "expire_at_ms",
    "action_at_ms",
    "has_work",
    "request_digest",
    "attempts_admitted",
    "attempts_spent",
    "failures",
    "open_attempts",
    "uncertain_retries",
    "last_error",
    "last_attempt_id",
    "delivered_attempt_id",
    "evidence",
    "created_at_ms",
    "updated_at_ms",
    "created_position",
    "updated_position",
    "dead_letter_evidence",
];

/// `kernel.model.Attempt`'s fields in stored order.
pub const ATTEMPT_FIELDS: [&str; 16] = [
    "attempt_id",
    "message_id",
    "generation",
    "status",
    "destination",
    "descriptor_hash",
    "claim_id",
    "owner",
    "admitted_position",
    "admitted_at_ms",
    "resolved_position",
    "resolved_at_ms",
    "disposition",
    "error_code",
    "evidence",
    "fence_id",
];

/// `kernel.model.TimelineWork`'s fields in stored order.
pub const TIMELINE_FIELDS: [&str; 9] = [
    "kind",
    "tenant",
    "queue",
    "message_id",
    "generation",
    "version",
    "deliver_at_ms",
    "expire_at_ms",
    "payload_size",
];

pub const M_FIELDS: usize = MESSAGE_FIELDS.len();
pub const A_FIELDS: usize = ATTEMPT_FIELDS.len();
pub const T_FIELDS: usize = TIMELINE_FIELDS.len();
// The fields a message row has always had: only the dead-letter evidence came later.
pub const M_MIN_FIELDS: usize = 34;
// An attempt row from before its resolution fields.
pub const A_MIN_FIELDS: usize = 10;

pub const A_MESSAGE_ID: usize = 1;
pub const A_GENERATION: usize = 2;
pub const A_STATUS: usize = 3;
pub const A_CLAIM_ID: usize = 6;
pub const A_RESOLVED_POSITION: usize = 10;
pub const A_RESOLVED_AT: usize = 11;
pub const A_ERROR_CODE: usize = 13;
pub const A_EVIDENCE: usize = 14;
pub const M_TENANT: usize = 1;
pub const M_QUEUE: usize = 2;
pub const M_TIMER_KEY: usize = 3;
pub const M_GENERATION: usize = 4;
pub const M_VERSION: usize = 5;
pub const M_STATUS: usize = 6;
pub const M_TXN: usize = 7;
pub const M_PAYLOAD_DIGEST: usize = 8;
pub const M_PAYLOAD_SIZE: usize = 9;
pub const M_DESTINATION: usize = 12;
pub const M_CAPABILITY: usize = 13;
pub const M_DELIVER_AT: usize = 16;
pub const M_EXPIRE_AT: usize = 17;
pub const M_ACTION_AT: usize = 18;
pub const M_HAS_WORK: usize = 19;
pub const M_ATTEMPTS_ADMITTED: usize = 21;
pub const M_OPEN_ATTEMPTS: usize = 24;
pub const M_LAST_ATTEMPT: usize = 27;
pub const M_DELIVERED_ATTEMPT: usize = 28;
pub const M_EVIDENCE: usize = 29;
pub const M_UPDATED_AT: usize = 31;
pub const M_UPDATED_POSITION: usize = 33;

// The tables the folds read and write, by the names `storage.compiled_rows.reader` takes.
pub const ATTEMPTS: &str = "attempts";
pub const MESSAGES: &str = "messages";
pub const OBLIGATIONS: &str = "obligations";
pub const PAYLOADS: &str = "payloads";
pub const TIMELINE: &str = "timeline";
// The derived indexes, by the names of their databases (`storage.env`).
pub const LANE_TIMELINE: &str = "lane_timeline";
pub const TIMER_INDEX: &str = "timer_index";
pub const USAGE: &str = "usage";
