"""Payload encryption at schedule (adapters/crypto.py): envelopes open only with the right key
and only for the timer they were sealed for; every failure to open is an `EnvelopeError` with
a reason, never wrong bytes and never another exception; the keyring refuses bad keys without
echoing them; and the embedded library delivers an envelope unchanged, with the
`nereus-encryption` header. Headers sealed with the payload (`NRE2`) never appear in the
envelope, open with it, and are in no file of the data directory, a snapshot or an export.
"""

from __future__ import annotations

import base64
import re
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import nereus.adapters.crypto
from nereus.adapters import Nereus
from nereus.adapters.clock import SimulatedClock
from nereus.adapters.crypto import (
    ALGORITHM,
    ENVELOPE_OVERHEAD_BYTES,
    EnvelopeError,
    Keyring,
    headers_frame_bytes,
    open_envelope,
    open_message,
    parse_envelope,
    seal,
    seal_message,
    sealed_size,
)
from nereus.adapters.local.destination import LocalDestination
from nereus.kernel.keys import message_id
from nereus.kernel.model import Message, Table
from nereus.runtime.destination import H_ENCRYPTION, PreparedPublish
from nereus.runtime.prepare import ENCRYPTION_ALGORITHM, prepare, prepare_dead_letter
from nereus.storage.jsonl import export_log
from nereus.storage.snapshot import write_snapshot
from tests.support.file_modes import files_holding
from tests.support.runtime_harness import T0_MS
from tests.support.strategies import props

KEY_A = base64.b64encode(bytes(range(32))).decode()
KEY_B = base64.b64encode(bytes(range(100, 132))).decode()
# "k1" and "k3" differ by one bit and share key material: only the key id's place in the
# associated data stops a relabelled envelope from opening.
KEYRING = Keyring({"k1": KEY_A, "k3": KEY_A, "k0": KEY_B, "k": KEY_B})
IDENT = {"tenant": "acme", "queue": "reminders", "timer_key": "trial:acme:day7"}

identities = st.fixed_dictionaries(
    {"tenant": st.text(max_size=40), "queue": st.text(max_size=40), "timer_key": st.text()}
)


def _flip(data: bytes, bit: int) -> bytes:
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


def _fails(
    envelope: bytes, keyring: Keyring = KEYRING, *, ident: dict[str, str] | None = None
) -> EnvelopeError:
    with pytest.raises(EnvelopeError) as info:
        open_envelope(keyring, envelope, **(IDENT if ident is None else ident))
    return info.value


# Round trip and format ---------------------------------------------------------------------


def test_round_trip_and_envelope_layout() -> None:
    payload = b'{"kind":"day7"}'
    envelope = seal(KEYRING, "k1", payload, **IDENT)
    assert open_envelope(KEYRING, envelope, **IDENT) == payload
    assert envelope[:4] == b"NRE1" and envelope[4] == 2 and envelope[5:7] == b"k1"
    assert len(envelope) == len(payload) + ENVELOPE_OVERHEAD_BYTES("k1") == len(payload) + 35
    key_id, nonce, ciphertext = parse_envelope(envelope)
    assert (key_id, nonce) == ("k1", envelope[7:19]) and ciphertext == envelope[19:]
    assert payload not in envelope
    # Deterministic: the same payload for the same timer seals to the same bytes (an
    # identical retry stays identical); another payload or timer gets another nonce.
    assert seal(KEYRING, "k1", payload, **IDENT) == envelope
    other = seal(KEYRING, "k1", payload + b"!", **IDENT)
    assert parse_envelope(other).nonce != nonce
    moved = seal(KEYRING, "k1", payload, **{**IDENT, "timer_key": "elsewhere"})
    assert parse_envelope(moved).nonce != nonce
    assert open_envelope(KEYRING, seal(KEYRING, "k1", b"", **IDENT), **IDENT) == b""


def test_overhead_counts_the_key_id() -> None:
    assert ENVELOPE_OVERHEAD_BYTES("k") == 4 + 1 + 1 + 12 + 16
    assert ENVELOPE_OVERHEAD_BYTES("x" * 64) == 4 + 1 + 64 + 12 + 16
    with pytest.raises(ValueError, match="key id"):
        ENVELOPE_OVERHEAD_BYTES("")


