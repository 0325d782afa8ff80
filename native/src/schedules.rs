//! The fold of first schedules over stored rows: the second implementation of the row work
//! of `kernel.commands.schedule` for a timer key that has no message yet.
//!
//! Every check that needs only the command (identity, txn, payload, headers, capability,
//! timing, the precondition) stays in Python: `storage.scheduled` runs the kernel's own
//! functions on each item before calling this, and hands over what they computed (the
//! message id, the absolute times, the request digest, the timeline key). What is decided
//! here is what the rows say: the message must not exist, and the payload reference and the
//! tenant's usage, if stored, must be rows msgspec wrote. Anything else makes the whole
//! record answer `None`, and the Python kernel folds it.

use pyo3::prelude::*;

use crate::changes::Changes;
use crate::fields::*;
use crate::rows::{self, NIL};

const TRUE: u8 = 0xc3;

/// Who and what: (message id, tenant, queue, timer key, txn, request digest).
type Identity = (String, String, String, String, String, String);
/// The content: (payload digest, payload size, partition key, headers, destination, the
/// capability as msgspec encodes it, producer sub, encrypted).
type Content = (
    String,
    i64,
    Option<String>,
    Vec<(String, String)>,
    String,
    Vec<u8>,
    Option<String>,
    bool,
);
/// When: (deliverAt, expireAt, actionAt, the timeline key).
type Timing = (i64, i64, i64, Vec<u8>);

fn put_opt_str(out: &mut Vec<u8>, value: Option<&str>) {
    match value {
        Some(text) => rows::put_str(out, text),
        None => out.push(NIL),
    }
}

/// tenant NUL queue NUL: the prefix of a lane's keys in both derived indexes
/// (`storage.codec.lane_prefix`).
fn lane_prefix(tenant: &str, queue: &str, rest: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(tenant.len() + queue.len() + 2 + rest.len());
    key.extend_from_slice(tenant.as_bytes());
    key.push(0);
    key.extend_from_slice(queue.as_bytes());
    key.push(0);
    key.extend_from_slice(rest);
    key
}

/// One item; None when it is not a first schedule (nothing of the record is then used).
fn fold_item(
    rows: &mut Changes<'_, '_>,
    who: &Identity,
    what: &Content,
    when: &Timing,
    position: i64,
    persisted_at_ms: i64,
) -> PyResult<Option<()>> {
    let (message_id, tenant, queue, timer_key, txn, request_digest) = who;
    let (
        digest,
        size,
        partition_key,
        header_pairs,
        destination,
        capability,
        producer_sub,
        encrypted,
    ) = what;
    let (deliver_at_ms, expire_at_ms, action_at_ms, timeline_key) = when;
    if !rows::is_one_value(capability) {
        return Ok(None);
    }
    if rows.read(MESSAGES, message_id.as_bytes())?.is_some() {
        return Ok(None); // not a first schedule: the reducer decides
    }
    // SCHEDULED holds its payload and counts as live (`kernel.step.Step.put_message`).
    let payload = match rows.read(PAYLOADS, digest.as_bytes())? {
        None => (1, *size),
        Some(raw) => match rows::pair(&raw) {
            Some((count, _)) => (count + 1, *size),
            None => return Ok(None),
        },
    };
    let usage = match rows.read(USAGE, tenant.as_bytes())? {
        None => (1, *size),
        Some(raw) => match rows::pair(&raw) {
            Some((live, bytes)) => (live + 1, bytes + size),
            None => return Ok(None),
        },
    };

    let mut message = rows::begin(400 + capability.len());
    rows::array_header(&mut message, M_FIELDS);
    for text in [message_id, tenant, queue, timer_key] {
        rows::put_str(&mut message, text);
    }
    message.extend([1, 1]); // generation, version
    for text in ["SCHEDULED", txn, digest] {
        rows::put_str(&mut message, text);
    }
    rows::put_int(&mut message, *size);
    put_opt_str(&mut message, partition_key.as_deref());
    rows::array_header(&mut message, header_pairs.len());
    for (name, value) in header_pairs {
        message.push(0x92);
        rows::put_str(&mut message, name);
        rows::put_str(&mut message, value);
    }
    rows::put_str(&mut message, destination);
    message.extend_from_slice(capability);
    put_opt_str(&mut message, producer_sub.as_deref());
    message.push(if *encrypted { TRUE } else { rows::FALSE });
    for time in [deliver_at_ms, expire_at_ms, action_at_ms] {
        rows::put_int(&mut message, *time);
    }
    message.push(TRUE); // has work
    rows::put_str(&mut message, request_digest);
    // A fresh generation: no Admissions, the whole budget, no failures, nothing delivered.
    message.extend([0, 0, 0, 0, 0]);
    message.extend([NIL; 4]); // last error, last attempt, delivered attempt, evidence
    for field in [persisted_at_ms, persisted_at_ms, position, position] {
        rows::put_int(&mut message, field);
    }
    message.push(NIL); // dead-letter evidence

    let mut work = rows::begin(160);
    rows::array_header(&mut work, T_FIELDS);
    for text in ["deliver", tenant, queue, message_id] {
        rows::put_str(&mut work, text);
    }
    work.extend([1, 1]); // generation, version
    for field in [deliver_at_ms, expire_at_ms, size] {
        rows::put_int(&mut work, *field);
    }

    rows.write(
        PAYLOADS,
        digest.as_bytes(),
        Some(rows::pair_row(payload.0, payload.1)),
    );
    rows.write(
        USAGE,
        tenant.as_bytes(),
        Some(rows::pair_row(usage.0, usage.1)),
    );
    rows.write(MESSAGES, message_id.as_bytes(), Some(rows::seal(message)));
    rows.write(TIMELINE, timeline_key, Some(rows::seal(work)));
    // The derived indexes (`storage.indexes`): the lane's timeline entry, and the live
    // timer naming its message (no entry can exist for a key with no message).
    rows.write(
        LANE_TIMELINE,
        &lane_prefix(tenant, queue, timeline_key),
        Some(Vec::new()),
    );
    rows.write(
        TIMER_INDEX,
        &lane_prefix(tenant, queue, timer_key.as_bytes()),
        Some(message_id.as_bytes().to_vec()),
    );
    Ok(Some(()))
}

/// The row work of a record of first schedules, or None when any item's key already has a
/// message or a row it reads is not in msgspec's form. Returns the rows to put, with the
/// derived index entries, by table: [(table, [(key, value), ...]), ...].
#[pyfunction]
#[pyo3(signature = (get, items, position, persisted_at_ms))]
pub fn fold_scheduled<'py>(
    py: Python<'py>,
    get: &Bound<'py, PyAny>,
    items: Vec<(Identity, Content, Timing)>,
    position: i64,
    persisted_at_ms: i64,
) -> PyResult<Option<Bound<'py, pyo3::types::PyList>>> {
    let mut rows = Changes::new(get);
    for (who, what, when) in &items {
        if fold_item(&mut rows, who, what, when, position, persisted_at_ms)?.is_none() {
            return Ok(None);
        }
    }
    rows.puts_by_table(py).map(Some)
}
