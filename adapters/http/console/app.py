"""The operator console at `/console`: who is asking, which page, and the answer as HTML.

Theory of operation: `TimerApi.respond` hands every path under `/console` here. A request
is matched against `ROUTES` (method and path, `{name}` one segment), then its principal is
found: the bearer header if it carries one (a script), else the session cookie set at login
(`session`); with authentication off, everyone is the default tenant holding every grant, as
on the API. A page needs the `read` grant, an action `admin`, and every POST from a cookie
session must carry the form's CSRF token. Handlers (`pages`, `actions`) then read through
the service's inspection port (`service.inspect`), each read bounded by a page size, and
render a template (`render`). Requests are counted in the API's request metrics under
their route template, like any route.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import msgspec

from nereus.adapters.http import routing
from nereus.adapters.http.console import render
from nereus.adapters.http.console.audit import Audits
from nereus.adapters.http.console.lag import LagSampler
from nereus.adapters.http.console.lag_merge import LagView, SiblingLag, machine_view
from nereus.adapters.http.console.session import (
    Session,
    Sessions,
    cookie_value,
    set_cookie,
)
from nereus.adapters.http.errors import ApiError, Response
from nereus.adapters.tenancy import Principal
from nereus.service.audit_view import AuditPort
from nereus.service.inspect import Inspection
from nereus.storage.store import ShardStore

if TYPE_CHECKING:
    from nereus.adapters.http.api import TimerApi

PREFIX: Final = "/console"
FORM: Final = "application/x-www-form-urlencoded"


@dataclass(frozen=True)
class Ctx:
    """One console request: who asks, with what, and what the page needs to render."""

    who: Principal
    session: Session | None  # None: a bearer header (no CSRF token needed)
    csrf: str
    path: str
    target: str  # the path and its query, as asked: where a preference form comes back to
    query: Mapping[str, str]
    form: Mapping[str, str]
    zone: str | None
    auth_disabled: bool
    # Taken once per request: under `--processes` each one asks the siblings afresh.
    inspection: Inspection | None = None


Handler = Callable[["Console", Ctx, dict[str, str]], Awaitable[Response]]


@dataclass(frozen=True)
class ConsoleRoute:
    method: str
    path: str
    needs: str  # "public" | "read" | "admin"
    handler: Handler


class Console:
    def __init__(self, api: TimerApi, *, session_key: bytes | None = None) -> None:
        self.api = api
        self.sessions = Sessions(session_key)
        self.lag = LagSampler(api.service.metrics)
        # Under `serve --processes`: asks every sibling for its lag windows (set by
        # `adapters.compose.processes.join_siblings`); None draws this process's alone.
        self.sibling_lag: SiblingLag | None = None
        # The audits this process runs; `audits` answers for the machine (under
        # `--processes`, `adapters.compose.processes.join_siblings` sets it to ask the
        # siblings as well).
        self.local_audits = Audits(self.local_store_paths)
        self.audits: AuditPort = self.local_audits

    @property
    def inspection(self) -> Inspection | None:
        """Asked afresh: under `--processes` the service learns its siblings after the API
        was built, and its inspection then answers for them too."""
        return self.api.service.inspection()

    def local_stores(self) -> Mapping[int, ShardStore]:
        inspection = self.inspection
        return inspection.shard_stores() if inspection is not None else {}

    def lag_view(self) -> LagView:
        """The fire-lag windows of the whole machine (may ask the siblings: off the loop)."""
        return machine_view(self.lag, self.sibling_lag)

    def lag_answer(self) -> bytes:
        """This process's lag windows, as a sibling asks for them; the first question starts
        the sampler, as a first page does."""
        self.lag.start()
        return msgspec.msgpack.encode(self.lag.deltas())

    def local_store_paths(self) -> Mapping[int, str]:
        return {shard: store.path for shard, store in self.local_stores().items()}

    def close(self) -> None:
        self.lag.stop()
        self.local_audits.stop()

    async def respond(
        self, method: str, raw_path: str, query: str, body: bytes, headers: Mapping[str, str]
    ) -> tuple[str, Response]:
        """The route label for metrics and the answer."""
        route, params = _match(method, raw_path)
        label = f"{method} {route.path}" if route is not None else "other"
        if route is None:
            return label, render.page(
                "error.html", render.bare("Not found", "no such page"), status=404
            )
        self.lag.start()
        q = routing.parse_query(query)
        form = _form(body, headers) if method == "POST" else {}
        if route.needs == "public":
            ctx = Ctx(
                _NOBODY,
                None,
                "",
                raw_path,
                _target(raw_path, query),
                q,
                form,
                _zone(headers),
                self.disabled,
            )
            return label, await route.handler(self, ctx, params)
        found = self._principal(headers)
        if found is None:
            if method == "GET":
                return label, render.redirect(f"{PREFIX}/login")
            return label, self.refusal("You are not logged in.", 401)
        who, session, extra = found
        csrf = self.sessions.csrf(session) if session is not None else ""
        ctx = Ctx(
            who,
            session,
            csrf,
            raw_path,
            _target(raw_path, query),
            q,
            form,
            _zone(headers),
            self.disabled,
            self.inspection,
        )
        if route.needs not in who.grants:
            return label, self.refusal(f"This page needs the {route.needs!r} grant.", 403, ctx)
        if (
            method == "POST"
            and session is not None
            and not self.sessions.csrf_ok(session, form.get("csrf"))
        ):
            return label, self.refusal("The form's CSRF token is missing or wrong.", 403, ctx)
        response = await route.handler(self, ctx, params)
        if extra:
            response = response._replace(headers=response.headers + extra)
        return label, response

    @property
    def disabled(self) -> bool:
        return self.api.auth.disabled

    def _principal(
        self, headers: Mapping[str, str]
    ) -> tuple[Principal, Session | None, tuple[tuple[str, str], ...]] | None:
        """The principal, its session (None: bearer), and headers to add (a new anonymous
        session's cookie)."""
        if "authorization" in headers and not self.disabled:
            try:
                return self.api.auth.authenticate(headers["authorization"]), None, ()
            except Exception:
                return None
        session = self.sessions.read(cookie_value(headers.get("cookie")))
        if session is None:
            if not self.disabled:
                return None
            session, value = self.sessions.issue("")
            cookie = (("Set-Cookie", set_cookie(value, secure=_secure(headers))),)
            anyone = self.api.auth.principal_of(b"")
            assert anyone is not None  # authentication is off: everyone is one principal
            return anyone, session, cookie
        try:
            digest = bytes.fromhex(session.digest)
        except ValueError:
            return None
        who = self.api.auth.principal_of(digest)
        return (who, session, ()) if who is not None else None

    def refusal(self, message: str, status: int, ctx: Ctx | None = None) -> Response:
        context = render.bare("Refused", message) if ctx is None else self.context(ctx, "Refused")
        context["message"] = message
        return render.page("error.html", context, status=status)

    def context(self, ctx: Ctx, title: str, **values: object) -> dict[str, object]:
        """What every page's frame needs, and the page's own values."""
        zone = render.zone_of(ctx.zone)
        return {
            "title": title,
            "who": ctx.who,
            "csrf": ctx.csrf,
            "auth_disabled": ctx.auth_disabled,
            "logged_in": ctx.session is not None and not ctx.auth_disabled,
            "zone": zone,
            "zone_name": str(zone) if zone else "",
            "when": lambda ms: render.when(ms, zone),
            "path": ctx.path,
            "target": ctx.target,
            "is_admin": "admin" in ctx.who.grants,
            "inspection": ctx.inspection is not None,
            **values,
        }


_NOBODY: Final = Principal("", None, frozenset())


def _target(raw_path: str, query: str) -> str:
    return f"{raw_path}?{query}" if query else raw_path


def _zone(headers: Mapping[str, str]) -> str | None:
    return cookie_value(headers.get("cookie"), render.ZONE_COOKIE)


def _secure(headers: Mapping[str, str]) -> bool:
    """Behind a TLS-terminating proxy that says so, the cookie is sent over HTTPS only."""
    return headers.get("x-forwarded-proto", "").lower() == "https"


def _form(body: bytes, headers: Mapping[str, str]) -> Mapping[str, str]:
    content_type = headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != FORM:
        return {}
    try:
        return routing.parse_query(body.decode("ascii"))
    except (UnicodeDecodeError, ApiError):
        return {}


_PARAM = re.compile(r"\{(\w+)\}")
_ROUTES: list[tuple[re.Pattern[str], ConsoleRoute]] = []


def route(method: str, path: str, needs: str) -> Callable[[Handler], Handler]:
    """Register a handler for `method path` (a decorator used by `pages` and `actions`)."""

    def register(handler: Handler) -> Handler:
        parts = [re.escape(p) for p in _PARAM.split(path)]
        # split() leaves the names at odd places: each becomes one path segment.
        for i in range(1, len(parts), 2):
            parts[i] = f"(?P<{_PARAM.split(path)[i]}>[^/]+)"
        pattern = re.compile("".join(parts))
        _ROUTES.append((pattern, ConsoleRoute(method, path, needs, handler)))
        return handler

    return register


def _match(method: str, raw_path: str) -> tuple[ConsoleRoute | None, dict[str, str]]:
    for pattern, r in _ROUTES:
        if r.method != method:
            continue
        m = pattern.fullmatch(raw_path)
        if m is not None:
            try:
                params = {k: routing._decode(v, k) for k, v in m.groupdict().items()}
            except ApiError:
                return None, {}
            return r, params
    return None, {}
