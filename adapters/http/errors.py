"""A refusal as a value: `ApiError` carries a code from the closed list (`contract.ERRORS`),
which alone decides the HTTP status; `Response` is what goes back on the wire."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec

from nereus.adapters.http.contract import ERROR_CODES, ERROR_STATUS

JSON = "application/json"


class ApiError(Exception):
    def __init__(self, code: str, message: str, *, headers: Sequence[tuple[str, str]] = ()) -> None:
        assert code in ERROR_CODES, code
        super().__init__(message)
        self.status = ERROR_STATUS[code]
        self.code = code
        self.headers = tuple(headers)


class Response(NamedTuple):
    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


def error_body(code: str, message: str) -> bytes:
    return msgspec.json.encode({"error": {"code": code, "message": message}})


def error_response(code: str, message: str, headers: Sequence[tuple[str, str]] = ()) -> Response:
    return Response(ERROR_STATUS[code], JSON, error_body(code, message), tuple(headers))


def json_response(status: int, doc: Any) -> Response:
    return Response(status, JSON, msgspec.json.encode(doc))
