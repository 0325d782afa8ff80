"""The decoded-row memo (`storage.codec`): a row's bytes are checked and decoded once, a row
this process wrote is not decoded at all, and damaged bytes are never answered from it."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nereus import kernel as k
from nereus.kernel.model import Table
from nereus.storage import codec
from nereus.storage.errors import CorruptRecord
from tests.support.strategies import props

ROW = k.TenantUsage(live=3, bytes=1_024)


def test_a_row_written_here_is_read_back_without_decoding() -> None:
    data = codec.encode_row(Table.USAGE, ROW)
    assert codec.decode_value(Table.USAGE, bytes(data), "store", b"t") is ROW


def test_a_row_read_twice_is_decoded_once() -> None:
    # Made as another process would: positional bytes this process never remembered.
    data = codec.frame(msgspec.msgpack.encode(msgspec.structs.astuple(k.TenantUsage(7, 1))))
    first = codec.decode_value(Table.USAGE, data, "store", b"t")
    assert first == k.TenantUsage(live=7, bytes=1)
    assert codec.decode_value(Table.USAGE, bytes(data), "store", b"t") is first


def test_a_row_in_the_map_form_of_schema_5_is_refused_as_undecodable() -> None:
    data = codec.encode_value(k.TenantUsage(live=7, bytes=2))
    with pytest.raises(CorruptRecord, match="undecodable usage row: Expected `array`"):
        codec.decode_value(Table.USAGE, data, "store", b"t")
    assert codec.decode_map_row(Table.USAGE, data, "store", b"t") == k.TenantUsage(7, 2)


@props(200)
@given(st.integers(0, 10_000), st.integers(1, 255))
def test_damaged_bytes_are_never_answered_from_the_memo(at: int, flip: int) -> None:
    data = codec.encode_row(Table.USAGE, ROW)
    damaged = bytearray(data)
    damaged[at % len(data)] ^= flip
    with pytest.raises(CorruptRecord):
        codec.decode_value(Table.USAGE, bytes(damaged), "store", b"t")


def test_the_memo_is_bounded_and_keeps_what_is_in_use() -> None:
    memo = codec._Memo(rows=100)
    kept = codec.encode_value(ROW)
    memo.put(kept, ROW)
    for n in range(1_000):
        memo.put(n.to_bytes(4, "big"), ROW)
        if n % 50 == 0:
            assert memo.get(kept) is ROW  # used again: carried into the young generation
        assert len(memo.young) + len(memo.old) <= 2 * memo.rows
    assert memo.get(kept) is ROW
    assert memo.get((0).to_bytes(4, "big")) is None  # long unused: gone
