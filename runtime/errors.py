"""The runtime's exceptions, in a module of their own: `runtime.shard` is compiled with mypyc,
which cannot compile subclasses of RuntimeError (setup.py)."""

from __future__ import annotations


class RuntimeHalted(RuntimeError):
    """The runtime stopped on an error it must not guess past; restart replays the log."""


class Overloaded(RuntimeError):
    """The intake queue is full; retry later."""
