"""The routes that append: POST /api/v1/timers (a batch), DELETE /api/v1/timers/{queue}/{key}.

Theory of operation: a batch is checked whole before anything is appended
(`batch.parse_batch`); then the tenant's rate and, for a batch that would produce, the
blocks, quota and storage (`policy`); a batch that passes the quota holds what it may add to
the usage until its commit is answered, so concurrent batches count each other. Each checked
operation becomes a record carrying the credential's tenant and subject, built by the
application layer's builders (`service.arguments`; a schedule sealed first when its
queue is encrypted), the batch is appended as one unit through the port
(`TimerService.execute_async`) and answered in request order once durable, each outcome
shaped by `service.results.to_result` in the API's names.

A DELETE goes through `TimerService.cancel_async` with the credential's delete bucket as its
`may_append`: the service appends a pending timer's cancel with or without a token and may
refuse (429 rate_limited) only one it has judged from committed state to cancel nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from nereus.adapters import crypto
from nereus.adapters.http import routing
from nereus.adapters.http.batch import CancelOp, Checked, RescheduleOp, ScheduleOp, parse_batch
from nereus.adapters.http.contract import METERED_STATUSES
from nereus.adapters.http.errors import ApiError, Response, json_response
from nereus.adapters.http.policy import Policy, quota_need
from nereus.adapters.http.routing import Request
from nereus.adapters.http.shapes import result_json
from nereus.adapters.metering import Meter, Reservation
from nereus.adapters.tenancy import Limits, Principal, Tenancy
from nereus.kernel.config import KernelConfig
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.records import Appendable, Cancel
from nereus.kernel.validation import check_txn
from nereus.runtime.errors import Overloaded, RuntimeHalted
from nereus.service.arguments import cancel_record, reschedule_record, schedule_record
from nereus.service.codes import NAMES_JSON
from nereus.service.errors import Unavailable
from nereus.service.port import TimerService
from nereus.service.results import to_result

# A read of the service for the event loop: inline or on the API's read threads.
Reader = Callable[..., Awaitable[Any]]


@contextlib.contextmanager
def commit_errors() -> Iterator[None]:
    """The physical answers every commit shares."""
    try:
        yield
    except Overloaded as exc:
        raise ApiError("overloaded", str(exc), headers=(("Retry-After", "1"),)) from exc
    except (RuntimeHalted, TimeoutError, Unavailable) as exc:
        raise ApiError("unavailable", str(exc)) from exc


class Writes:
    """The handlers of the two appending routes, over the service and the tenancy's policy."""

    def __init__(
        self,
        service: TimerService,
        *,
        tenancy: Tenancy,
        policy: Policy,
        meter: Meter,
        limits: dict[str, Limits],
        commit_timeout_s: float,
        read: Reader,
    ) -> None:
        self.service = service
        self.tenancy = tenancy
        self.kernel: KernelConfig = service.kernel_config
        self.policy = policy
        self.meter = meter
        self.limits = limits
        self.commit_timeout_s = commit_timeout_s
        self.read = read

    async def _commit(self, items: list[Appendable]) -> list[EntryOutcome]:
        with commit_errors():
            return await self.service.execute_async(items, self.commit_timeout_s)

    async def post(self, who: Principal | None, req: Request) -> Response:
        assert who is not None
        policy = self.policy.tenant(who)
        checked = parse_batch(
            req.body,
            tenant=who.tenant,
            limits=self.limits[who.tenant],
            kernel=self.kernel,
            queue_keys=policy.queue_keys,
            clear_headers=policy.clear_header_queues,
        )
        self.policy.take_rate(who, len(checked))
        reservation = await self._admit(who, checked) if any(c.produces for c in checked) else None
        items = [self._item(who, c) for c in checked]
        try:
            outcomes = await self._commit(items)
        finally:
            if reservation is not None:
                # Answered or failed: what it committed is in the usage later checks read.
                reservation.release()
        results = [
            result_json(to_result(outcome, item[0], self.kernel, NAMES_JSON), c.kind)
            for c, item, outcome in zip(checked, items, outcomes, strict=True)
        ]
        metered = sum(
            1
            for c, r in zip(checked, results, strict=True)
            if c.produces and r["status"] in METERED_STATUSES
        )
        if metered:
            self.meter.add(who.tenant, metered)
        return json_response(200, {"results": results})

    async def _admit(self, who: Principal, checked: list[Checked]) -> Reservation | None:
        """A producing batch's checks after the rate: blocks, quota, storage. Returns the
        quota reservation the batch holds until its commit is answered (None without a
        quota)."""
        self.policy.check_block(who)
        policy = self.policy.tenant(who)
        reservation = None
        if policy.has_quota:
            need = quota_need(checked, policy.queue_keys, policy.clear_header_queues)
            reservation = await self.read(
                self.policy.reserve_quota, who, need, self.service.tenant_usage
            )
        try:
            self.policy.check_storage(await self.read(self.service.map_usage))
        except BaseException:
            if reservation is not None:
                reservation.release()
            raise
        return reservation

    def _item(self, who: Principal, c: Checked) -> Appendable:
        op = c.op
        if isinstance(op, CancelOp):
            return cancel_record(op.queue, op.timer_key, tenant=who.tenant, txn=op.txn)
        if isinstance(op, RescheduleOp):
            return reschedule_record(
                op.queue, op.timer_key, tenant=who.tenant, txn=op.txn, delay_ms=op.delay_ms
            )
        payload, headers, encrypted = c.payload, c.headers, False
        policy = self.policy.tenant(who)
        key_id = policy.queue_keys.get(op.queue)
        if key_id is not None:
            # Sealed headers ride inside the envelope, so the record carries none in clear.
            sealed = policy.sealed_headers(op.queue)
            payload = self._seal(who, key_id, op, c.payload, headers if sealed else ())
            headers, encrypted = (() if sealed else headers), True
        return schedule_record(
            op.queue,
            op.timer_key,
            payload,
            tenant=who.tenant,
            delay_ms=op.delay_ms,
            txn=op.txn,
            partition=op.partition,
            headers=headers,
            producer_sub=who.subject,
            encrypted=encrypted,
        )

    def _seal(
        self,
        who: Principal,
        key_id: str,
        op: ScheduleOp,
        clear: bytes,
        headers: tuple[tuple[str, str], ...],
    ) -> bytes:
        """The envelope to schedule. Sealing is deterministic (adapters/crypto.py) and the
        headers come sorted, so an identical retry is the identical request and the kernel
        answers `unchanged`."""
        return crypto.seal_message(
            self.tenancy.keyring,
            key_id,
            clear,
            headers,
            tenant=who.tenant,
            queue=op.queue,
            timer_key=op.timer_key,
        )

    async def delete(self, who: Principal, req: Request, queue: str, timer_key: str) -> Response:
        """A DELETE whose path the API has checked."""
        txn = routing.parse_query(req.query).get("txn")
        if txn is not None and check_txn(txn, self.kernel) is not None:
            raise ApiError("invalid_query", f"txn must be 1..{self.kernel.max_txn_bytes} bytes")
        item = cancel_record(queue, timer_key, tenant=who.tenant, txn=txn)
        cancel = item[0]
        assert isinstance(cancel, Cancel)
        with commit_errors():
            outcomes = await self.service.cancel_async(
                [item], lambda: self.policy.take_delete(who), self.commit_timeout_s
            )
        if outcomes is None:
            raise self.policy.refuse_delete(who)
        result = to_result(outcomes[0], cancel, self.kernel, NAMES_JSON)
        return json_response(200, result_json(result, "cancel"))
