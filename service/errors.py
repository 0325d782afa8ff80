"""Errors a `TimerService` raises to the edges above it (the HTTP API, the library facades).

Theory of operation: the Kafka service and the embedded service both answer "cannot commit
now" and "not this process's shard"; the HTTP edge turns them into 503 answers. They are part
of the port (`service.port`), so an edge catches them without importing the implementation.
"""

from __future__ import annotations


class Unavailable(RuntimeError):
    """The backend cannot append or answer right now (the command may or may not have been
    appended: a retry of a schedule with the same txn is safe)."""


class ShardNotLocal(Exception):
    """Kafka mode: a read of a shard this process does not own (or is still catching up
    on)."""