def test_the_runtime_header_names_the_same_algorithm() -> None:
    assert ALGORITHM == ENCRYPTION_ALGORITHM == "aes-256-gcm"
    assert H_ENCRYPTION == "nereus-encryption"


def test_module_docstring_example_runs() -> None:
    doc = nereus.adapters.crypto.__doc__
    assert doc is not None
    example = doc.split("\n\n")[1]
    exec(compile(re.sub(r"(?m)^    ", "", example), "adapters/crypto.py", "exec"), {})


@props(200)
@given(payload=st.binary(max_size=4096), ident=identities, key_id=st.sampled_from(["k1", "k0"]))
def test_open_inverts_seal(payload: bytes, ident: dict[str, str], key_id: str) -> None:
    envelope = seal(KEYRING, key_id, payload, **ident)
    assert len(envelope) == len(payload) + ENVELOPE_OVERHEAD_BYTES(key_id)
    assert open_envelope(KEYRING, envelope, **ident) == payload


# Tampering, moving, rotating, truncating ---------------------------------------------------


@pytest.mark.parametrize("key_id", ["k1", "k"])
@pytest.mark.parametrize("payload", [b"", b"x", b'{"kind":"day7"}'])
def test_every_single_bit_flip_fails_to_open(key_id: str, payload: bytes) -> None:
    envelope = seal(KEYRING, key_id, payload, **IDENT)
    reasons = set()
    for bit in range(len(envelope) * 8):
        reasons.add(_fails(_flip(envelope, bit)).reason)
    assert reasons <= {"not_an_envelope", "unknown_key_id", "authentication_failed"}
    assert "authentication_failed" in reasons and "not_an_envelope" in reasons


@props(300)
@given(payload=st.binary(max_size=512), ident=identities, data=st.data())
def test_a_bit_flip_anywhere_never_yields_bytes(
    payload: bytes, ident: dict[str, str], data: st.DataObject
) -> None:
    envelope = seal(KEYRING, "k1", payload, **ident)
    bit = data.draw(st.integers(0, len(envelope) * 8 - 1), label="bit")
    with pytest.raises(EnvelopeError):
        open_envelope(KEYRING, _flip(envelope, bit), **ident)


def test_a_relabelled_envelope_fails_even_when_both_ids_hold_the_same_key() -> None:
    envelope = seal(KEYRING, "k1", b"secret", **IDENT)
    relabelled = envelope[:6] + b"3" + envelope[7:]
    assert parse_envelope(relabelled).key_id == "k3"
    assert _fails(relabelled).reason == "authentication_failed"


@pytest.mark.parametrize(
    "moved",
    [
        {"tenant": "globex"},
        {"queue": "invoices"},
        {"timer_key": "trial:acme:day8"},
        # The same concatenation, split differently: the length prefixes tell them apart.
        {"tenant": "acmereminders", "queue": ""},
        {"queue": "reminderstrial:acme:day7", "timer_key": ""},
    ],
)
def test_an_envelope_moved_to_another_timer_fails(moved: dict[str, str]) -> None:
    envelope = seal(KEYRING, "k1", b"secret", **IDENT)
    error = _fails(envelope, ident={**IDENT, **moved})
    assert error.reason == "authentication_failed"


@props(200)
@given(payload=st.binary(max_size=256), a=identities, b=identities)
def test_an_envelope_opens_only_for_its_own_identity(
    payload: bytes, a: dict[str, str], b: dict[str, str]
) -> None:
    envelope = seal(KEYRING, "k1", payload, **a)
    if a == b:
        assert open_envelope(KEYRING, envelope, **b) == payload
    else:
        with pytest.raises(EnvelopeError):
            open_envelope(KEYRING, envelope, **b)


def test_a_key_rotated_under_the_same_id_cannot_open_older_envelopes() -> None:
    # The declared consequence (specs/http.md): replacing a key under its id strands what
    # was sealed before; rotation means a new id.
    envelope = seal(Keyring({"k1": KEY_A}), "k1", b"sealed before the rotation", **IDENT)
    error = _fails(envelope, Keyring({"k1": KEY_B}))
    assert error.reason == "authentication_failed"
    removed = _fails(envelope, Keyring({"k2": KEY_B}))
    assert removed.reason == "unknown_key_id" and "'k1'" in str(removed)
    assert KEY_A not in str(error) + str(removed) and KEY_B not in str(error) + str(removed)


