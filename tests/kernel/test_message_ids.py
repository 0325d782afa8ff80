"""A message id is the 16-byte BLAKE2b of "tenant NUL queue NUL timer key" (UTF-8),
personalised `nereus.msgid.v1`, in lowercase hex, and never changes between versions: the
store, the logs and the destinations' headers all name messages by it. Stated here from
that definition (hashlib's BLAKE2b), whichever implementation `kernel.native` bound."""

from __future__ import annotations

import hashlib

from hypothesis import given
from hypothesis import strategies as st

from nereus.kernel.keys import message_id

_NAMES = st.text(st.characters(codec="utf-8", exclude_characters="\x00"))


@given(_NAMES, _NAMES, _NAMES)
def test_a_message_id_is_the_personalised_blake2b_of_its_identity(
    tenant: str, queue: str, timer_key: str
) -> None:
    identity = f"{tenant}\x00{queue}\x00{timer_key}".encode()
    expected = hashlib.blake2b(identity, digest_size=16, person=b"nereus.msgid.v1").hexdigest()
    assert message_id(tenant, queue, timer_key) == expected


def test_a_message_id_is_the_one_every_earlier_version_gave() -> None:
    # Written down once, from the definition above: a change of hash, input layout or
    # personalisation would rename every stored message.
    assert message_id("default", "orders", "order-42") == "2f4a52c18a90073e1fca8c3ff3df629c"
