//! Nereus's compiled hot path.
//!
//! Every function here is a second implementation of one whose reference is Python
//! (`kernel/native.py` names each pair). The Python one is the rule; this one must give the
//! same answer for every input, which `tests/kernel/test_native.py` checks on generated
//! input and the simulator checks on whole histories (`tests/project/test_compiled.py`).

mod admissions;
mod changes;
mod fields;
mod outcomes;
mod rows;
mod schedules;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};
use sha2::{Digest, Sha256};

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The lowercase hex SHA-256 of `data`, as `hashlib.sha256(data).hexdigest()`.
#[pyfunction]
fn sha256_hex<'py>(py: Python<'py>, data: &[u8]) -> Bound<'py, PyString> {
    let digest = Sha256::digest(data);
    let mut out = [0u8; 64];
    for (i, byte) in digest.iter().enumerate() {
        out[2 * i] = HEX[(byte >> 4) as usize];
        out[2 * i + 1] = HEX[(byte & 15) as usize];
    }
    // Hex digits are ASCII: the conversion cannot fail.
    PyString::new(py, std::str::from_utf8(&out).unwrap_or_default())
}

/// `crc32(body)` big-endian, then `body`: the framing of every value written to LMDB.
#[pyfunction]
fn frame<'py>(py: Python<'py>, body: &[u8]) -> PyResult<Bound<'py, PyBytes>> {
    let crc = crc32fast::hash(body).to_be_bytes();
    PyBytes::new_with(py, body.len() + 4, |buf| {
        buf[..4].copy_from_slice(&crc);
        buf[4..].copy_from_slice(body);
        Ok(())
    })
}

/// The lowercase hex BLAKE2b of `data` with `digest_size` bytes of output and the
/// personalisation `person`, as `hashlib.blake2b(data, digest_size=..., person=...)`.
#[pyfunction]
fn blake2b_hex<'py>(
    py: Python<'py>,
    data: &[u8],
    digest_size: usize,
    person: &[u8],
) -> PyResult<Bound<'py, PyString>> {
    if !(1..=64).contains(&digest_size) {
        return Err(PyValueError::new_err(
            "digest_size must be between 1 and 64 bytes",
        ));
    }
    if person.len() > 16 {
        return Err(PyValueError::new_err("maximum person length is 16 bytes"));
    }
    let hash = blake2b_simd::Params::new()
        .hash_length(digest_size)
        .personal(person)
        .hash(data);
    Ok(PyString::new(py, hash.to_hex().as_str()))
}

/// Whether `text` is a SHA-256 in lowercase hex: exactly 64 of `0-9a-f`, as
/// `re.fullmatch("[0-9a-f]{64}", text)`.
/// A string that is not valid UTF-8 (a lone surrogate) is not one: False, not an error.
#[pyfunction]
fn is_sha256_hex(text: &Bound<'_, PyString>) -> bool {
    match text.to_str() {
        Ok(s) => s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
        Err(_) => false,
    }
}

/// Whether a framed value is at least its checksum long and its body matches it.
#[pyfunction]
fn checksum_ok(data: &[u8]) -> bool {
    data.len() >= 4 && crc32fast::hash(&data[4..]).to_be_bytes() == data[..4]
}

#[pymodule]
fn _rust(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add(
        "BUILD",
        concat!("rust (nereus-native ", env!("CARGO_PKG_VERSION"), ")"),
    )?;
    m.add_function(wrap_pyfunction!(sha256_hex, m)?)?;
    m.add_function(wrap_pyfunction!(frame, m)?)?;
    m.add_function(wrap_pyfunction!(checksum_ok, m)?)?;
    m.add_function(wrap_pyfunction!(blake2b_hex, m)?)?;
    m.add_function(wrap_pyfunction!(is_sha256_hex, m)?)?;
    m.add_function(wrap_pyfunction!(outcomes::fold_published, m)?)?;
    m.add_function(wrap_pyfunction!(admissions::fold_admitted, m)?)?;
    m.add_function(wrap_pyfunction!(schedules::fold_scheduled, m)?)?;
    m.add("MESSAGE_FIELDS", fields::MESSAGE_FIELDS.to_vec())?;
    m.add("ATTEMPT_FIELDS", fields::ATTEMPT_FIELDS.to_vec())?;
    m.add("TIMELINE_FIELDS", fields::TIMELINE_FIELDS.to_vec())?;
    Ok(())
}
