"""Pre-open checks of an LMDB data file.

Theory of operation: LMDB maps the data file into memory and trusts it. A file that was
truncated (a partial copy, a full disk during a backup restore) makes LMDB touch pages past
the end of the file, which kills the process with SIGBUS instead of raising an error. So
before opening, read the two meta pages at the start of the file ourselves, pick the newer
valid one as LMDB would, and refuse the file if it is shorter than the last page that meta
page says is in use. Layout (64-bit builds): a 16-byte page header, then MDB_meta: magic,
version, address, mapsize, two 48-byte MDB_db records (the first one's leading u32 is the
page size), last_pg, txnid.
"""

from __future__ import annotations

import os
import struct

from storage.errors import StoreError

MAGIC = 0xBEEFC0DE
DATA_VERSION = 1
_META = struct.Struct("<IIQQ")  # magic, version, address, mapsize at offset 16
_PSIZE_OFFSET = 40
_LAST_PG_OFFSET = 136
_TXNID_OFFSET = 144


def _read_meta(blob: bytes, offset: int) -> tuple[int, int, int] | None:
    """(page size, last page, txn id) of the meta page at offset, or None if invalid."""
    if len(blob) < offset + _TXNID_OFFSET + 8:
        return None
    magic, version, _addr, _mapsize = _META.unpack_from(blob, offset + 16)
    if magic != MAGIC or version != DATA_VERSION:
        return None
    (psize,) = struct.unpack_from("<I", blob, offset + _PSIZE_OFFSET)
    (last_pg,) = struct.unpack_from("<Q", blob, offset + _LAST_PG_OFFSET)
    (txnid,) = struct.unpack_from("<Q", blob, offset + _TXNID_OFFSET)
    return psize, last_pg, txnid


def check_data_file(path: str) -> None:
    """Raise StoreError if `path` is not a complete LMDB data file. A missing file is fine
    (a new store); an empty one is not (a crash during creation leaves nothing to trust)."""
    if not os.path.exists(path):
        return
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(4096)
        first = _read_meta(head, 0)
        if first is None:
            raise StoreError(path, "not an LMDB data file (no valid meta page at offset 0)")
        psize = first[0]
        if psize < 512 or psize & (psize - 1):
            raise StoreError(path, f"implausible LMDB page size {psize}")
        f.seek(psize)
        second = _read_meta(f.read(psize), 0)
    metas = [m for m in (first, second) if m is not None]
    _psize, last_pg, txnid = max(metas, key=lambda m: m[2])
    needed = (last_pg + 1) * psize
    if size < needed:
        raise StoreError(
            path,
            f"truncated: the file is {size} bytes but its newest meta page (txn {txnid}) "
            f"uses pages up to {last_pg}, i.e. {needed} bytes",
        )
