"""The library's calls, once, over any `TimerService`: `schedule`, `reschedule`, `cancel`,
`peek`, `list`, and `schedule_async`, ... for asyncio programs. `nereus.Nereus` (one embedded
shard) and `nereus.KafkaNereus` (the Kafka-partitioned shard log) inherit them from
`TimerCalls` and only say which service they run over (`service`) and how long a command may
wait (`timeout_s`).

Theory of operation: every argument is checked on the caller's side while its record is
built (`service.arguments`); a wrong one raises `TypeError`/`ValueError` before anything is
submitted. A command returns once durable, with the kernel's verdict as a `Result`: a refusal
by one of the kernel's rules is an answer (`ok` False, `status` `rejected`, `code` and
`message` saying which rule and why), not an exception, unless the caller asks for one with
`Result.raise_for_status()`. The async forms wait for the same durable commit without
blocking the event loop and without a thread per call (`TimerService.execute_async`).

The signature table is `service.arguments`: each command's record builder
(`schedule_record`, ...) states the call's parameters, their types and defaults exactly once.
`command(builder)` and `command_async(builder)` turn a builder into the sync and the async
method: `Command` is a descriptor typed with a `ParamSpec`, so mypy and editors see
`Nereus.schedule` as `(queue: str, timer_key: str, payload: Payload, *, delay_ms: ...) ->
Result` and `schedule_async` as the same parameters returning a coroutine of `Result`; at
run time the method carries the builder's signature (`inspect.signature`, the docs'
reference) and its own docstring. Adding a parameter to a call is one edit to its builder.
The reads (`peek`, `list`) are four short methods; an async read runs inline when the
service says its reads never wait on a lock (`inline_reads`), else on a thread.
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
import types
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Generic, ParamSpec, TypeVar, overload

from nereus.kernel.config import KernelConfig
from nereus.kernel.effects import EntryOutcome
from nereus.kernel.keys import DEFAULT_TENANT
from nereus.kernel.records import Appendable, Cancel, Reschedule, Schedule
from nereus.service.arguments import (
    cancel_record,
    identity,
    integer,
    optional_text,
    reschedule_record,
    schedule_record,
    text,
)
from nereus.service.port import TimerService
from nereus.service.results import Listing, Peek, Result, listing_of, peek_of, to_result

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")

# Rows per `list` page: the HTTP API's ceiling too.
LIST_MAX_ROWS = 1000


class Command(Generic[P, R]):
    """A method made from a record builder. For a type checker, `__get__` on an instance
    gives the bound call (typed `Callable[P, R]`) and on the class the plain function; at
    class creation (`__set_name__`) the descriptor puts that function, with `self` first,
    the builder's parameters and the docstring given here, in its place on the class."""

    def __init__(self, build: Callable[P, Appendable], doc: str, *, is_async: bool) -> None:
        self.build = build
        self.doc = doc
        self.is_async = is_async
        self.function: Callable[..., Any] = build

    def __set_name__(self, owner: type, name: str) -> None:
        qualname = f"{owner.__qualname__}.{name}"
        function = _method(self.build, name, is_async=self.is_async)
        # Python's own messages for a wrong call name the call, not the builder.
        function.__code__ = function.__code__.replace(co_qualname=qualname)
        function.__qualname__ = qualname
        function.__module__ = owner.__module__
        function.__doc__ = self.doc
        signature = inspect.signature(self.build)
        self_parameter = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        function.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[self_parameter, *signature.parameters.values()],
            return_annotation="Result",
        )
        self.function = function
        # The class keeps the plain function: instances bind it as any method, and tools
        # that read the class (inspect, the docs' reference) find a method with the
        # builder's signature. The descriptor stays what type checkers see (`__get__`).
        setattr(owner, name, function)

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Callable[..., R]: ...

    @overload
    def __get__(self, obj: TimerCalls, owner: type | None = None) -> Callable[P, R]: ...

    def __get__(self, obj: TimerCalls | None, owner: type | None = None) -> Callable[..., R]:
        if obj is None:
            return self.function
        return types.MethodType(self.function, obj)


def command(build: Callable[P, Appendable], doc: str) -> Command[P, Result]:
    """The call that builds its record with `build`, runs it and returns its `Result`."""
    return Command(build, doc, is_async=False)


def command_async(
    build: Callable[P, Appendable], doc: str
) -> Command[P, Coroutine[Any, Any, Result]]:
    """`command` awaited on the event loop."""
    return Command(build, doc, is_async=True)


def _method(build: Callable[..., Appendable], name: str, *, is_async: bool) -> types.FunctionType:
    """A function `name(self, <the builder's parameters>)` that builds the record and runs
    it. Its parameter list is written out (as `dataclasses` writes `__init__`), so a wrong
    call fails as it would on a hand-written method, and no `*args`/`**kwargs` are packed."""
    parameters = inspect.signature(build).parameters.values()
    header, passing = ["self"], []
    for parameter in parameters:
        if parameter.kind is parameter.KEYWORD_ONLY and "*" not in header:
            header.append("*")
        assert parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)
        written = parameter.name
        if parameter.default is not parameter.empty:
            written += f"=_defaults[{parameter.name!r}]"
        header.append(written)
        keyword = parameter.kind is parameter.KEYWORD_ONLY
        passing.append(f"{parameter.name}={parameter.name}" if keyword else parameter.name)
    run = "return await _run_async(self" if is_async else "return _run(self"
    source = (
        f"{'async ' if is_async else ''}def {name}({', '.join(header)}):\n"
        f"    {run}, _build({', '.join(passing)}))\n"
    )
    defaults = {p.name: p.default for p in parameters if p.default is not p.empty}
    namespace: dict[str, Any] = {
        "_build": build,
        "_defaults": defaults,
        "_run": _run,
        "_run_async": _run_async,
    }
    exec(compile(source, f"<{build.__name__} as {name}>", "exec"), namespace)
    function: types.FunctionType = namespace[name]
    return function


