"""The consumer of the local destination for asyncio: `async for` without a thread.

    async with nereus.open_async_consumer("data", "reminders", group="mailer") as consumer:
        async for record in consumer:          # waits without blocking the loop
            await send_mail(record.payload)    # committed when the loop asks for the next

Theory of operation: an `AsyncConsumer` is a `LocalConsumer` (the same group position, the
same lock per group and topic, the same rules: `adapters.local.consumer`) driven from the
event loop. Reading a page of records is an LMDB read of microseconds and runs inline;
committing a position is a synced write (an fsync) and runs in the loop's default executor,
awaited, so the loop never stalls on the disk. Waiting for records neither polls nor holds
a thread: the consumer owns a FIFO in the destination's `wake/` folder
(`adapters.local.wake`), the writer of the destination writes a byte into it after every
committed batch of sends (whether that writer is this process's runtime or a `nereus serve`
elsewhere), and the loop's reader callback on the FIFO wakes the waiting task. The callback
drains the FIFO at once, so wake-ups that arrive while the program is busy cost one call,
never a spinning loop.

At least once, as the sync consumer: with `auto_commit` (the default) a record counts as
handled when the `async for` asks for the next one, and the handled records are committed
(one synced write) when the page handed out is done, before waiting for more, and at
`close()`; a record whose loop body raised, or that the loop left by `break`, is not
committed and is handed out again by the next `async for` (of this consumer or the
group's next). A process that dies before a commit hands out again what it had not
committed. Without auto commit only `await commit()` commits.

One task uses a consumer at a time: its position is not guarded against two tasks
iterating it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import deque
from collections.abc import AsyncIterator
from typing import NoReturn

from nereus.adapters.local.consumer import (
    DEFAULT_MAX_BATCH,
    LocalConsumer,
    check_timeout_s,
    open_consumer,
)
from nereus.adapters.local.destination import LocalRecord
from nereus.adapters.local.wake import BACKSTOP_S, UNWAKEABLE_POLL_S, Waker
from nereus.kernel.keys import DEFAULT_TENANT


class AsyncConsumer:
    """Reads one tenant's queue of the local destination for one consumer group, from
    asyncio. Make one with `open_async_consumer` (another process than the service) or
    `Nereus.async_consumer` (the process that has the directory open)."""

    def __init__(self, consumer: LocalConsumer) -> None:
        self._c = consumer
        self._waker: Waker | None = None
        self._arrived: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._polled: int | None = None  # auto commit: the end of the last poll's batch

    @property
    def queue(self) -> str:
        return self._c.queue

    @property
    def tenant(self) -> str:
        return self._c.tenant

    @property
    def group(self) -> str:
        return self._c.group

    @property
    def auto_commit(self) -> bool:
        return self._c.auto_commit

    @property
    def committed(self) -> int:
        """The group's durable position: the first offset it has not handled."""
        return self._c.committed

    @property
    def position(self) -> int:
        """The next offset this consumer hands out."""
        return self._c.position

    async def poll(
        self, timeout_s: float | None = 0.0, max_records: int | None = None
    ) -> list[LocalRecord]:
        """Up to `max_records` (default `max_batch`) records from the position on, waiting
        up to `timeout_s` (None: until there are some, or `close()`). With auto commit,
        what the previous poll returned is committed first."""
        self._c._check_open()
        if self.auto_commit and self._polled is not None:
            self._c._handled = max(self._c._handled, self._polled)
            self._polled = None
            await self._flush()
        batch = await self._fetch(timeout_s, max_records or self._c.max_batch)
        if batch:
            self._c._next = batch[-1].offset + 1
            if self.auto_commit:
                self._polled = self._c._next
        return batch

    async def commit(self, record: LocalRecord | None = None) -> None:
        """Durably mark handled every record handed out up to `record` (default: all handed
        out so far); the write runs in the default executor."""
        self._c._check_open()
        await asyncio.get_running_loop().run_in_executor(None, self._c.commit, record)

    def records(
        self, *, limit: int | None = None, idle_timeout_s: float | None = None
    ) -> AsyncIterator[LocalRecord]:
        """Each record in turn, waiting for more; ends after `limit` records (None: no
        limit), after `idle_timeout_s` without a new record (None: never), or at
        `close()`."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise TypeError(f"limit must be an int or None, not {type(limit).__name__}")
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        return _Records(self, limit, idle_timeout_s)

    def __aiter__(self) -> AsyncIterator[LocalRecord]:
        return self.records()

    def rewind(self) -> None:
        """Hand out again, from the committed position, what was not committed."""
        self._c.rewind()
        self._polled = None

    async def close(self) -> None:
        """Stop: a waiting `poll` or `async for` returns. With auto commit, what was handled
        is committed first (in the executor)."""
        if self._c._closed.is_set():
            return
        try:
            if self.auto_commit:
                await self._flush()
        finally:
            self._c.close()  # and so `_forget_waker`

    def _forget_waker(self) -> None:
        if self._waker is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._waker.fileno())
            self._waker.close()
        if self._arrived is not None:
            self._arrived.set()

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _flush(self) -> None:
        c = self._c
        if c._handled > c._committed and not c._closed.is_set():
            await asyncio.get_running_loop().run_in_executor(None, c._flush)

    async def _fetch(self, timeout_s: float | None, max_records: int) -> list[LocalRecord]:
        """Records from the position on, waiting for some without blocking the loop; what
        was handled is committed before waiting."""
        c = self._c
        check_timeout_s(timeout_s)
        if c._closed.is_set():
            return []
        batch = c._destination.read(c.topic, c._next, max_records)
        if batch:
            return batch
        if self.auto_commit:
            await self._flush()
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        arrived = self._listen(loop)
        while not c._closed.is_set():
            # Cleared before the read: a wake-up after it (the writer commits after the
            # read) sets the event again, one before it is in what the read sees.
            arrived.clear()
            batch = c._destination.read(c.topic, c._next, max_records)
            if batch:
                return batch
            # Without a FIFO (`_listen` could not make one) nothing wakes it: it looks.
            most = BACKSTOP_S if self._waker is not None else UNWAKEABLE_POLL_S
            left = most if deadline is None else min(deadline - loop.time(), most)
            if left <= 0:
                return []
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(arrived.wait(), left)
        return []

    def _listen(self, loop: asyncio.AbstractEventLoop) -> asyncio.Event:
        """The event the writer's wake-ups set (made on first use, kept until close)."""
        if self._arrived is not None and self._loop is loop:
            return self._arrived
        if self._loop is not None and self._waker is not None:
            self._loop.remove_reader(self._waker.fileno())
        arrived = asyncio.Event()
        if self._waker is None:
            try:
                self._waker = Waker(self._c._destination.path)
            except OSError:  # no FIFO here: `_fetch` looks every UNWAKEABLE_POLL_S
                self._loop, self._arrived = loop, arrived
                return arrived
            # Closed with the consumer however it is closed (`Nereus.close` closes it too).
            self._c._on_close.append(self._forget_waker)
        waker = self._waker

        def on_wake() -> None:
            waker.drain()  # at once: a readable FIFO left full would call this forever
            arrived.set()

        loop.add_reader(waker.fileno(), on_wake)
        self._loop, self._arrived = loop, arrived
        return arrived


