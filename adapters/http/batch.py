"""A POST batch, parsed and checked whole before anything of it is appended.

Theory of operation: the body must be exactly `{"operations": [...]}` with 1 to
`MAX_OPERATIONS` operations; each is converted into its tagged struct (unknown fields
refused), then checked in a fixed order, the kernel's where the kernel has the rule: server-owned
fields, identity, txn, payload (base64, ceiling, the envelope's room for an encrypted
queue, whose envelope also seals the headers unless the queue keeps them clear), headers,
delay, horizon. The first problem refuses the whole batch with its code from the one list
(`service.codes`, the code the library and the kernel give for the same command) and the
same text, so a bad batch never half-reaches the log.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from nereus.adapters import crypto
from nereus.adapters.http.contract import MAX_OPERATIONS, RESERVED_HEADER_PREFIX, SERVER_OWNED
from nereus.adapters.http.errors import ApiError
from nereus.adapters.tenancy import Limits
from nereus.kernel.config import KernelConfig
from nereus.kernel.timing import MAX_INSTANT_MS
from nereus.kernel.validation import check_headers, check_txn
from nereus.service.codes import (
    NAMES_JSON,
    headers_text,
    horizon_text,
    identity_text,
    payload_too_large_text,
    txn_text,
)


class _Op(msgspec.Struct, forbid_unknown_fields=True, rename="camel", tag_field="op"):
    queue: str
    timer_key: str


class ScheduleOp(_Op, tag="schedule"):
    delay_ms: int = 0
    # Base64 on the wire; msgspec decodes (and validates) it while parsing.
    payload: bytes = b""
    txn: str | None = None
    partition: str | None = None
    headers: dict[str, str] | None = None


class RescheduleOp(_Op, tag="reschedule"):
    delay_ms: int = 0
    txn: str | None = None


class CancelOp(_Op, tag="cancel"):
    txn: str | None = None


Operation = ScheduleOp | RescheduleOp | CancelOp
_KIND: dict[type[_Op], str] = {
    ScheduleOp: "schedule",
    RescheduleOp: "reschedule",
    CancelOp: "cancel",
}


@dataclass(frozen=True)
class Checked:
    """One operation of a batch, validated; `payload` is the clear payload of a schedule."""

    op: Operation
    payload: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def kind(self) -> str:
        return _KIND[type(self.op)]

    @property
    def produces(self) -> bool:
        return not isinstance(self.op, CancelOp)


def identity_problem(tenant: str, queue: str, timer_key: str, kernel: KernelConfig) -> str | None:
    return identity_text(tenant, queue, timer_key, kernel, NAMES_JSON)


T = TypeVar("T")


def json_field(body: bytes, name: str, kind: type[T], code: str, shape: str) -> T:
    """The one field of a JSON object body that must hold exactly `{name: <kind>}`."""
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise ApiError("malformed_json", str(exc)) from exc
    except RecursionError:
        # msgspec decodes nested arrays by recursion; a 2 KB body of brackets reaches the
        # interpreter's limit. No document of this API nests deeper than a few levels.
        raise ApiError("json_too_deep", "the JSON nests too deep for any document here") from None
    if not isinstance(doc, dict) or set(doc) != {name} or not isinstance(doc[name], kind):
        raise ApiError(code, f"expected {shape}")
    value: T = doc[name]
    return value


class _Batch(msgspec.Struct, forbid_unknown_fields=True):
    operations: list[Operation]


# A well-formed batch is decoded straight into its structs, in one pass over the bytes.
_BATCH = msgspec.json.Decoder(_Batch)


def parse_batch(
    body: bytes,
    *,
    tenant: str,
    limits: Limits,
    kernel: KernelConfig,
    queue_keys: Mapping[str, str] | None = None,
    clear_headers: AbstractSet[str] = frozenset(),
) -> list[Checked]:
    """The whole batch, validated, or ApiError: nothing of a bad batch is appended.
    `queue_keys` names the encrypted queues' keys; `clear_headers` those of them whose
    headers are not sealed."""
    keys = queue_keys or {}
    sealing = _Sealing(keys, clear_headers)
    try:
        ops: list[Operation] | None = _BATCH.decode(body).operations
    except (msgspec.DecodeError, RecursionError):
        ops = None  # the generic path below finds the first fault and names it
    if ops is None or not 1 <= len(ops) <= MAX_OPERATIONS:
        return _parse_generic(body, tenant=tenant, limits=limits, kernel=kernel, sealing=sealing)
    return [
        _check_typed(
            op, f"operations[{i}]", tenant=tenant, limits=limits, kernel=kernel, sealing=sealing
        )
        for i, op in enumerate(ops)
    ]


@dataclass(frozen=True)
class _Sealing:
    """What an encrypted queue seals: its key, and whether the headers go in the envelope."""

    queue_keys: Mapping[str, str]
    clear_headers: AbstractSet[str]

    def overhead_bytes(self, queue: str, headers: tuple[tuple[str, str], ...]) -> int | None:
        """How many bytes sealing `headers` for `queue` adds to the payload as stored, or
        None for a queue that is not encrypted."""
        key_id = self.queue_keys.get(queue)
        if key_id is None:
            return None
        sealed = () if queue in self.clear_headers else headers
        return crypto.sealed_size(key_id, 0, sealed)


def _parse_generic(
    body: bytes,
    *,
    tenant: str,
    limits: Limits,
    kernel: KernelConfig,
    sealing: _Sealing,
) -> list[Checked]:
    """Operation by operation from plain JSON values, so that the first problem is named
    in the order of the checks (a server-owned field before an unknown one)."""
    raw_ops = json_field(body, "operations", list, "invalid_batch", '{"operations": [...]}')
    if not 1 <= len(raw_ops) <= MAX_OPERATIONS:
        raise ApiError("invalid_batch", f"1 to {MAX_OPERATIONS} operations per call")
    return [
        _check_op(
            raw,
            f"operations[{index}]",
            tenant=tenant,
            limits=limits,
            kernel=kernel,
            sealing=sealing,
        )
        for index, raw in enumerate(raw_ops)
    ]


def _check_op(
    raw: Any,
    where: str,
    *,
    tenant: str,
    limits: Limits,
    kernel: KernelConfig,
    sealing: _Sealing,
) -> Checked:
    if isinstance(raw, dict):
        owned = sorted(str(k) for k in raw if k in SERVER_OWNED or str(k).startswith("_"))
        if owned:
            raise ApiError(
                "server_owned_field", f"{where}: {', '.join(owned)} is set by the server"
            )
    try:
        op = msgspec.convert(raw, Operation)
    except msgspec.ValidationError as exc:
        raise ApiError("invalid_operation", f"{where}: {exc}") from exc
    except RecursionError:
        raise ApiError("json_too_deep", f"{where}: nests too deep") from None
    return _check_typed(op, where, tenant=tenant, limits=limits, kernel=kernel, sealing=sealing)


def _check_typed(
    op: Operation,
    where: str,
    *,
    tenant: str,
    limits: Limits,
    kernel: KernelConfig,
    sealing: _Sealing,
) -> Checked:
    problem = identity_problem(tenant, op.queue, op.timer_key, kernel)
    if problem is not None:
        raise ApiError("invalid_identity", f"{where}: {problem}")
    if op.txn is not None and check_txn(op.txn, kernel) is not None:
        raise ApiError("invalid_txn", f"{where}: {txn_text(kernel)}")
    if isinstance(op, CancelOp):
        return Checked(op)
    checked = (
        _check_content(op, where, limits, kernel, sealing)
        if isinstance(op, ScheduleOp)
        else Checked(op)
    )
    # The timing last, as the kernel checks it: one bad command gets one code everywhere.
    if not 0 <= op.delay_ms < MAX_INSTANT_MS:
        raise ApiError(
            "invalid_timing", f"{where}: delayMs must be in [0, 2^53) ms, not {op.delay_ms}"
        )
    if op.delay_ms > limits.horizon_ms:
        raise ApiError(
            "horizon_exceeded",
            f"{where}: {horizon_text('delayMs', op.delay_ms, limits.horizon_ms)}",
        )
    return checked


def _check_content(
    op: ScheduleOp, where: str, limits: Limits, kernel: KernelConfig, sealing: _Sealing
) -> Checked:
    """A schedule's payload and headers, against the tenant's ceiling and the kernel's."""
    payload = op.payload
    ceiling = limits.payload_ceiling
    headers = tuple(sorted(op.headers.items())) if op.headers else ()
    added_bytes = sealing.overhead_bytes(op.queue, headers)
    if added_bytes is not None:
        # The ceiling is on the clear payload, but the stored envelope (with the sealed
        # headers in it) must fit the kernel.
        ceiling = min(ceiling, kernel.max_payload_bytes - added_bytes)
    if len(payload) > ceiling:
        raise ApiError(
            "payload_too_large", f"{where}: {payload_too_large_text(len(payload), ceiling)}"
        )
    if any(name.lower().startswith(RESERVED_HEADER_PREFIX) for name, _ in headers):
        raise ApiError("server_owned_field", f"{where}: nereus-* headers are set by the server")
    if check_headers(headers, kernel) is not None:
        raise ApiError("invalid_headers", f"{where}: {headers_text(kernel)}")
    return Checked(op, payload, headers)
