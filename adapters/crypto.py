"""Encryption at schedule: AES-256-GCM envelopes bound to one timer.

    import base64, os
    from nereus.adapters.crypto import Keyring, open_envelope, open_message, seal, seal_message

    keyring = Keyring({"k1": base64.b64encode(os.urandom(32)).decode()})
    ident = {"tenant": "acme", "queue": "reminders", "timer_key": "trial:acme:day7"}
    envelope = seal(keyring, "k1", b'{"kind":"day7"}', **ident)
    assert envelope.startswith(b"NRE1")
    assert open_envelope(keyring, envelope, **ident) == b'{"kind":"day7"}'
    sealed = seal_message(keyring, "k1", b"{}", [("plan", "gold")], **ident)
    assert sealed.startswith(b"NRE2")
    assert open_message(keyring, sealed, **ident) == ((("plan", "gold"),), b"{}")

Theory of operation: a queue with an encryption key has its payload, and its headers, sealed
when the timer is scheduled, so the store, the log, exports, snapshots and peeks only ever
hold the envelope; the destination receives the envelope unchanged (with the header
`nereus-encryption`) and the consumer opens it with the same keyring. Nereus itself never
decrypts. Headers travel inside the envelope because a record's headers are stored and
delivered as given: sealed there they are never at rest in clear, and the log records of a
sealed schedule carry no headers of their own (an older record's meaning is unchanged).

Envelope bytes::

    magic (4) | key-id length (1 byte, 1..64) | key id (ASCII) | nonce (12) | ciphertext || tag (16)

Two magics: `NRE1` seals the payload alone; `NRE2` seals the headers and the payload, its
clear text being the header count (4 bytes big-endian), then each header's name and value
(UTF-8, each with a 4-byte big-endian length prefix), then the payload. A timer without
headers is sealed as `NRE1`, byte for byte as before `NRE2` existed, so an identical retry
across an upgrade stays identical.

The associated data is the envelope header (magic, key-id length, key id) followed by the
tenant, queue and timer key, each UTF-8 with a 4-byte big-endian length prefix. So an envelope
authenticates only for the timer it was sealed for, under the key id and the magic it names;
moving it to another timer, relabelling it with another key id or magic, or changing any
byte fails authentication.

Declared consequence of rotation: a key replaced under the same id (or removed) between
schedule and fire leaves the records sealed under the old key undecryptable with the new
keyring. Rotate by adding a new key id and sealing with it; keep the old id until the timers
sealed under it have been delivered and consumed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Literal, NamedTuple

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = [
    "ALGORITHM",
    "ENVELOPE_OVERHEAD_BYTES",
    "KEY_BYTES",
    "MAGIC",
    "MAGIC_WITH_HEADERS",
    "NONCE_BYTES",
    "TAG_BYTES",
    "EnvelopeError",
    "Keyring",
    "OpenedMessage",
    "ParsedEnvelope",
    "headers_frame_bytes",
    "open_envelope",
    "open_message",
    "parse_envelope",
    "seal",
    "seal_message",
    "sealed_size",
]

Headers = Sequence[tuple[str, str]]

ALGORITHM = "aes-256-gcm"
MAGIC = b"NRE1"  # the payload alone
MAGIC_WITH_HEADERS = b"NRE2"  # the headers, then the payload
_MAGICS = (MAGIC, MAGIC_WITH_HEADERS)
KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
MAX_KEY_ID_LENGTH = 64

# fullmatch, not `$`: `$` would let a trailing newline through.
_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
# The shortest well-formed envelope: a one-character key id and an empty payload.
_MIN_ENVELOPE = len(MAGIC) + 1 + 1 + NONCE_BYTES + TAG_BYTES

EnvelopeReason = Literal["not_an_envelope", "unknown_key_id", "authentication_failed"]


class EnvelopeError(ValueError):
    """An envelope that cannot be opened. `reason` is one of `not_an_envelope`,
    `unknown_key_id` or `authentication_failed` (wrong or rotated key, an envelope moved to
    another timer, or tampered bytes: GCM cannot tell these apart, by design)."""

    def __init__(self, reason: EnvelopeReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason: EnvelopeReason = reason
        self.detail = detail


class ParsedEnvelope(NamedTuple):
    key_id: str
    nonce: bytes
    ciphertext: bytes  # includes the 16-byte tag


class OpenedMessage(NamedTuple):
    """What an envelope sealed: the headers (empty for an `NRE1` envelope) and the payload."""

    headers: tuple[tuple[str, str], ...]
    payload: bytes


def _check_key_id(key_id: object) -> str:
    if not isinstance(key_id, str):
        raise ValueError(f"key id {key_id!r}: must be a string")
    if _KEY_ID.fullmatch(key_id) is None:
        # Truncated: an overlong "id" might be key material pasted into the wrong place.
        shown = key_id if len(key_id) <= MAX_KEY_ID_LENGTH else key_id[:16] + "..."
        raise ValueError(
            f"key id {shown!r}: must be 1..{MAX_KEY_ID_LENGTH} characters from [A-Za-z0-9._-]"
        )
    return key_id


def ENVELOPE_OVERHEAD_BYTES(key_id: str) -> int:  # noqa: N802 - a size constant per key id
    """How many bytes sealing adds to a payload without headers under `key_id`."""
    return len(MAGIC) + 1 + len(_check_key_id(key_id)) + NONCE_BYTES + TAG_BYTES


def headers_frame_bytes(headers: Headers) -> int:
    """How many bytes `headers` take inside an envelope: none without headers (`NRE1`)."""
    if not headers:
        return 0
    return 4 + sum(8 + len(name.encode()) + len(value.encode()) for name, value in headers)


def sealed_size(key_id: str, payload_bytes: int, headers: Headers = ()) -> int:
    """The size of the envelope that seals `payload_bytes` bytes and `headers`."""
    return ENVELOPE_OVERHEAD_BYTES(key_id) + headers_frame_bytes(headers) + payload_bytes


class Keyring:
    """Named AES-256 keys, from `{key_id: base64 of 32 bytes}`. Never prints key material."""

    def __init__(self, keys: Mapping[str, str]) -> None:
        ciphers: dict[str, AESGCM] = {}
        nonce_keys: dict[str, bytes] = {}
        aesgcm = _aesgcm() if keys else None
        for key_id, encoded in keys.items():
            _check_key_id(key_id)
            if not isinstance(encoded, str):
                raise ValueError(f"key {key_id!r}: must be a base64 string")
            try:
                # validate=True: silently skipping junk characters would hide a mangled key.
                raw = base64.b64decode(encoded.strip(), validate=True)
            except (binascii.Error, ValueError):
                # `from None`: the decoder's context is noise and must not carry the input.
                raise ValueError(f"key {key_id!r}: not valid base64") from None
            if len(raw) != KEY_BYTES:
                raise ValueError(
                    f"key {key_id!r}: decodes to {len(raw)} bytes, AES-256 needs {KEY_BYTES}"
                )
            assert aesgcm is not None
            ciphers[key_id] = aesgcm(raw)
            # A separate key for nonces (key separation: the AES key never meets HMAC).
            nonce_keys[key_id] = hmac.new(raw, b"nereus nonce key v1", hashlib.sha256).digest()
        self._ciphers = ciphers
        self._nonce_keys = nonce_keys

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(sorted(self._ciphers))

    def __contains__(self, key_id: object) -> bool:
        return key_id in self._ciphers

    def __len__(self) -> int:
        return len(self._ciphers)

    def __iter__(self) -> Iterator[str]:
        return iter(self.key_ids)

    def __repr__(self) -> str:
        return f"Keyring(key_ids={list(self.key_ids)!r})"

    def _cipher(self, key_id: str) -> AESGCM | None:
        return self._ciphers.get(key_id)


def _aesgcm() -> type[AESGCM]:
    """AES-GCM from `cryptography`, an optional dependency: only encrypted queues need it."""
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: PLC0415
    except ImportError:
        raise ValueError(
            "encrypted queues need the cryptography package: pip install 'nereus[crypto]'"
        ) from None
    return AESGCM


def _header(key_id: str, magic: bytes = MAGIC) -> bytes:
    kid = key_id.encode("ascii")
    return magic + bytes([len(kid)]) + kid


def _frame_headers(headers: Headers) -> bytes:
    parts = [struct.pack(">I", len(headers))]
    for name, value in headers:
        for text in (name, value):
            encoded = text.encode("utf-8")
            parts.append(struct.pack(">I", len(encoded)))
            parts.append(encoded)
    return b"".join(parts)


def _unframe_headers(clear: bytes) -> OpenedMessage:
    """The headers and payload of an `NRE2` envelope's clear text. The text was
    authenticated, so a bad frame means a sealer with the key wrote it wrong: named, never
    guessed at."""
    at = 4
    try:
        (count,) = struct.unpack_from(">I", clear, 0)
        pairs: list[tuple[str, str]] = []
        for _ in range(count):
            fields: list[str] = []
            for _side in range(2):
                (size,) = struct.unpack_from(">I", clear, at)
                at += 4
                if at + size > len(clear):
                    raise ValueError("a header runs past the end")
                fields.append(clear[at : at + size].decode("utf-8"))
                at += size
            pairs.append((fields[0], fields[1]))
    except (struct.error, ValueError) as exc:
        raise EnvelopeError("not_an_envelope", f"the sealed headers are malformed: {exc}") from None
    return OpenedMessage(tuple(pairs), clear[at:])


def _associated_data(header: bytes, tenant: str, queue: str, timer_key: str) -> bytes:
    # Length prefixes make the encoding injective: ("a:b", "c") and ("a", "b:c") differ.
    parts = [header]
    for field in (tenant, queue, timer_key):
        encoded = field.encode("utf-8")
        parts.append(struct.pack(">I", len(encoded)))
        parts.append(encoded)
    return b"".join(parts)


def seal(
    keyring: Keyring,
    key_id: str,
    payload: bytes,
    *,
    tenant: str,
    queue: str,
    timer_key: str,
) -> bytes:
    """The envelope of `payload` under `key_id`, bound to (tenant, queue, timer_key)."""
    return seal_message(
        keyring, key_id, payload, (), tenant=tenant, queue=queue, timer_key=timer_key
    )


def seal_message(
    keyring: Keyring,
    key_id: str,
    payload: bytes,
    headers: Headers,
    *,
    tenant: str,
    queue: str,
    timer_key: str,
) -> bytes:
    """The envelope of `headers` (in their order) and `payload` under `key_id`, bound to
    (tenant, queue, timer_key): `NRE2`, or `NRE1` when there are no headers."""
    cipher = keyring._cipher(_check_key_id(key_id))
    if cipher is None:
        raise ValueError(f"key id {key_id!r}: not in the keyring")
    clear = bytes(payload)
    magic = MAGIC
    if headers:
        clear = _frame_headers(headers) + clear
        magic = MAGIC_WITH_HEADERS
    header = _header(key_id, magic)
    aad = _associated_data(header, tenant, queue, timer_key)
    # A synthetic nonce: HMAC of everything sealed, under a key derived from the AES key.
    # The same (identity, headers, payload) always gives the same envelope, so a client's
    # identical retry of an encrypted schedule is the identical request the kernel answers
    # `unchanged` (a random nonce would make it a new generation, delivered twice). Different
    # inputs get independent 96-bit nonces, so key-stream reuse needs an HMAC collision; what
    # it gives away is only that two envelopes of the same timer hold the same content.
    nonce = hmac.new(keyring._nonce_keys[key_id], aad + clear, hashlib.sha256).digest()[
        :NONCE_BYTES
    ]
    return header + nonce + cipher.encrypt(nonce, clear, aad)


def parse_envelope(envelope: bytes) -> ParsedEnvelope:
    """Split an envelope into (key id, nonce, ciphertext with tag) without any key.
    Raises `EnvelopeError("not_an_envelope", ...)` when the framing is wrong."""
    data = bytes(envelope)
    if len(data) < _MIN_ENVELOPE:
        raise EnvelopeError(
            "not_an_envelope", f"{len(data)} bytes, shorter than any envelope ({_MIN_ENVELOPE})"
        )
    if data[: len(MAGIC)] not in _MAGICS:
        raise EnvelopeError(
            "not_an_envelope", f"does not start with {MAGIC!r} or {MAGIC_WITH_HEADERS!r}"
        )
    kid_len = data[len(MAGIC)]
    if not 1 <= kid_len <= MAX_KEY_ID_LENGTH:
        raise EnvelopeError("not_an_envelope", f"key id length {kid_len} out of range")
    start = len(MAGIC) + 1
    nonce_at = start + kid_len
    body_at = nonce_at + NONCE_BYTES
    if len(data) < body_at + TAG_BYTES:
        raise EnvelopeError("not_an_envelope", f"truncated: {len(data)} bytes")
    kid = data[start:nonce_at]
    # Decode as latin-1 only to test the characters; ASCII-only ids make it exact.
    key_id = kid.decode("latin-1")
    if _KEY_ID.fullmatch(key_id) is None:
        raise EnvelopeError("not_an_envelope", "key id has characters outside [A-Za-z0-9._-]")
    return ParsedEnvelope(key_id, data[nonce_at:body_at], data[body_at:])


def open_envelope(
    keyring: Keyring,
    envelope: bytes,
    *,
    tenant: str,
    queue: str,
    timer_key: str,
) -> bytes:
    """The payload sealed in `envelope` for (tenant, queue, timer_key), or `EnvelopeError`.
    The headers an `NRE2` envelope also seals are left out: `open_message` answers both."""
    return open_message(keyring, envelope, tenant=tenant, queue=queue, timer_key=timer_key).payload


def open_message(
    keyring: Keyring,
    envelope: bytes,
    *,
    tenant: str,
    queue: str,
    timer_key: str,
) -> OpenedMessage:
    """The headers and payload sealed in `envelope` for (tenant, queue, timer_key), or
    `EnvelopeError`; an `NRE1` envelope sealed no headers."""
    key_id, nonce, ciphertext = parse_envelope(envelope)
    magic = bytes(envelope[: len(MAGIC)])
    cipher = keyring._cipher(key_id)
    if cipher is None:
        raise EnvelopeError(
            "unknown_key_id", f"key id {key_id!r} is not in the keyring {list(keyring.key_ids)}"
        )
    from cryptography.exceptions import InvalidTag  # noqa: PLC0415  (a keyring imported it)

    aad = _associated_data(_header(key_id, magic), tenant, queue, timer_key)
    try:
        clear = cipher.decrypt(nonce, ciphertext, aad)
    except InvalidTag:
        raise EnvelopeError(
            "authentication_failed",
            f"under key id {key_id!r}: wrong or rotated key, an envelope sealed for another "
            "(tenant, queue, timerKey), or altered bytes",
        ) from None
    if magic == MAGIC:
        return OpenedMessage((), clear)
    return _unframe_headers(clear)
