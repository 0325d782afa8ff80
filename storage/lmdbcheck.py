"""Pre-open checks of an LMDB data file.

Theory of operation: LMDB maps the data file into memory and trusts it. A page it touches
past the end of the file kills the process with SIGBUS instead of raising an error, so a
truncated file (a partial copy, a full disk during a backup restore) must be refused before
LMDB maps it. The question is which pages LMDB can touch.

LMDB opens a file only if both meta pages (pages 0 and 1) are valid, and every transaction
starts from the one with the larger txn id. That meta's `last_pg` is the highest page ever
allocated, not a promise that the file reaches it: LMDB writes only dirty pages, and a page
allocated and freed again within one transaction (a large value stored and deleted, a page
split undone by a merge) goes onto the free list without ever being written. So a complete
file may end before `last_pg`, and LMDB uses it without trouble: a missing page is a free
one, and a writer reuses a free page without reading it (it builds the page in memory and
pwrite()s it, which extends the file). In a file LMDB wrote, a page up to `last_pg` is
reachable from the newest meta or on its free list, never both; a truncation removes pages
but does not change what the free list says. Hence three steps, each taken only when the
one before did not decide:

1. The file holds every page up to `last_pg`: accept. No page LMDB accepts can lie past its
   end (it refuses page numbers above `last_pg` with an error, not a crash). The usual case,
   two small reads.
2. Walk the free-list tree (a writer reads it, so any page of it past the end, or not what
   it should be, refuses the file) and read its records: if they list every page from the
   end of the file up to `last_pg`, only free pages are missing: accept. O(free list).
3. Otherwise decide by reachability: walk every page reachable from the newest meta (the
   main tree, each named database's tree from its F_SUBDATA leaf node, a DUPSORT database's
   sub-trees the same way, and each overflow run from its F_BIGDATA node, with the run
   length from its first page) and refuse the file at the first one that lies wholly or
   partly past its end or is not the page its parent says it is (another page number in its
   header, the wrong kind, node offsets outside the page, reached twice). LMDB writes each
   of those pages in full, so a file that passes cannot make LMDB read past its end, and a
   refusal names the page, what points to it and where the file ends. O(file): reached only
   by a real truncation, or by missing pages that are neither free nor reachable (a page
   LMDB leaked, which it never reads, so such a file is accepted).

Why both 2 and 3: a stop often leaves unwritten pages at the end of the file (in
tests/storage/test_storage_restart.py, about one stop in three), and step 3 would then read the
whole file at every such restart (seconds per GB of small rows), while step 2 costs
O(free list) and is exact for any file LMDB wrote, truncated or not. Step 2 trusts what the
free list says, as LMDB does (it hands a listed page out to the next writer): a damaged
record listing a page still in use could hide that page's absence. Damage that the size of
the file does not reveal is left, as before, to the structure walk of storage/preflight.py,
which reads every page of our databases in a forked child that survives a SIGBUS. Step 2
refuses only for the free-list tree's own pages; a record it cannot parse just leaves the
question to step 3.
Every read is an ordinary pread (never mmap), in ascending page order.

Layout (64-bit builds): a page starts with a 16-byte header: pgno u64, pad u16, flags u16,
then lower u16 and upper u16 (the free space between the node pointers and the nodes), or
for the first page of an overflow run its page count u32. Branch and leaf pages hold u16
node offsets from byte 16; a node is lo u16, hi u16, flags u16, ksize u16, the key, then
(leaves) the data, whose size is lo | hi << 16; a branch node's child is
lo | hi << 16 | flags << 32. A meta page's MDB_meta follows its header: magic, version,
address, mapsize, two 48-byte MDB_db records (free list, main database; the first one's
leading u32 is the page size), last_pg, txnid. An MDB_db is pad u32, flags u16, depth u16,
branch, leaf and overflow page counts, entries, root (u64 each). A free-list record is keyed
by the txn id that freed its pages; its value is a count u64, then that many page numbers.
"""

