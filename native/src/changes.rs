//! The rows one record's fold has read and changed so far, over the caller's transaction.
//!
//! Later items of a batch see what earlier ones wrote, as the reducer's items see the
//! step's writes. Nothing here touches the store: `writes` hands the changes back for the
//! caller to put into its own write transaction.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

/// FNV-1a: the keys are a record's few hundred row keys, not input an attacker can shape
/// into collisions of any consequence, and SipHash was a tenth of the fold's instructions.
#[derive(Default)]
struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for b in bytes {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

/// A row's place: its table's name, a NUL, its key (table names hold no NUL).
fn place(table: &str, key: &[u8]) -> Vec<u8> {
    let mut at = Vec::with_capacity(table.len() + 1 + key.len());
    at.extend_from_slice(table.as_bytes());
    at.push(0);
    at.extend_from_slice(key);
    at
}

pub struct Changes<'py, 'a> {
    get: &'a Bound<'py, PyAny>,
    changed: HashMap<Vec<u8>, Option<Vec<u8>>, BuildHasherDefault<Fnv>>,
    order: Vec<(&'static str, Vec<u8>)>,
}

impl<'py, 'a> Changes<'py, 'a> {
    /// Over `get(table, key) -> bytes | None`, the caller's read of a stored row.
    pub fn new(get: &'a Bound<'py, PyAny>) -> Self {
        Changes {
            get,
            changed: HashMap::default(),
            order: Vec::new(),
        }
    }

    /// The framed bytes of a row as this record has left it so far, or None when absent.
    pub fn read(&self, table: &'static str, key: &[u8]) -> PyResult<Option<Vec<u8>>> {
        if let Some(found) = self.changed.get(&place(table, key)) {
            return Ok(found.clone());
        }
        let value = self.get.call1((table, PyBytes::new(self.get.py(), key)))?;
        if value.is_none() {
            return Ok(None);
        }
        Ok(Some(value.cast::<PyBytes>()?.as_bytes().to_vec()))
    }

    /// Put (`Some`) or delete (`None`) a row.
    pub fn write(&mut self, table: &'static str, key: &[u8], value: Option<Vec<u8>>) {
        if self.changed.insert(place(table, key), value).is_none() {
            self.order.push((table, key.to_vec()));
        }
    }

    /// The changes as puts grouped by table, tables in the order first written:
    /// [(table, [(key, value), ...]), ...]. Only for a fold that deletes nothing.
    pub fn puts_by_table(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let mut tables: Vec<(&'static str, Bound<'py, PyList>)> = Vec::new();
        for at in &self.order {
            let Some(Some(value)) = self.changed.get(&place(at.0, &at.1)) else {
                return Err(PyValueError::new_err(
                    "puts_by_table: the fold deleted a row",
                ));
            };
            let pairs = match tables.iter().find(|(name, _)| *name == at.0) {
                Some((_, pairs)) => pairs.clone(),
                None => {
                    let pairs = PyList::empty(py);
                    tables.push((at.0, pairs.clone()));
                    pairs
                }
            };
            pairs.append((PyBytes::new(py, &at.1), PyBytes::new(py, value)))?;
        }
        let out = PyList::empty(py);
        for entry in tables {
            out.append(entry)?;
        }
        Ok(out)
    }

    /// The changes in the order first made, as (table, key, framed value or None).
    pub fn writes(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let out = PyList::empty(py);
        for at in &self.order {
            let value = self
                .changed
                .get(&place(at.0, &at.1))
                .and_then(|v| v.as_deref());
            let value = value.map(|v| PyBytes::new(py, v).into_any());
            out.append((at.0, PyBytes::new(py, &at.1), value))?;
        }
        Ok(out)
    }
}