@pytest.mark.parametrize("key_id", ["k1", "x" * 64])
def test_every_truncation_fails_cleanly(key_id: str) -> None:
    keyring = Keyring({key_id: KEY_A})
    envelope = seal(keyring, key_id, b"0123456789abcdef", **IDENT)
    body_at = len(envelope) - 16 - 16  # where the ciphertext starts
    for n in range(len(envelope)):
        error = _fails(envelope[:n], keyring)
        framing_intact = n >= body_at + 16
        expected = "authentication_failed" if framing_intact else "not_an_envelope"
        assert error.reason == expected, n


@pytest.mark.parametrize(
    "junk",
    [b"", b"NRE1", b"{}", b"NRE0" + bytes(40), b"NRE1\x00" + bytes(40), b"NRE1\x41" + bytes(40)],
)
def test_non_envelopes_are_named_as_such(junk: bytes) -> None:
    assert _fails(junk).reason == "not_an_envelope"
    with pytest.raises(EnvelopeError):
        parse_envelope(junk)


def test_an_unknown_key_id_is_named() -> None:
    envelope = seal(Keyring({"old-2023.1": KEY_A}), "old-2023.1", b"x", **IDENT)
    error = _fails(envelope)
    assert error.reason == "unknown_key_id" and "old-2023.1" in str(error)
    assert isinstance(error, ValueError)


# Keyring -----------------------------------------------------------------------------------


def test_keyring_accepts_valid_keys_and_never_shows_them() -> None:
    keyring = Keyring({"k1": KEY_A, "prod_2024-06.v2": " " + KEY_B + "\n"})
    assert keyring.key_ids == ("k1", "prod_2024-06.v2") and len(keyring) == 2
    assert "k1" in keyring and "k2" not in keyring and list(keyring) == list(keyring.key_ids)
    assert KEY_A not in repr(keyring) and KEY_B not in repr(keyring)
    assert "k1" in repr(keyring)
    assert Keyring({}).key_ids == ()


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"k1": base64.b64encode(bytes(16)).decode()}, r"'k1'.*16 bytes.*32"),
        ({"k1": base64.b64encode(bytes(33)).decode()}, r"'k1'.*33 bytes"),
        ({"k1": ""}, r"'k1'.*0 bytes"),
        ({"k1": "not base64 at all!!"}, r"'k1'.*not valid base64"),
        ({"k1": KEY_A[:-1]}, r"'k1'.*not valid base64"),
        ({"k1": "ключ" + KEY_A}, r"'k1'.*not valid base64"),
        ({"k1": bytes(32)}, r"'k1'.*base64 string"),
        ({"": KEY_A}, r"key id ''.*1\.\.64"),
        ({"x" * 65: KEY_A}, r"key id 'xxxxxxxxxxxxxxxx\.\.\.'.*1\.\.64"),
        ({"a b": KEY_A}, r"key id 'a b'.*\[A-Za-z0-9\._-\]"),
        ({"k1\n": KEY_A}, r"key id 'k1\\n'"),
        ({"clé": KEY_A}, r"key id 'clé'"),
        ({"a/b": KEY_A}, r"key id 'a/b'"),
    ],
)
def test_keyring_validation_names_the_key_id_and_the_problem(
    keys: dict[str, str], message: str
) -> None:
    with pytest.raises(ValueError, match=message) as info:
        Keyring(keys)
    for material in keys.values():
        if isinstance(material, str) and len(material) > 4:
            assert material not in str(info.value)
    assert info.value.__cause__ is None


def test_seal_refuses_an_unknown_or_invalid_key_id() -> None:
    with pytest.raises(ValueError, match=r"'k2'.*not in the keyring"):
        seal(KEYRING, "k2", b"x", **IDENT)
    with pytest.raises(ValueError, match="key id"):
        seal(KEYRING, "k 1", b"x", **IDENT)


# The embedded library path -----------------------------------------------------------------


