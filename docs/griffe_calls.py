"""Griffe extension: the library's calls as the live class has them.

Theory of operation: `service.calls.TimerCalls` makes `schedule`, `reschedule`, `cancel` and
their `_async` forms from the record builders when the module is imported (`command(...)`),
so the source holds assignments, which static analysis would list as attributes with no
signature. Once the package is loaded, this extension inspects the imported class and puts
each made call in place of its assignment: a method with the builder's parameters, the
call's return type and its own docstring, as `inspect.signature` shows it.
"""

from __future__ import annotations

import inspect
from typing import Any

import griffe

CALLS = "service.calls.TimerCalls"


class GeneratedCalls(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name != "nereus":
            return
        from nereus.service.calls import TimerCalls  # noqa: PLC0415

        static = pkg[CALLS]
        live = griffe.inspect("nereus.service.calls")["TimerCalls"]
        for name, member in live.members.items():
            if name not in static.members or not static.members[name].is_attribute:
                continue
            if not member.is_function:
                continue
            # Where the assignment is, so the page keeps the source's order.
            member.lineno = static.members[name].lineno
            member.endlineno = static.members[name].endlineno
            if inspect.iscoroutinefunction(getattr(TimerCalls, name)):
                member.labels.add("async")
            static.set_member(name, member)
