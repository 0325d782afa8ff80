//! The fold of PUBLISHED outcomes over stored rows: the second implementation of the common
//! case of `kernel.mutations.outcome`, which is the reference.
//!
//! Only the case every fire ends in is taken: a PUBLISHED result for a PUBLISHING attempt
//! of the message's current generation, the message PUBLISHING with no timeline work, and
//! every row it touches in the form msgspec writes. For anything else the whole record
//! answers `None` and the Python kernel folds it: one rule set decides a record, never half
//! of it each. The rows read come through `get` (the caller's write transaction), the rows
//! changed go back as (table, key, framed bytes or None to delete); nothing is written here.

use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::changes::Changes;
use crate::fields::*;
use crate::rows::{self, Row, FALSE, NIL};

/// What the caller needs of each item to build its outcome and its claim's release.
struct Folded {
    claim_id: String,
    version: i64,
    txn: String,
    deliver_at_ms: i64,
    tenant: String,
    queue: String,
    timer_key: String,
}

/// One item; None when it is not the common case (nothing of the record is then used).
fn fold_item(
    rows: &mut Changes<'_, '_>,
    attempt_id: &str,
    message_id: &str,
    generation: i64,
    evidence: &[u8],
    position: i64,
    persisted_at_ms: i64,
) -> PyResult<Option<Folded>> {
    let Some(attempt_raw) = rows.read(ATTEMPTS, attempt_id.as_bytes())? else {
        return Ok(None);
    };
    let Some(message_raw) = rows.read(MESSAGES, message_id.as_bytes())? else {
        return Ok(None);
    };
    let Some(attempt_body) = rows::unframe(&attempt_raw) else {
        return Ok(None);
    };
    let Some(message_body) = rows::unframe(&message_raw) else {
        return Ok(None);
    };
    let Some(attempt) = Row::parse(attempt_body, A_MIN_FIELDS, A_FIELDS) else {
        return Ok(None);
    };
    let Some(message) = Row::parse(message_body, M_MIN_FIELDS, M_FIELDS) else {
        return Ok(None);
    };
    let common = attempt.is(A_STATUS, &rows::str("PUBLISHING"))
        && attempt.str(A_MESSAGE_ID) == Some(message_id)
        && attempt.int(A_GENERATION) == Some(generation)
        && message.int(M_GENERATION) == Some(generation)
        && message.is(M_STATUS, &rows::str("PUBLISHING"))
        && message.is(M_HAS_WORK, &[FALSE]);
    if !common {
        return Ok(None);
    }
    let (Some(open), Some(version), Some(size), Some(deliver_at_ms)) = (
        message.int(M_OPEN_ATTEMPTS),
        message.int(M_VERSION),
        message.int(M_PAYLOAD_SIZE),
        message.int(M_DELIVER_AT),
    ) else {
        return Ok(None);
    };
    let (Some(tenant), Some(queue), Some(timer_key), Some(txn), Some(digest), Some(claim_id)) = (
        message.str(M_TENANT),
        message.str(M_QUEUE),
        message.str(M_TIMER_KEY),
        message.str(M_TXN),
        message.str(M_PAYLOAD_DIGEST),
        attempt.str(A_CLAIM_ID),
    ) else {
        return Ok(None);
    };
    if open < 1 {
        return Ok(None);
    }
    // PUBLISHING holds the payload and counts as live; DELIVERED does neither.
    let Some(payload) = rows
        .read(PAYLOADS, digest.as_bytes())?
        .as_deref()
        .and_then(rows::pair)
    else {
        return Ok(None);
    };
    let Some(usage) = rows
        .read(USAGE, tenant.as_bytes())?
        .as_deref()
        .and_then(rows::pair)
    else {
        return Ok(None);
    };
    let (live, bytes) = (usage.0 - 1, usage.1 - size);
    if payload.0 < 1 || live < 0 || bytes < 0 {
        return Ok(None);
    }

    let resolved = attempt.rewrite(
        A_FIELDS,
        &[
            (A_STATUS, rows::str("PUBLISHED")),
            (A_RESOLVED_POSITION, rows::int(position)),
            (A_RESOLVED_AT, rows::int(persisted_at_ms)),
            (A_ERROR_CODE, vec![NIL]),
            (A_EVIDENCE, evidence.to_vec()),
        ],
    );
    let delivered = message.rewrite(
        M_FIELDS,
        &[
            (M_VERSION, rows::int(version + 1)),
            (M_UPDATED_AT, rows::int(persisted_at_ms)),
            (M_UPDATED_POSITION, rows::int(position)),
            (M_OPEN_ATTEMPTS, rows::int(open - 1)),
            (M_STATUS, rows::str("DELIVERED")),
            (M_EVIDENCE, evidence.to_vec()),
            (M_DELIVERED_ATTEMPT, rows::str(attempt_id)),
        ],
    );
    let folded = Folded {
        claim_id: claim_id.to_owned(),
        version: version + 1,
        txn: txn.to_owned(),
        deliver_at_ms,
        tenant: tenant.to_owned(),
        queue: queue.to_owned(),
        timer_key: timer_key.to_owned(),
    };
    let (digest, tenant) = (digest.to_owned(), tenant.to_owned());
    rows.write(
        ATTEMPTS,
        attempt_id.as_bytes(),
        Some(rows::frame(&resolved)),
    );
    rows.write(OBLIGATIONS, attempt_id.as_bytes(), None);
    rows.write(
        MESSAGES,
        message_id.as_bytes(),
        Some(rows::frame(&delivered)),
    );
    let payload_row = (payload.0 > 1).then(|| rows::pair_row(payload.0 - 1, payload.1));
    rows.write(PAYLOADS, digest.as_bytes(), payload_row);
    let usage_row = (live != 0 || bytes != 0).then(|| rows::pair_row(live, bytes));
    rows.write(USAGE, tenant.as_bytes(), usage_row);
    Ok(Some(folded))
}

/// The fold of a record whose items are all PUBLISHED outcomes, or None when any item is
/// not the common case. `items`: (attempt id, message id, generation, the evidence as
/// msgspec encodes it). Returns the rows to write, in the order first changed, as
/// (table, key, framed value or None), and per item (claim id, the message's new version,
/// txn, deliverAt, tenant, queue, timer key).
#[pyfunction]
pub fn fold_published<'py>(
    py: Python<'py>,
    get: &Bound<'py, PyAny>,
    items: Vec<(String, String, i64, Vec<u8>)>,
    position: i64,
    persisted_at_ms: i64,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let mut rows = Changes::new(get);
    let mut folded = Vec::with_capacity(items.len());
    for (attempt_id, message_id, generation, evidence) in &items {
        if !rows::is_one_value(evidence) {
            return Ok(None);
        }
        match fold_item(
            &mut rows,
            attempt_id,
            message_id,
            *generation,
            evidence,
            position,
            persisted_at_ms,
        )? {
            Some(item) => folded.push(item),
            None => return Ok(None),
        }
    }
    let writes = rows.writes(py)?;
    let results = PyList::empty(py);
    for f in folded {
        results.append((
            f.claim_id,
            f.version,
            f.txn,
            f.deliver_at_ms,
            f.tenant,
            f.queue,
            f.timer_key,
        ))?;
    }
    Ok(Some(PyTuple::new(
        py,
        [writes.into_any(), results.into_any()],
    )?))
}
