"""Structured logs through the standard `logging` module: an event name and key/values.

    log = Logger().bind(shard=3)           # records go to logging.getLogger("nereus")
    log.child("http").info("tenant_block", tenant="acme", blocked=True)

Theory of operation: every component logs to `nereus` or a child of it (`nereus.http`,
`nereus.http.access`, ...) as a standard `LogRecord` whose message is the event name and
whose `fields` attribute holds the key/values, so an application that embeds Nereus routes,
filters and formats them like any other library's records. As a library Nereus installs no
handler of its own (only a `NullHandler`, the convention for libraries): nothing is printed
until the application configures logging.

The service (`nereus serve`) calls `configure_json_logging`: one handler on the root logger
whose `JsonFormatter` writes one JSON object per line (`ts`, `level`, `event`, `logger`, then
the fields), so the records of uvicorn, asyncio and anything else in the process come out as
JSON lines too. One handler writes each line under its lock, so lines never interleave. A
client that hung up is not a fault of the server: its exception is logged without a
traceback.
"""

from __future__ import annotations

import logging
import sys
import traceback
from typing import Any, TextIO

import msgspec

ROOT = "nereus"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
LEVELS["error"] = logging.ERROR

_encoder = msgspec.json.Encoder(enc_hook=str)
logging.getLogger(ROOT).addHandler(logging.NullHandler())


class Logger:
    """A named logger with bound context; `info("event", key=value)` emits one record."""

    def __init__(self, name: str = ROOT, **context: Any) -> None:
        self._logger = logging.getLogger(name)
        self._context = context

    @property
    def name(self) -> str:
        return self._logger.name

    def bind(self, **context: Any) -> Logger:
        return Logger(self.name, **{**self._context, **context})

    def child(self, suffix: str) -> Logger:
        return Logger(f"{self.name}.{suffix}", **self._context)

    def enabled(self, level: str) -> bool:
        return self._logger.isEnabledFor(LEVELS[level])

    def _emit(self, level: int, event: str, fields: dict[str, Any]) -> None:
        if not self._logger.isEnabledFor(level):
            return
        merged = {**self._context, **fields} if self._context else fields
        self._logger.log(level, event, extra={"event": event, "fields": merged}, stacklevel=3)

    def debug(self, event: str, **fields: Any) -> None:
        self._emit(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._emit(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._emit(logging.WARNING, event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._emit(logging.ERROR, event, fields)


class NullLogger(Logger):
    """The default where no logger is passed. It is an ordinary `Logger` on `nereus` (the
    name is older than the routing to `logging`): silent until the application configures
    logging, never dropping records an application asked for."""


# Exceptions that say the peer went away: expected on a server, logged without traceback.
_DISCONNECTS = (ConnectionError, TimeoutError)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "event": getattr(record, "event", None) or "log",
            "logger": record.name,
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                doc.setdefault(key, value)
        else:
            doc["message"] = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            doc["error"] = repr(exc)
            if not isinstance(exc, _DISCONNECTS):
                doc["traceback"] = "".join(traceback.format_exception(exc))
        return _encoder.encode(doc).decode()


def configure_json_logging(stream: TextIO | None = None, level: str = "info") -> logging.Handler:
    """The service's logging: every record of the process as a JSON line on `stream`
    (stderr). Replaces the root logger's handlers; returns the handler installed."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(handlers=[handler], level=LEVELS[level], force=True)
    return handler
