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


def _twins() -> list[ModuleType]:
    """The implementations to hold to each rule: the references (this module's functions
    under their reference names), and the Rust module where this build has it."""
    implementations: list[ModuleType] = [_REFERENCES]
    try:
        from nereus import _rust  # noqa: PLC0415
    except ImportError:
        return implementations
    module: ModuleType = _rust
    return [*implementations, module]


class _References(ModuleType):
    sha256_hex = staticmethod(native.reference_sha256_hex)
    frame = staticmethod(native.reference_frame)
    checksum_ok = staticmethod(native.reference_checksum_ok)
    blake2b_hex = staticmethod(native.reference_blake2b_hex)
    is_sha256_hex = staticmethod(native.reference_is_sha256_hex)


_REFERENCES = _References("references")


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
    expected = hashlib.sha256(data).hexdigest()
    for twin in _twins():
        assert twin.sha256_hex(data) == expected, twin


@given(st.binary(max_size=4096))
def test_frame_is_crc32_big_endian_then_the_body_in_both(body: bytes) -> None:
    expected = (zlib.crc32(body) & 0xFFFFFFFF).to_bytes(4, "big") + body
    for twin in _twins():
        assert twin.frame(body) == expected, twin


@given(st.binary(max_size=512))
def test_checksum_ok_agrees_on_arbitrary_bytes(data: bytes) -> None:
    holds = len(data) >= 4 and zlib.crc32(data[4:]).to_bytes(4, "big") == data[:4]
    for twin in _twins():
        assert twin.checksum_ok(data) is holds, twin


@given(st.binary(max_size=512), st.data())
def test_a_framed_value_with_any_flipped_bit_is_never_accepted(
    body: bytes, data: st.DataObject
) -> None:
    framed = (zlib.crc32(body) & 0xFFFFFFFF).to_bytes(4, "big") + body
    bit = data.draw(st.integers(0, len(framed) * 8 - 1))
    damaged = bytearray(framed)
    damaged[bit // 8] ^= 1 << (bit % 8)
    for twin in _twins():
        assert twin.checksum_ok(framed), twin
        assert not twin.checksum_ok(bytes(damaged)), twin


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


@given(st.binary(max_size=2048), st.integers(1, 64), st.binary(max_size=16))
def test_blake2b_hex_is_the_standard_digest_in_both(
    data: bytes, digest_size: int, person: bytes
) -> None:
    expected = hashlib.blake2b(data, digest_size=digest_size, person=person).hexdigest()
    for twin in _twins():
        assert twin.blake2b_hex(data, digest_size, person) == expected, twin


@pytest.mark.parametrize(("digest_size", "person"), [(0, b""), (65, b""), (16, b"p" * 17)])
def test_blake2b_hex_refuses_what_blake2b_cannot_be_in_both(
    digest_size: int, person: bytes
) -> None:
    for twin in _twins():
        with pytest.raises(ValueError):
            twin.blake2b_hex(b"data", digest_size, person)


_HEX = "0123456789abcdef"
_NOT_HEX = st.characters(blacklist_characters=_HEX)  # surrogates and non-ASCII included


@st.composite
def _nearly_digests(draw: st.DrawFn) -> str:
    """Strings around the rule's edge: a digest, one with a character replaced, longer,
    shorter, uppercase, or anything at all."""
    digest = draw(st.text(_HEX, min_size=64, max_size=64))
    kind = draw(st.sampled_from(["digest", "replaced", "longer", "shorter", "upper", "any"]))
    if kind == "replaced":
        at = draw(st.integers(0, 63))
        return digest[:at] + draw(_NOT_HEX) + digest[at + 1 :]
    if kind == "longer":
        return digest + draw(st.text(min_size=1, max_size=3))
    if kind == "shorter":
        return digest[: draw(st.integers(0, 63))]
    if kind == "upper":
        return digest.upper()
    if kind == "any":
        return draw(st.text(max_size=70))
    return digest


@given(_nearly_digests())
def test_a_payload_digest_is_64_lowercase_hex_digits_in_both(text: str) -> None:
    holds = len(text) == 64 and all(c in _HEX for c in text)
    for twin in _twins():
        assert twin.is_sha256_hex(text) is holds, (twin, text)
