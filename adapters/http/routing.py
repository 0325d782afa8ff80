"""The route table, matched once, and strict decoding of what a URL carries.

Theory of operation: `contract.ROUTES` is the only list of routes. Each path template
becomes one anchored pattern (`{queue}` one segment, `{timerKey}` the rest of the path, so
`tenant/42` is a key written naturally); a request's raw path is matched against them in
order, and the template found names the route for the grant check, the handler and the
metrics label alike. A known path with another method is 405, anything else 404.

Parameters are matched on the raw, still percent-encoded path and only then decoded, each on
its own, from percent-escapes to bytes to UTF-8 with no replacement: invalid UTF-8 is refused
(`invalid_path` / `invalid_query`), so two different byte strings can never become one key.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from typing import Final, NamedTuple

from nereus.adapters.http.contract import ROUTES, Route
from nereus.adapters.http.errors import ApiError

_PARAM = re.compile(r"\{(\w+)\}")
# A queue is one path segment; a timerKey is the rest of the path. Empty ones match, so that
# they are refused as invalid_path by the identity check rather than as an unknown route.
_PARAM_PATTERN: Final = {"queue": r"[^/]*", "timerKey": r".*"}
# Known methods are labelled as themselves in metrics; anything else is "other", so a client
# cannot grow the label set.
_METHODS: Final = frozenset({"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "TRACE"})


class Request:
    """One request as the handlers see it: decoded path parameters, the raw query, the
    body read whole, and lower-cased header names."""

    __slots__ = ("body", "headers", "method", "params", "query")

    def __init__(
        self,
        method: str,
        params: dict[str, str],
        query: str,
        body: bytes,
        headers: Mapping[str, str],
    ) -> None:
        self.method = method
        self.params = params
        self.query = query
        self.body = body
        self.headers = headers


def _compile(template: str) -> re.Pattern[str]:
    parts: list[str] = []
    at = 0
    for m in _PARAM.finditer(template):
        parts.append(re.escape(template[at : m.start()]))
        parts.append(f"(?P<{m.group(1)}>{_PARAM_PATTERN[m.group(1)]})")
        at = m.end()
    parts.append(re.escape(template[at:]))
    return re.compile("".join(parts))


class _Template(NamedTuple):
    path: str
    pattern: re.Pattern[str]
    by_method: dict[str, Route]


def _templates() -> tuple[_Template, ...]:
    found: dict[str, _Template] = {}
    for route in ROUTES:
        t = found.get(route.path)
        if t is None:
            t = found[route.path] = _Template(route.path, _compile(route.path), {})
        t.by_method[route.method] = route
    return tuple(found.values())


_TEMPLATES: Final = _templates()


class Match(NamedTuple):
    route: Route
    params: dict[str, str]

    @property
    def label(self) -> str:
        return f"{self.route.method} {self.route.path}"


def match(method: str, raw_path: str) -> Match:
    """The route of a request and its decoded path parameters, or ApiError (404, 405,
    invalid_path)."""
    for t in _TEMPLATES:
        m = t.pattern.fullmatch(raw_path)
        if m is None:
            continue
        route = t.by_method.get(method)
        if route is None:
            allowed = ", ".join(sorted(t.by_method))
            raise ApiError(
                "method_not_allowed",
                f"{t.path} takes {allowed}",
                headers=(("Allow", allowed),),
            )
        return Match(route, {name: _decode(value, name) for name, value in m.groupdict().items()})
    raise ApiError("not_found", "no such route")


def label(method: str, raw_path: str) -> str:
    """A bounded metrics label: a known method and a route template, else "other"."""
    if method not in _METHODS:
        return "other"
    for t in _TEMPLATES:
        if t.pattern.fullmatch(raw_path) is not None:
            return f"{method} {t.path}"
    return "other"


def _decode(raw: str, name: str) -> str:
    try:
        return urllib.parse.unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError("invalid_path", f"{name} is not UTF-8 once percent-decoded") from None


def parse_query(query: str) -> Mapping[str, str]:
    """`a=1&b=2` as a mapping, each name and value percent-decoded (`+` is a space) to
    UTF-8 with no replacement. A name given twice is refused rather than guessed at."""
    out: dict[str, str] = {}
    for pair in query.split("&"):
        if not pair:
            continue
        raw_name, _, raw_value = pair.partition("=")
        try:
            name = urllib.parse.unquote_to_bytes(raw_name.replace("+", " ")).decode("utf-8")
            value = urllib.parse.unquote_to_bytes(raw_value.replace("+", " ")).decode("utf-8")
        except UnicodeDecodeError:
            raise ApiError("invalid_query", "a query parameter is not UTF-8") from None
        if name in out:
            raise ApiError("invalid_query", f"{name} given more than once")
        out[name] = value
    return out
