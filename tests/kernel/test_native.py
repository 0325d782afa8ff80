"""The Rust twins (`nereus._rust`, native/src/lib.rs) answer as their Python references do.

The references are the rule (`kernel/native.py`); each property states the rule from the
standard it implements (SHA-256's hex digest, CRC-32 framing), not from either
implementation, and then requires both to give it.
"""

from __future__ import annotations

import hashlib
import os
import zlib
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nereus.kernel import native


def _rust() -> ModuleType:
    try:
        from nereus import _rust  # noqa: PLC0415
    except ImportError:
        if os.environ.get("CI") and not os.environ.get("NEREUS_PURE_PYTHON"):
            raise  # CI tests the compiled build: a missing module is a failed build
        pytest.skip("no Rust module here (installed without cargo or NEREUS_PURE_PYTHON=1)")
    module: ModuleType = _rust
    return module


@given(st.binary(max_size=4096))
def test_sha256_hex_is_the_standard_digest_in_both(data: bytes) -> None:
    rust = _rust()
    expected = hashlib.sha256(data).hexdigest()
    assert native.reference_sha256_hex(data) == expected
    assert rust.sha256_hex(data) == expected


@given(st.binary(max_size=4096))
def test_frame_is_crc32_big_endian_then_the_body_in_both(body: bytes) -> None:
    rust = _rust()
    expected = (zlib.crc32(body) & 0xFFFFFFFF).to_bytes(4, "big") + body
    assert native.reference_frame(body) == expected
    assert rust.frame(body) == expected


@given(st.binary(max_size=512))
def test_checksum_ok_agrees_on_arbitrary_bytes(data: bytes) -> None:
    rust = _rust()
    holds = len(data) >= 4 and zlib.crc32(data[4:]).to_bytes(4, "big") == data[:4]
    assert native.reference_checksum_ok(data) is holds
    assert rust.checksum_ok(data) is holds


@given(st.binary(max_size=512), st.data())
def test_a_framed_value_with_any_flipped_bit_is_never_accepted(
    body: bytes, data: st.DataObject
) -> None:
    rust = _rust()
    framed = native.reference_frame(body)
    assert native.reference_checksum_ok(framed) and rust.checksum_ok(framed)
    bit = data.draw(st.integers(0, len(framed) * 8 - 1))
    damaged = bytearray(framed)
    damaged[bit // 8] ^= 1 << (bit % 8)
    assert not native.reference_checksum_ok(bytes(damaged))
    assert not rust.checksum_ok(bytes(damaged))


def test_the_process_runs_the_rust_twins_unless_it_runs_the_source_build() -> None:
    rust = _rust()
    if os.environ.get("NEREUS_PURE_PYTHON"):
        assert native.BUILD is None
        assert native.sha256_hex is native.reference_sha256_hex
    else:
        assert native.BUILD == rust.BUILD
        assert native.sha256_hex is rust.sha256_hex
        assert native.frame is rust.frame
        assert native.checksum_ok is rust.checksum_ok