def test_the_embedded_library_delivers_the_envelope_unchanged_with_the_header(
    tmp_path: Path,
) -> None:
    clock = SimulatedClock(T0_MS, error_ms=5)
    payload = b'{"kind":"day7","card":"4242"}'
    envelope = seal(KEYRING, "k1", payload, tenant="default", queue="q", timer_key="secret")
    with Nereus.open(str(tmp_path), clock=clock) as n:
        dest = n.destination
        assert isinstance(dest, LocalDestination)
        sealed = n.schedule("q", "secret", envelope, delay_ms=1_000, encrypted=True)
        plain = n.schedule("q", "plain", b"clear", delay_ms=1_000)
        assert sealed.status == plain.status == "scheduled"
        peek = n.peek("q", "secret")
        assert peek.encrypted is True and peek.payload is not None
        assert peek.payload == envelope  # the store holds only the envelope
        n.start()
        clock.advance(1_000 + 5)
        deadline = time.monotonic() + 20
        while len(list(dest.iter_all("q"))) < 2:
            assert n.runtime.halted is None, n.runtime.halted
            assert time.monotonic() < deadline, "timed out waiting for the deliveries"
            time.sleep(0.01)
        records = {r.message_id: r for r in dest.iter_all("q")}
    assert sealed.message_id is not None and plain.message_id is not None

    record = records[sealed.message_id]
    assert record.encrypted is True and record.payload == envelope
    headers = dict(record.headers)
    assert headers[H_ENCRYPTION] == "aes-256-gcm"
    assert payload.decode() not in str(record.headers)
    opened = open_envelope(
        KEYRING, record.payload, tenant="default", queue=record.queue, timer_key="secret"
    )
    assert opened == payload
    clear = records[plain.message_id]
    assert clear.payload == b"clear" and H_ENCRYPTION not in dict(clear.headers)
    assert clear.encrypted is False


def test_the_dead_letter_copy_of_an_encrypted_message_carries_the_header(
    tmp_path: Path,
) -> None:
    envelope = seal(KEYRING, "k0", b"x", tenant="default", queue="q", timer_key="dl")
    with Nereus.open(str(tmp_path), clock=SimulatedClock(T0_MS)) as n:
        n.schedule("q", "dl", envelope, delay_ms=1_000, encrypted=True)
        n.schedule("q", "plain", b"x", delay_ms=1_000)
        with n.store.read() as view:
            sealed = view.get(Table.MESSAGES, message_id("default", "q", "dl").encode())
            clear = view.get(Table.MESSAGES, message_id("default", "q", "plain").encode())
        assert isinstance(sealed, Message) and isinstance(clear, Message)
        prepared = prepare(sealed, envelope, n.destination, "p")
        assert isinstance(prepared, PreparedPublish) and prepared.value == envelope
        dead = prepare_dead_letter(
            sealed, envelope, n.destination, attempts_spent=3, failures=3, last_error="e"
        )
        clear_prepared = prepare(clear, b"x", n.destination, "p")
        assert isinstance(clear_prepared, PreparedPublish)
    for p in (prepared, dead):
        assert p.encrypted and (H_ENCRYPTION, b"aes-256-gcm") in p.headers
    assert dead.value == envelope and dead.topic == "q.dlq"
    assert all(name != H_ENCRYPTION for name, _ in clear_prepared.headers)


# Sealed headers (NRE2) ---------------------------------------------------------------------

# Distinctive text: found in bytes only where it was put, never by chance.
_MARK = "zq-clear-"
header_texts = st.text(
    alphabet=st.characters(exclude_categories=["Cs"]), min_size=0, max_size=24
).map(lambda s: _MARK + s)