from __future__ import annotations

import heapq
import os
import struct
from collections.abc import Callable
from typing import NamedTuple, NoReturn

from nereus.storage.errors import StoreError

MAGIC = 0xBEEFC0DE
DATA_VERSION = 1
NUM_METAS = 2
MIN_PAGE_SIZE = 512
MAX_PAGE_SIZE = 0x10000
P_INVALID = 0xFFFF_FFFF_FFFF_FFFF  # the root of an empty tree

P_BRANCH, P_LEAF, P_OVERFLOW, P_META, P_LEAF2 = 0x01, 0x02, 0x04, 0x08, 0x20
F_BIGDATA, F_SUBDATA = 0x01, 0x02

_HEADER = struct.Struct("<QHHHH")  # pgno, pad, flags, lower, upper
_OVERFLOW_PAGES = struct.Struct("<I")  # at offset 12 of an overflow run's first page
_NODE = struct.Struct("<HHHH")  # lo, hi, flags, ksize
_U64 = struct.Struct("<Q")
_META = struct.Struct("<IIQQ")  # magic, version, address, mapsize at offset 16
_META_BYTES = 152  # header and MDB_meta up to the end of txnid
_PSIZE_OFFSET = 40
_FREE_ROOT_OFFSET = 80
_MAIN_ROOT_OFFSET = 128
_LAST_PG_OFFSET = 136
_TXNID_OFFSET = 144
_DB_BYTES = 48
_DB_ROOT_OFFSET = 40  # within an MDB_db
_HEADER_BYTES = 16
_NODE_BYTES = 8


class Meta(NamedTuple):
    page: int  # 0 or 1
    psize: int
    free_root: int
    main_root: int
    last_pg: int
    txnid: int


def _read_meta(blob: bytes, page: int) -> Meta | None:
    """The meta page in `blob` (its first bytes), or None unless LMDB would accept it."""
    if len(blob) < _META_BYTES:
        return None
    _pgno, _pad, flags, _lower, _upper = _HEADER.unpack_from(blob)
    magic, version, _addr, _mapsize = _META.unpack_from(blob, _HEADER_BYTES)
    if not flags & P_META or magic != MAGIC or version != DATA_VERSION:
        return None
    (psize,) = struct.unpack_from("<I", blob, _PSIZE_OFFSET)
    return Meta(
        page,
        psize,
        _U64.unpack_from(blob, _FREE_ROOT_OFFSET)[0],
        _U64.unpack_from(blob, _MAIN_ROOT_OFFSET)[0],
        _U64.unpack_from(blob, _LAST_PG_OFFSET)[0],
        _U64.unpack_from(blob, _TXNID_OFFSET)[0],
    )


