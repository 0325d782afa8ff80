"""The timer API as an ASGI 3 application: the request read whole, `TimerApi` answers.

Theory of operation: the app is a plain ASGI callable, so any ASGI server can host it; the
limits it can enforce itself, it does (a declared length over `max_body_bytes` is refused
before the body is read, a body that grows past it while arriving too, a Content-Length
that is not digits is malformed), and everything it answers is JSON from `TimerApi`. What
only the connection can see (deadlines, line and header sizes, the HTTP version, a repeated
Content-Length) is `adapters.http.protocol`'s job. Lifespan events are acknowledged: the
API's resources belong to whoever built it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from nereus.adapters.http.api import TimerApi
from nereus.adapters.http.errors import ApiError, Response, error_response

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class TimerAsgiApp:
    def __init__(self, api: TimerApi) -> None:
        self.api = api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        headers: dict[str, str] = {}
        for raw_name, raw_value in scope["headers"]:
            name = raw_name.decode("latin-1").lower()
            value = raw_value.decode("latin-1")
            # A repeated header is one comma-joined value (RFC 9110 5.3): a second
            # Authorization then fails to parse instead of one of them winning silently.
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        try:
            body = await self._body(headers, receive)
            if body is None:
                return  # the client went away before its body arrived: nobody to answer
            raw_path = scope.get("raw_path") or scope["path"].encode("utf-8")
            path, query = _ascii(raw_path), _ascii(scope.get("query_string", b""))
        except ApiError as exc:
            await _write(send, error_response(exc.code, str(exc), exc.headers))
            return
        response = await self.api.respond(scope["method"], path, query, body, headers)
        await _write(send, response)

    async def _body(self, headers: dict[str, str], receive: Receive) -> bytes | None:
        limit = self.api.max_body_bytes
        declared = headers.get("content-length")
        if declared is not None:
            if not declared.isascii() or not declared.isdigit():
                raise ApiError("malformed_request", "Content-Length must be one count of digits")
            if int(declared) > limit:
                raise ApiError("body_too_large", f"{declared} bytes > {limit} accepted")
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise ApiError("body_too_large", f"more than {limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _ascii(raw: bytes) -> str:
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        raise ApiError(
            "malformed_request", "the request target holds raw non-ASCII bytes"
        ) from None


async def _write(send: Send, response: Response) -> None:
    headers = [
        (b"content-type", response.content_type.encode()),
        (b"content-length", str(len(response.body)).encode()),
        *((name.encode("latin-1"), value.encode("latin-1")) for name, value in response.headers),
    ]
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
