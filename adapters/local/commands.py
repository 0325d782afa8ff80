"""The library's calls under their earlier names: they live in the application layer now.

`TimerCommands` is `service.calls.TimerCalls` (the calls `nereus.Nereus` and
`nereus.KafkaNereus` share, made once over the `service.port.TimerService` port) and
`await_command` is `service.embedded.await_command`. Nothing is defined here; new code
imports from `nereus.service`.
"""

from __future__ import annotations

from nereus.service.calls import LIST_MAX_ROWS, TimerCalls
from nereus.service.embedded import await_command

TimerCommands = TimerCalls

__all__ = ["LIST_MAX_ROWS", "TimerCommands", "await_command"]