def _run(calls: TimerCalls, item: Appendable) -> Result:
    return calls._one(calls.service.execute([item], calls.timeout_s), item)


async def _run_async(calls: TimerCalls, item: Appendable) -> Result:
    calls._check_async()
    return calls._one(await calls.service.execute_async([item], calls.timeout_s), item)


async def read_async(
    service: TimerService, read: Callable[P, T], *args: P.args, **kwargs: P.kwargs
) -> T:
    """A read of `service` for an event loop: inline when its reads never wait on a lock,
    else on a thread (a Kafka shard's lock is held by its tick)."""
    if service.inline_reads:
        return read(*args, **kwargs)
    return await asyncio.to_thread(read, *args, **kwargs)


def _page(queue: str, after: str | None, limit: int, tenant: str) -> tuple[str, str | None, int]:
    """The checked arguments of `list`: (tenant, after, limit)."""
    text("queue", queue)
    limit = integer("limit", limit)
    if not 1 <= limit <= LIST_MAX_ROWS:
        raise ValueError(f"limit must be in 1..{LIST_MAX_ROWS}, not {limit}")
    return text("tenant", tenant), optional_text("after", after), limit


class TimerCalls:
    """The calls; a subclass sets `service` (the `TimerService` they run over) and may set
    `timeout_s` (how long a command waits for its durable commit)."""

    service: TimerService
    timeout_s: float = 30.0

    @property
    def kernel_config(self) -> KernelConfig:
        """The shard's kernel config, by which a refusal's message states its limits."""
        return self.service.kernel_config

    def _check_async(self) -> None:
        """Raise when an async command could not be answered now (the embedded facade: its
        runtime has no thread yet), before anything is submitted."""

    def _one(self, outcomes: Sequence[EntryOutcome], item: Appendable) -> Result:
        record = item[0]
        assert isinstance(record, Schedule | Reschedule | Cancel)
        return to_result(outcomes[0], record, self.kernel_config)

    # Commands: the signatures are the builders' (service.arguments) -------------------------

    schedule = command(
        schedule_record,
        """Schedule (or upsert) the timer `timer_key` of `queue` to deliver `payload` at
        `deliver_at_ms`, or `delay_ms` after the command's persistence time (neither: at
        once). Without `txn` a fresh one is drawn; give one to make a retry safe.""",
    )
    schedule_async = command_async(
        schedule_record, """`schedule`, awaited without blocking the event loop."""
    )
    reschedule = command(
        reschedule_record,
        """New timing for a pending timer: a new generation, the same payload.""",
    )
    reschedule_async = command_async(
        reschedule_record, """`reschedule`, awaited without blocking the event loop."""
    )
    cancel = command(
        cancel_record,
        """Cancel a pending timer; `too_late` once it crossed Admission, `absent` when no
        timer is pending under this key (it may have been delivered).""",
    )
    cancel_async = command_async(
        cancel_record, """`cancel`, awaited without blocking the event loop."""
    )

    # Reads ----------------------------------------------------------------------------------

    def peek(self, queue: str, timer_key: str, *, tenant: str = DEFAULT_TENANT) -> Peek:
        """The timer's row as stored (an encrypted payload stays an envelope)."""
        tenant, queue, timer_key = identity(tenant, queue, timer_key)
        return self.service.peek(queue, timer_key, tenant=tenant)

    async def peek_async(self, queue: str, timer_key: str, *, tenant: str = DEFAULT_TENANT) -> Peek:
        """`peek` for an event loop."""
        tenant, queue, timer_key = identity(tenant, queue, timer_key)
        return await read_async(self.service, self.service.peek, queue, timer_key, tenant=tenant)

    def list(
        self,
        queue: str,
        *,
        after: str | None = None,
        limit: int = 100,
        tenant: str = DEFAULT_TENANT,
    ) -> Listing:
        """Up to `limit` live timers of `queue` (SCHEDULED, PUBLISHING, UNCERTAIN) with keys
        after `after` in UTF-8 byte order, without payloads."""
        tenant, after, limit = _page(queue, after, limit, tenant)
        return self._listing(queue, after, limit, tenant)

    async def list_async(
        self,
        queue: str,
        *,
        after: str | None = None,
        limit: int = 100,
        tenant: str = DEFAULT_TENANT,
    ) -> Listing:
        """`list` for an event loop."""
        tenant, after, limit = _page(queue, after, limit, tenant)
        return await read_async(self.service, self._listing, queue, after, limit, tenant)

    def _listing(self, queue: str, after: str | None, limit: int, tenant: str) -> Listing:
        rows, truncated = self.service.list_timers(queue, after, limit, tenant=tenant)
        page: builtins.list[Peek] = [peek_of(m, None, None) for m in rows]
        return listing_of(page, truncated)
