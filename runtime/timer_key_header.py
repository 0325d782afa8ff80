"""The `nereus-timer-key` header: a timer's key as header text, reversibly.

Theory of operation: every delivered record names the timer it is (`nereus-timer-key`), so a
consumer needs no table from message id to key. A key is any non-empty string of at most
150 UTF-8 bytes without NUL (`kernel.validation.check_identity`), which may hold control
characters, line separators or other characters a header, a log line or a terminal mangles.
A key whose characters are all printable is written as itself; any other key, and a key that
itself starts with the marker, is written as the marker `b64:` followed by the standard
base64 (RFC 4648, padded) of the key's UTF-8 bytes. Decoding therefore needs one rule: a
value starting `b64:` is base64, anything else is the key. Both forms are printable UTF-8
text, so the one value is a Kafka header (its UTF-8 bytes), a Pulsar property and a local
record's header alike, at most 4 + 200 characters long.

"Printable" is Python's `str.isprintable()`: no character of Unicode's Other categories
(control, format, surrogate, private use, unassigned) or Separator categories, the ASCII
space excepted. The encoder is the only side that applies it; a consumer in any language
decodes by the marker alone.
"""

from __future__ import annotations

import base64
import binascii

# Marks a value holding the key's UTF-8 bytes in base64 rather than the key itself.
ENCODED_MARKER = "b64:"


def encode_timer_key(key: str) -> str:
    """The header text for `key`: the key itself when every character is printable and it
    does not start with the marker, else the marker and the base64 of its UTF-8 bytes."""
    if key.isprintable() and not key.startswith(ENCODED_MARKER):
        return key
    return ENCODED_MARKER + base64.b64encode(key.encode()).decode("ascii")


def decode_timer_key(value: str | bytes) -> str:
    """The timer key a `nereus-timer-key` value names (a Kafka header's bytes or a Pulsar
    property's string). Raises ValueError on a value no key encodes to."""
    text = value.decode() if isinstance(value, bytes) else value
    if not text.startswith(ENCODED_MARKER):
        return text
    try:
        return base64.b64decode(text[len(ENCODED_MARKER) :], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise ValueError(f"not an encoded timer key: {text!r}") from exc