class _Records:
    """`AsyncConsumer.records()`: an async iterator, not an async generator, so a loop
    left by `break` leaves nothing to finalise later: the record it left is simply never
    marked handled."""

    def __init__(self, owner: AsyncConsumer, limit: int | None, idle_timeout_s: float | None):
        self._owner = owner
        self._left = limit
        self._idle_timeout_s = idle_timeout_s
        self._page: deque[LocalRecord] = deque()
        self._out: LocalRecord | None = None  # handed out, handled once the loop asks again
        self._started = False

    def __aiter__(self) -> _Records:
        return self

    async def __anext__(self) -> LocalRecord:
        owner, c = self._owner, self._owner._c
        if not self._started:
            self._started = True
            if owner.auto_commit and not c._closed.is_set():
                # What an earlier loop left (or a poll handed out) is handed out again.
                await owner._flush()
                owner.rewind()
        if self._out is not None and owner.auto_commit:
            c._handled = max(c._handled, self._out.offset + 1)
        self._out = None
        if c._closed.is_set() or self._left == 0:
            await self._finish()
        if not self._page:
            if owner.auto_commit:
                await owner._flush()  # the page is done: one write for all of it
            want = c.max_batch if self._left is None else min(self._left, c.max_batch)
            self._page.extend(await owner._fetch(self._idle_timeout_s, want))
            if not self._page:
                await self._finish()
        record = self._page.popleft()
        c._next = record.offset + 1
        self._out = record
        if self._left is not None:
            self._left -= 1
        return record

    async def _finish(self) -> NoReturn:
        if self._owner.auto_commit:
            await self._owner._flush()
        raise StopAsyncIteration


def open_async_consumer(
    data_dir: str | os.PathLike[str],
    queue: str,
    *,
    group: str,
    tenant: str = DEFAULT_TENANT,
    auto_commit: bool = True,
    max_batch: int = DEFAULT_MAX_BATCH,
) -> AsyncConsumer:
    """`open_consumer`'s asyncio form: use as `async with open_async_consumer(...) as c:
    async for record in c: ...`. Same arguments, same refusals."""
    return AsyncConsumer(
        open_consumer(
            data_dir,
            queue,
            group=group,
            tenant=tenant,
            auto_commit=auto_commit,
            max_batch=max_batch,
        )
    )