def newest_meta(path: str) -> tuple[Meta, int]:
    """The meta page LMDB would use for `path` (an existing file) and the file's size; a
    StoreError unless both meta pages are valid, as LMDB requires."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        first = _read_meta(os.pread(f.fileno(), _META_BYTES, 0), 0)
        if first is None:
            raise StoreError(path, "not an LMDB data file (no valid meta page at offset 0)")
        psize = first.psize
        if psize < MIN_PAGE_SIZE or psize > MAX_PAGE_SIZE or psize & (psize - 1):
            raise StoreError(path, f"implausible LMDB page size {psize}")
        second = _read_meta(os.pread(f.fileno(), _META_BYTES, psize), 1)
    if second is None:
        problem = "truncated" if size < psize + _META_BYTES else "damaged"
        raise StoreError(
            path, f"{problem}: the file is {size} bytes and has no valid second meta page (page 1)"
        )
    if second.psize != psize:
        raise StoreError(
            path, f"damaged: the meta pages disagree on the page size ({psize}, {second.psize})"
        )
    # As LMDB's mdb_env_pick_meta: the larger txn id, page 0 on a tie.
    return (second if first.txnid < second.txnid else first), size


def check_data_file(path: str) -> None:
    """Raise StoreError if `path` is not a complete LMDB data file, that is if LMDB could
    reach a page past its end. A missing file is fine (a new store); an empty one is not (a
    crash during creation leaves nothing to trust)."""
    if not os.path.exists(path):
        return
    meta, size = newest_meta(path)
    if size >= (meta.last_pg + 1) * meta.psize:
        return
    with open(path, "rb") as f:
        walk = _Walk(path, f.fileno(), size, meta)
        if walk.free_list_covers_the_gap():
            return
        walk.check_reachable()


ValueSink = Callable[[bytes], None]


class _Walk:
    """Pages reachable from one meta page, read with pread in ascending page order (the
    order of the file, which keeps the reads nearly sequential on a cold cache)."""

    def __init__(self, path: str, fd: int, size: int, meta: Meta) -> None:
        self.path = path
        self.fd = fd
        self.size = size
        self.meta = meta
        self.psize = meta.psize
        self.pages = size // meta.psize  # pages wholly inside the file
        self.seen: set[int] = set()
        self.origin = f"meta page {meta.page} (txn {meta.txnid})"

    def free_list_covers_the_gap(self) -> bool:
        """Walk the free-list tree, refusing the file if it is cut or damaged (a writer
        reads it), and say whether it lists every page from the end of the file up to
        last_pg. A malformed record only makes the answer no."""
        gap: set[int] = set()
        first, last = self.pages, self.meta.last_pg

        def collect(value: bytes) -> None:
            if len(value) >= _U64.size:
                (count,) = _U64.unpack_from(value)
                listed = value[_U64.size : _U64.size * (1 + min(count, len(value) // 8 - 1))]
                gap.update(p for (p,) in _U64.iter_unpack(listed) if first <= p <= last)

        self._walk(self.meta.free_root, "the free list", collect)
        return len(gap) == last + 1 - first

    def check_reachable(self) -> None:
        """Refuse the file if a page of the main tree, a named database or an overflow
        value lies past its end or is not the page it should be. (The free-list tree, the
        rest of what is reachable, was walked by free_list_covers_the_gap, which
        check_data_file always asks first.)"""
        self._walk(self.meta.main_root, "the main database", None)

    def _walk(self, root: int, tree: str, values: ValueSink | None) -> None:
        pending = [(root, tree, self.origin)]
        while pending:
            pgno, name, ref = heapq.heappop(pending)
            if pgno != P_INVALID:  # an empty tree has no pages
                for child in self._tree_page(pgno, name, ref, values):
                    heapq.heappush(pending, child)

    def _refuse(self, problem: str, where: str) -> NoReturn:
        raise StoreError(self.path, problem, where)

    def _locate(self, pgno: int, count: int, what: str, ref: str) -> None:
        """Refuse unless pages pgno .. pgno+count-1 are in use and wholly in the file."""
        last = pgno + count - 1
        span = f"page {pgno}" if count == 1 else f"pages {pgno}-{last}"
        where = f"{span}, referenced from {ref}"
        if pgno < NUM_METAS or last > self.meta.last_pg:
            self._refuse(
                f"damaged: {what} points outside the pages in use "
                f"({NUM_METAS}-{self.meta.last_pg})",
                where,
            )
        if pgno + count > self.pages:
            self._refuse(
                f"truncated: the file is {self.size} bytes but {what} at bytes "
                f"{pgno * self.psize}-{(last + 1) * self.psize} lies past its end",
                where,
            )

    def _read(self, pgno: int, what: str, ref: str) -> bytes:
        self._locate(pgno, 1, what, ref)
        if pgno in self.seen:
            self._refuse(f"damaged: {what} is reached twice", f"page {pgno}, from {ref}")
        self.seen.add(pgno)
        blob = os.pread(self.fd, self.psize, pgno * self.psize)
        (header_pgno,) = _U64.unpack_from(blob)
        if header_pgno != pgno:
            self._refuse(f"damaged: {what} holds page {header_pgno}", f"page {pgno}, from {ref}")
        return blob

    def _tree_page(
        self, pgno: int, tree: str, ref: str, values: ValueSink | None
    ) -> list[tuple[int, str, str]]:
        """Check one branch or leaf page of `tree` and the overflow runs of its values
        (handing each value to `values`, if given); returns the tree pages it points to."""
        blob = self._read(pgno, f"a page of {tree}", ref)
        _pgno, _pad, flags, lower, upper = _HEADER.unpack_from(blob)
        kind = flags & (P_BRANCH | P_LEAF | P_OVERFLOW | P_META)
        at = f"page {pgno} of {tree} (offset {pgno * self.psize}), from {ref}"
        if kind not in (P_BRANCH, P_LEAF):
            self._refuse(f"damaged: a page of {tree} is neither branch nor leaf ({flags:#x})", at)
        if flags & P_LEAF2:
            return []  # fixed-size keys of a DUPFIXED sub-tree, no nodes
        if not _HEADER_BYTES <= lower <= upper <= self.psize or lower % 2:
            self._refuse(f"damaged: node bounds lower={lower} upper={upper}", at)
        found: list[tuple[int, str, str]] = []
        end = self.psize
        for index, (offset,) in enumerate(struct.iter_unpack("<H", blob[_HEADER_BYTES:lower])):
            here = f"{'branch' if kind == P_BRANCH else 'leaf'} page {pgno} node {index} of {tree}"
            if offset < upper or offset + _NODE_BYTES > end:
                self._refuse(f"damaged: node {index} offset {offset} is outside the page", at)
            lo, hi, node_flags, ksize = _NODE.unpack_from(blob, offset)
            data = offset + _NODE_BYTES + ksize
            if kind == P_BRANCH:
                if data > end:
                    self._refuse(f"damaged: node {index} at offset {offset} overruns the page", at)
                found.append((lo | hi << 16 | node_flags << 32, tree, here))
                continue
            dsize = lo | hi << 16
            stored = 8 if node_flags & F_BIGDATA else _DB_BYTES if node_flags & F_SUBDATA else dsize
            if data + stored > end:
                self._refuse(f"damaged: node {index} at offset {offset} overruns the page", at)
            if node_flags & F_BIGDATA:
                (first,) = _U64.unpack_from(blob, data)
                self._overflow(first, dsize, here)
                if values is not None:
                    values(os.pread(self.fd, dsize, first * self.psize + _HEADER_BYTES))
            elif node_flags & F_SUBDATA:
                key = blob[offset + _NODE_BYTES : data]
                name = (
                    f"database {key.decode(errors='replace')!r}"
                    if tree == "the main database"
                    else f"the duplicates of key {key.hex()[:32]} in {tree}"
                )
                (root,) = _U64.unpack_from(blob, data + _DB_ROOT_OFFSET)
                found.append((root, name, here))
            elif values is not None:
                values(blob[data : data + dsize])
        return found

    def _overflow(self, first: int, dsize: int, ref: str) -> None:
        """Check the overflow run holding a value of `dsize` bytes that starts at `first`."""
        what = "an overflow value"
        blob = self._read(first, what, ref)
        _pgno, _pad, flags, _lower, _upper = _HEADER.unpack_from(blob)
        (count,) = _OVERFLOW_PAGES.unpack_from(blob, 12)
        at = f"page {first} (offset {first * self.psize}), from {ref}"
        if not flags & P_OVERFLOW:
            self._refuse(f"damaged: {what} starts on a page that is not one (flags {flags:#x})", at)
        if count * self.psize < _HEADER_BYTES + dsize:
            self._refuse(f"damaged: an overflow run of {count} pages cannot hold {dsize} bytes", at)
        self._locate(first, count, f"an overflow run of {count} pages", ref)
