"""Pages as HTML: the Jinja2 environment, the console's headers, and how a time is shown.

Theory of operation: templates are autoescaped (every value a store or a request holds is
text, never markup), and the pages carry no script at all, so the Content-Security-Policy
can forbid every script and inline style outright: a value that slipped past escaping still
could not run. Charts are inline SVG drawn with presentation attributes, which the policy's
`style-src 'self'` does not govern. Jinja2 is used because autoescaping, template
inheritance and a sandboxed expression language are what a page needs and what a string
format does not give safely.

Times are epoch milliseconds everywhere below; a page shows each in UTC and in the zone the
viewer chose (`nereus_tz` cookie, an IANA name checked by `zoneinfo`), with the ISO form in
the `<time datetime>` attribute.
"""

from __future__ import annotations

import datetime as dt
import os
import zoneinfo
from typing import Any, Final

import jinja2
from markupsafe import Markup, escape

from nereus.adapters.http.errors import Response

HTML: Final = "text/html; charset=utf-8"
# No script, no inline style, no frames, forms only to ourselves (specs/console.md).
CSP: Final = (
    "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS: Final = (
    ("Content-Security-Policy", CSP),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
    ("X-Frame-Options", "DENY"),
)
ZONE_COOKIE: Final = "nereus_tz"

_HERE = os.path.dirname(os.path.abspath(__file__))
_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(os.path.join(_HERE, "templates")),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def zone_of(name: str | None) -> zoneinfo.ZoneInfo | None:
    """The viewer's zone, or None for a name zoneinfo does not know (or none given)."""
    if not name or len(name) > 64:
        return None
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        return None


def when(ms: int | None, zone: zoneinfo.ZoneInfo | None) -> Markup:
    """A time in UTC and, if chosen, the viewer's zone."""
    if ms is None:
        return Markup("&ndash;")
    try:
        at = dt.datetime.fromtimestamp(ms / 1000, dt.UTC)
    except (OverflowError, OSError, ValueError):
        return Markup(f"<span class=time>{escape(str(ms))} ms</span>")
    utc = at.strftime("%Y-%m-%d %H:%M:%S.") + f"{at.microsecond // 1000:03d} UTC"
    html = f'<time datetime="{at.isoformat()}">{escape(utc)}</time>'
    if zone is not None:
        local = at.astimezone(zone)
        text = local.strftime("%Y-%m-%d %H:%M:%S.") + f"{local.microsecond // 1000:03d} "
        html += f' <span class="zone">{escape(text + str(zone))}</span>'
    return Markup(html)


def duration(ms: int | float | None) -> str:
    if ms is None:
        return "-"
    s = ms / 1000
    if abs(s) < 1:
        return f"{ms:.0f} ms"
    if abs(s) < 120:
        return f"{s:.1f} s"
    if abs(s) < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


_ENV.filters["duration"] = duration


def bare(title: str, message: str) -> dict[str, object]:
    """The values of a page's frame for a visitor not known (yet): an error page."""
    return {
        "title": title,
        "message": message,
        "who": None,
        "csrf": "",
        "auth_disabled": False,
        "logged_in": False,
        "zone": None,
        "zone_name": "",
        "when": lambda ms: when(ms, None),
        "path": "",
        "target": "",
        "is_admin": False,
        "inspection": False,
    }


def page(
    template: str,
    context: dict[str, Any],
    *,
    status: int = 200,
    headers: tuple[tuple[str, str], ...] = (),
) -> Response:
    body = _ENV.get_template(template).render(**context).encode("utf-8")
    return Response(status, HTML, body, SECURITY_HEADERS + headers)


def redirect(location: str, headers: tuple[tuple[str, str], ...] = ()) -> Response:
    """303 See Other: a form's answer is a page fetched with GET (reload never re-posts)."""
    return Response(303, HTML, b"", (*SECURITY_HEADERS, ("Location", location), *headers))


# The console's static files and their types: nothing else is served from the folder.
STATIC: Final = {"console.css": "text/css; charset=utf-8", "favicon.svg": "image/svg+xml"}


def static(name: str) -> Response | None:
    """A file of the console's static folder, or None."""
    content_type = STATIC.get(name)
    if content_type is None:
        return None
    with open(os.path.join(_HERE, "static", name), "rb") as f:
        body = f.read()
    return Response(
        200,
        content_type,
        body,
        (("Cache-Control", "max-age=3600"), ("X-Content-Type-Options", "nosniff")),
    )
