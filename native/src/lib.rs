//! Nereus's compiled hot path.
//!
//! Every function here is a second implementation of one whose reference is Python
//! (`kernel/native.py` names each pair). The Python one is the rule; this one must give the
//! same answer for every input, which `tests/kernel/test_native.py` checks on generated
//! input and the simulator checks on whole histories (`tests/project/test_compiled.py`).

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

/// Whether a framed value is at least its checksum long and its body matches it.
#[pyfunction]
fn checksum_ok(data: &[u8]) -> bool {
    data.len() >= 4 && crc32fast::hash(&data[4..]).to_be_bytes() == data[..4]
}

#[pymodule]
fn _rust(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("BUILD", concat!("rust (nereus-native ", env!("CARGO_PKG_VERSION"), ")"))?;
    m.add_function(wrap_pyfunction!(sha256_hex, m)?)?;
    m.add_function(wrap_pyfunction!(frame, m)?)?;
    m.add_function(wrap_pyfunction!(checksum_ok, m)?)?;
    Ok(())
}
