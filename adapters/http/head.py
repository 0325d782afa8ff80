"""The checks on a request head, as pure functions of its bytes, h11's event and the limits.

Theory of operation: the connection (`adapters.http.protocol`) holds the bytes of the head
(while it arrives, in its inbox; once whole, exactly the head) and asks three questions of
them. `size_refusal`: is the request
line or the header block already over its limit (asked on every arrival, before h11 parses,
because h11 parses a complete head of any size and would report some other fault of an
oversized one, such as a missing Host)? `classify`: which refusal explains h11's protocol
error? `check_head`: does the complete head pass the rules h11 leaves to the server (version,
no obsolete line folding, a Content-Length given once and not as a list, no
Transfer-Encoding, the declared body within the limit)? Each answer is a `Refusal` with a
code from `contract.ERRORS`.

Obsolete line folding (a header line that starts with a space or a tab continues the one
before) is refused although h11 accepts it by design and joins the lines: RFC 9112 lets a
server refuse it, and a proxy in front that reads the continuation as a header of its own
(`X-A: 1` then ` Transfer-Encoding: chunked`) would frame the request differently from us.
The check is one search of the head's raw bytes for a line feed followed by a space or tab,
made before the app sees the request.
"""

from __future__ import annotations

import re

import h11

from nereus.adapters.config_file import HttpLimits

_CONTENT_LENGTH = b"\ncontent-length:"
# A line that begins with a space or tab: every line of a head ends in a line feed.
_FOLDED_LINE = re.compile(b"\n[ \t]")


class Refusal(Exception):
    def __init__(self, code: str, message: str, headers: tuple[tuple[str, str], ...] = ()):
        super().__init__(message)
        self.code = code
        self.headers = headers


def _line_limit(limits: HttpLimits) -> Refusal:
    return Refusal(
        "request_line_too_long",
        f"the request line is longer than {limits.max_request_line_bytes} bytes",
    )


def _header_limit(limits: HttpLimits) -> Refusal:
    return Refusal(
        "headers_too_large",
        f"headers: at most {limits.max_headers} lines, {limits.max_header_bytes} bytes",
    )


def size_refusal(head: bytes | bytearray, limits: HttpLimits) -> Refusal | None:
    line_end = head.find(b"\r\n")
    if (line_end if line_end >= 0 else len(head)) > limits.max_request_line_bytes:
        return _line_limit(limits)
    if line_end < 0:
        return None
    end = head.find(b"\r\n\r\n")
    if (end if end >= 0 else len(head)) - line_end - 2 > limits.max_header_bytes:
        return _header_limit(limits)
    return None


def classify(exc: h11.RemoteProtocolError, head: bytes | bytearray, limits: HttpLimits) -> Refusal:
    line_end = head.find(b"\r\n")
    line = bytes(head if line_end < 0 else head[:line_end])
    if exc.error_status_hint == 431:  # h11's buffer bound: say which part was too long
        if line_end < 0 or line_end > limits.max_request_line_bytes:
            return _line_limit(limits)
        return _header_limit(limits)
    if any(b >= 0x80 for b in line):
        return Refusal(
            "malformed_request", "the request line holds raw non-ASCII bytes: percent-encode them"
        )
    return Refusal("malformed_request", f"malformed request: {exc}")


def check_head(event: h11.Request, head: bytes | bytearray, limits: HttpLimits) -> int:
    """The checks a complete head must pass; returns the declared body length."""
    if event.http_version not in (b"1.1", b"1.0"):
        raise Refusal(
            "http_version_not_supported",
            f"HTTP/{event.http_version.decode()} is not served: use HTTP/1.1",
        )
    refusal = size_refusal(head, limits)  # a pipelined head was not measured on arrival
    if refusal is not None:
        raise refusal
    if len(event.headers) > limits.max_headers:
        raise _header_limit(limits)
    end = head.find(b"\r\n\r\n")
    if _FOLDED_LINE.search(head, 0, end if end >= 0 else len(head)) is not None:
        raise Refusal(
            "malformed_request",
            "a header line starts with a space or tab (obsolete line folding): "
            "send each header on one line",
        )
    lowered = bytes(head[: end if end >= 0 else len(head)]).lower()
    length = 0
    count = lowered.count(_CONTENT_LENGTH)
    if count > 1:
        raise Refusal("malformed_request", "Content-Length is given more than once")
    if count == 1:  # h11 checked the digits, but merged a list of equal values into one
        at = lowered.index(_CONTENT_LENGTH) + len(_CONTENT_LENGTH)
        # h11 ends a line at a bare line feed too; the carriage return is stripped below.
        line_end = lowered.find(b"\n", at)
        value = lowered[at:] if line_end < 0 else lowered[at:line_end]
        if b"," in value:
            raise Refusal("malformed_request", "Content-Length must be one count")
        length = int(value.strip())
    if any(name == b"transfer-encoding" for name, _ in event.headers):
        raise Refusal("malformed_request", "send the body with a Content-Length, not chunked")
    if length > limits.max_body_bytes:
        raise Refusal("body_too_large", f"{length} bytes > {limits.max_body_bytes} accepted")
    return length
