"""Byte-level primitives of the hot path, with a compiled twin where the build has one.

Theory of operation: each function here has a Python definition, the reference, and a
second implementation in Rust (`native/src/lib.rs`, built by setup.py as `nereus._rust`).
The module-level names are bound once, at import, to the Rust one when it was built and
this process does not run the source build, else to the reference. Both must answer alike
for every input: `tests/kernel/test_native.py` compares them on generated input, and the
simulator runs whole histories through each build (`tests/project/test_compiled.py`).

The source build (`NEREUS_PURE_PYTHON=1`, `runtime.compiled.prefer_source()`) runs the
references, so one switch gives the whole reference program. `BUILD` says which ran. No
environment is read here: the kernel stays pure, and the switch lives in the runtime.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from collections.abc import Callable
from types import ModuleType
from typing import Any


def reference_sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def reference_frame(body: bytes) -> bytes:
    return zlib.crc32(body).to_bytes(4, "big") + body


def reference_checksum_ok(data: bytes) -> bool:
    return len(data) >= 4 and zlib.crc32(data[4:]).to_bytes(4, "big") == data[:4]


def reference_blake2b_hex(data: bytes, digest_size: int, person: bytes) -> str:
    return hashlib.blake2b(data, digest_size=digest_size, person=person).hexdigest()


_SHA256_HEX = re.compile("[0-9a-f]{64}")


def reference_is_sha256_hex(text: str) -> bool:
    return _SHA256_HEX.fullmatch(text) is not None


def load() -> ModuleType | None:
    """The Rust module, or None where it was not built or the source build runs (whose
    import finder refuses it: `runtime.compiled.prefer_source`)."""
    try:
        from nereus import _rust  # noqa: PLC0415  (optional: absent from a pure build)
    except ImportError:
        return None
    module: ModuleType = _rust
    return module


_compiled = load()

BUILD: str | None = None if _compiled is None else str(_compiled.BUILD)
sha256_hex: Callable[[bytes], str] = reference_sha256_hex
frame: Callable[[bytes], bytes] = reference_frame
checksum_ok: Callable[[bytes], bool] = reference_checksum_ok
blake2b_hex: Callable[[bytes, int, bytes], str] = reference_blake2b_hex
is_sha256_hex: Callable[[str], bool] = reference_is_sha256_hex
# The fold of PUBLISHED outcomes over stored rows. Its reference is not a function here but
# the kernel's reducer (`kernel.mutations.outcome`): `storage.published` calls it only for
# records the reference would decide the same way, and the store's tests fold histories
# both ways (tests/storage/test_published_fold.py). None in the source build.
fold_published: Callable[..., Any] | None = None
# The row work of Admissions of SCHEDULED timers; its reference is
# `kernel.mutations.admission`, and `storage.admitted` checks the rest of the rule.
fold_admitted: Callable[..., Any] | None = None
# The row work of a first schedule of a timer key; its reference is
# `kernel.commands.schedule`, and `storage.scheduled` checks the command itself.
fold_scheduled: Callable[..., Any] | None = None
# The stored field order that fold relies on, compared with the model before it is used.
MESSAGE_FIELDS: tuple[str, ...] = ()
ATTEMPT_FIELDS: tuple[str, ...] = ()
TIMELINE_FIELDS: tuple[str, ...] = ()
if _compiled is not None:
    fold_published = _compiled.fold_published
    fold_admitted = _compiled.fold_admitted
    fold_scheduled = _compiled.fold_scheduled
    MESSAGE_FIELDS = tuple(_compiled.MESSAGE_FIELDS)
    ATTEMPT_FIELDS = tuple(_compiled.ATTEMPT_FIELDS)
    TIMELINE_FIELDS = tuple(_compiled.TIMELINE_FIELDS)
    sha256_hex = _compiled.sha256_hex
    frame = _compiled.frame
    checksum_ok = _compiled.checksum_ok
    blake2b_hex = _compiled.blake2b_hex
    is_sha256_hex = _compiled.is_sha256_hex