def test_headers_seal_as_nre2_and_open_with_the_payload() -> None:
    headers = [("plan", "gold"), ("x-card", "4111 1111"), ("plan", "again")]
    envelope = seal_message(KEYRING, "k1", b"{}", headers, **IDENT)
    assert envelope[:4] == b"NRE2" and envelope[4] == 2 and envelope[5:7] == b"k1"
    # The frame: a 4-byte count, then per header 4 + name + 4 + value (UTF-8 bytes).
    frame = 4 + (8 + 4 + 4) + (8 + 6 + 9) + (8 + 4 + 5)
    assert len(envelope) == 2 + 35 + frame == sealed_size("k1", 2, headers)
    assert headers_frame_bytes(headers) == frame and headers_frame_bytes([]) == 0
    # In their order, duplicates kept; open_envelope answers the payload alone.
    assert open_message(KEYRING, envelope, **IDENT) == (tuple(headers), b"{}")
    assert open_envelope(KEYRING, envelope, **IDENT) == b"{}"
    assert parse_envelope(envelope).key_id == "k1"
    # Without headers the envelope is NRE1, byte for byte what it was before NRE2.
    bare = seal_message(KEYRING, "k1", b"{}", [], **IDENT)
    assert bare == seal(KEYRING, "k1", b"{}", **IDENT) and bare[:4] == b"NRE1"
    assert open_message(KEYRING, bare, **IDENT) == ((), b"{}")
    assert sealed_size("k1", 2) == len(bare) == 2 + 35


def test_the_magic_is_authenticated_both_ways() -> None:
    with_headers = seal_message(KEYRING, "k1", b"x", [("a", "b")], **IDENT)
    without = seal(KEYRING, "k1", b"x", **IDENT)
    # Relabelled NRE2 -> NRE1 would hand the frame out as payload; NRE1 -> NRE2 would read
    # payload bytes as headers. Neither opens.
    assert _fails(b"NRE1" + with_headers[4:]).reason == "authentication_failed"
    assert _fails(b"NRE2" + without[4:]).reason == "authentication_failed"


@props(200)
@given(
    headers=st.lists(st.tuples(header_texts, header_texts), max_size=6),
    payload=header_texts.map(str.encode),
    ident=identities,
)
def test_sealed_headers_and_payload_never_appear_in_the_envelope(
    headers: list[tuple[str, str]], payload: bytes, ident: dict[str, str]
) -> None:
    envelope = seal_message(KEYRING, "k1", payload, headers, **ident)
    for text in [payload.decode(), *(t for pair in headers for t in pair)]:
        assert text.encode() not in envelope
    assert _MARK.encode() not in envelope
    assert open_message(KEYRING, envelope, **ident) == (tuple(headers), payload)
    assert len(envelope) == sealed_size("k1", len(payload), headers)
    # Bound to its timer like a payload-only envelope.
    with pytest.raises(EnvelopeError):
        open_message(KEYRING, envelope, **{**ident, "timer_key": ident["timer_key"] + "!"})


def test_the_library_path_keeps_sealed_headers_out_of_every_file(tmp_path: Path) -> None:
    """The library stores and delivers what it is given: a caller that seals its headers
    into the envelope finds none of them, nor the payload, in the shard store, the local
    destination, a snapshot or an export; its consumer opens both from the record."""
    clear_headers = [("x-holder", "Ada Lovelace"), ("x-plan", "platinum-annual")]
    payload = b'{"card":"4242-4242-4242-4242"}'
    ident = {"tenant": "default", "queue": "q", "timer_key": "secret"}
    envelope = seal_message(KEYRING, "k1", payload, clear_headers, **ident)
    clock = SimulatedClock(T0_MS, error_ms=5)
    data = tmp_path / "data"
    with Nereus.open(str(data), clock=clock) as n:
        result = n.schedule("q", "secret", envelope, delay_ms=1_000, encrypted=True)
        assert result.status == "scheduled"
        dest = n.destination
        assert isinstance(dest, LocalDestination)
        n.start()
        clock.advance(1_000 + 5)
        deadline = time.monotonic() + 20
        while not list(dest.iter_all("q")):
            assert n.runtime.halted is None, n.runtime.halted
            assert time.monotonic() < deadline, "timed out waiting for the delivery"
            time.sleep(0.01)
        (record,) = dest.iter_all("q")
        write_snapshot(n.store)
        with open(tmp_path / "export.jsonl", "w", encoding="utf-8") as out:
            export_log(n.store, out)
    assert record.payload == envelope and record.encrypted
    assert all(name not in dict(clear_headers) for name, _ in record.headers)
    opened = open_message(KEYRING, record.payload, **ident)
    assert opened == (tuple(clear_headers), payload)
    needles = [payload, *(t.encode() for pair in clear_headers for t in pair)]
    searched = [*data.rglob("*"), tmp_path / "export.jsonl"]
    assert any(p.name.startswith("snapshot-") for p in searched)
    assert files_holding(searched, needles) == []
