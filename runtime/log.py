"""Structured logs: one JSON object per line on stderr.

Theory of operation: operators grep and ship logs; a line per event with stable keys
(`ts`, `level`, `event`, then fields) serves both. Nothing here decides what to log.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, TextIO

import msgspec

_encoder = msgspec.json.Encoder(enc_hook=str)
LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}


class Logger:
    def __init__(self, out: TextIO | None = None, *, level: str = "info", **context: Any) -> None:
        self._out = out or sys.stderr
        self._level = LEVELS[level]
        self._context = context
        self._lock = threading.Lock()

    def bind(self, **context: Any) -> Logger:
        child = Logger(self._out, level="info", **{**self._context, **context})
        child._level = self._level
        child._lock = self._lock
        return child

    def _emit(self, level: str, event: str, fields: dict[str, Any]) -> None:
        if LEVELS[level] < self._level:
            return
        record = {"ts": round(time.time(), 3), "level": level, "event": event}
        record.update(self._context)
        record.update(fields)
        line = _encoder.encode(record).decode()
        with self._lock:
            self._out.write(line + "\n")
            self._out.flush()

    def debug(self, event: str, **fields: Any) -> None:
        self._emit("debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._emit("info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._emit("warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._emit("error", event, fields)


class NullLogger(Logger):
    def _emit(self, level: str, event: str, fields: dict[str, Any]) -> None:
        return None
