//! The fold of Admissions over stored rows: the second implementation of the row work of
//! `kernel.mutations.admission`, which is the reference.
//!
//! Only the rows are decided here: the Admission's attempt must be new, its message
//! SCHEDULED with timeline work, of the generation and version the Admission names, pinned
//! to the capability it carries. The rest of the rule (the shard's state, the attempt id's
//! shape, the lane's gate, the clock evidence and the capacity, the persistence time
//! against actionAt and expireAt) stays in Python: `storage.admitted` checks it on what
//! this returns, with the kernel's own functions, before anything is written. Anything
//! else makes the whole record answer `None`, and the Python kernel folds it.

use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};

use crate::changes::Changes;
use crate::fields::*;
use crate::rows::{self, Row, NIL};

const TRUE: u8 = 0xc3;

/// One Admission as the caller hands it over: (attempt id, message id, generation, version,
/// claim id, descriptor hash, the capability as msgspec encodes it).
type ItemTuple = (String, String, i64, i64, String, String, Vec<u8>);

/// One Admission of the record.
pub struct Item {
    attempt_id: String,
    message_id: String,
    generation: i64,
    version: i64,
    claim_id: String,
    descriptor_hash: String,
    capability: Vec<u8>,
}

/// What the caller needs of each item: the rule's remaining checks and the effects.
type Admitted = (i64, String, i64, i64, i64, String, String, String, String);

fn opt_str(value: Option<&str>) -> Vec<u8> {
    value.map_or_else(|| vec![NIL], rows::str)
}

fn fold_item(
    rows: &mut Changes<'_, '_>,
    item: &Item,
    owner: &str,
    fence_id: Option<&str>,
    position: i64,
    persisted_at_ms: i64,
) -> PyResult<Option<Admitted>> {
    if rows.read(ATTEMPTS, item.attempt_id.as_bytes())?.is_some() {
        return Ok(None); // a duplicate: the reducer says so
    }
    let Some(raw) = rows.read(MESSAGES, item.message_id.as_bytes())? else {
        return Ok(None);
    };
    let Some(body) = rows::unframe(&raw) else {
        return Ok(None);
    };
    let Some(message) = Row::parse(body, M_MIN_FIELDS, M_FIELDS) else {
        return Ok(None);
    };
    let common = message.int(M_GENERATION) == Some(item.generation)
        && message.int(M_VERSION) == Some(item.version)
        && message.is(M_STATUS, &rows::str("SCHEDULED"))
        && message.is(M_HAS_WORK, &[TRUE])
        && message.is(M_CAPABILITY, &item.capability);
    if !common {
        return Ok(None);
    }
    let ints = (
        message.int(M_DELIVER_AT),
        message.int(M_EXPIRE_AT),
        message.int(M_ACTION_AT),
        message.int(M_ATTEMPTS_ADMITTED),
        message.int(M_OPEN_ATTEMPTS),
    );
    let (Some(deliver_at), Some(expire_at), Some(action_at), Some(admitted), Some(open)) = ints
    else {
        return Ok(None);
    };
    let strs = (
        message.str(M_TENANT),
        message.str(M_QUEUE),
        message.str(M_TIMER_KEY),
        message.str(M_TXN),
        message.str(M_DESTINATION),
    );
    let (Some(tenant), Some(queue), Some(timer_key), Some(txn), Some(destination)) = strs else {
        return Ok(None);
    };

    let mut attempt = Vec::with_capacity(256);
    rows::array_header(&mut attempt, A_FIELDS);
    for field in [
        rows::str(&item.attempt_id),
        rows::str(&item.message_id),
        rows::int(item.generation),
        rows::str("PUBLISHING"),
        rows::str(destination),
        rows::str(&item.descriptor_hash),
        rows::str(&item.claim_id),
        rows::str(owner),
        rows::int(position),
        rows::int(persisted_at_ms),
    ] {
        attempt.extend(field);
    }
    attempt.extend([NIL; 5]); // resolved position and time, disposition, error, evidence
    attempt.extend(opt_str(fence_id));

    let mut obligation = Vec::with_capacity(128);
    rows::array_header(&mut obligation, 5);
    for field in [
        rows::str(&item.message_id),
        rows::int(item.generation),
        rows::str(destination),
        rows::int(position),
        rows::int(persisted_at_ms),
    ] {
        obligation.extend(field);
    }

    let publishing = message.rewrite(
        M_FIELDS,
        &[
            (M_VERSION, rows::int(item.version + 1)),
            (M_UPDATED_AT, rows::int(persisted_at_ms)),
            (M_UPDATED_POSITION, rows::int(position)),
            (M_STATUS, rows::str("PUBLISHING")),
            (M_HAS_WORK, vec![rows::FALSE]),
            (M_LAST_ATTEMPT, rows::str(&item.attempt_id)),
            (M_ATTEMPTS_ADMITTED, rows::int(admitted + 1)),
            (M_OPEN_ATTEMPTS, rows::int(open + 1)),
        ],
    );
    let answer: Admitted = (
        item.version + 1,
        txn.to_owned(),
        deliver_at,
        action_at,
        expire_at,
        destination.to_owned(),
        tenant.to_owned(),
        queue.to_owned(),
        timer_key.to_owned(),
    );
    rows.write(
        ATTEMPTS,
        item.attempt_id.as_bytes(),
        Some(rows::frame(&attempt)),
    );
    rows.write(
        OBLIGATIONS,
        item.attempt_id.as_bytes(),
        Some(rows::frame(&obligation)),
    );
    rows.write(
        MESSAGES,
        item.message_id.as_bytes(),
        Some(rows::frame(&publishing)),
    );
    Ok(Some(answer))
}

/// The row work of a record of Admissions, or None when any item is not the common case.
/// Returns the rows to write, in the order first changed, as (table, key, framed value),
/// and per item (the message's new version, txn, deliverAt, actionAt, expireAt,
/// destination, tenant, queue, timer key). The timeline row is the caller's to delete.
#[pyfunction]
#[pyo3(signature = (get, items, owner, fence_id, position, persisted_at_ms))]
pub fn fold_admitted<'py>(
    py: Python<'py>,
    get: &Bound<'py, PyAny>,
    items: Vec<ItemTuple>,
    owner: &str,
    fence_id: Option<&str>,
    position: i64,
    persisted_at_ms: i64,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let mut rows = Changes::new(get);
    let mut done = Vec::with_capacity(items.len());
    for (attempt_id, message_id, generation, version, claim_id, descriptor_hash, capability) in
        items
    {
        let item = &Item {
            attempt_id,
            message_id,
            generation,
            version,
            claim_id,
            descriptor_hash,
            capability,
        };
        if !rows::is_one_value(&item.capability) {
            return Ok(None);
        }
        match fold_item(&mut rows, item, owner, fence_id, position, persisted_at_ms)? {
            Some(answer) => done.push(answer),
            None => return Ok(None),
        }
    }
    let writes = rows.writes(py)?;
    let results = PyList::empty(py);
    for answer in done {
        results.append(answer)?;
    }
    Ok(Some(PyTuple::new(
        py,
        [writes.into_any(), results.into_any()],
    )?))
}
