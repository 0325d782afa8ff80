"""Console sessions: a signed cookie that names a credential, and the CSRF token of a form.

Theory of operation: logging in with a bearer token sets one cookie, `nereus_console`,
holding the token's sha256 digest (never the token), the session's expiry and a random
session id, signed with HMAC-SHA256 under a key only the server holds. The cookie is
HttpOnly (no script reads it), SameSite=Strict (no other site's page sends it) and scoped to
`/console`. Each request's cookie is checked for its signature and expiry, then its digest is
looked up among the configured credentials as a bearer token would be: a credential removed
from the configuration ends its sessions at the next restart.

Every form that acts carries a CSRF token, HMAC(key, "csrf" + session id), and an action is
refused unless the form's token matches its cookie's session: a page of another origin can
neither read the token (the same-origin policy) nor send the cookie (SameSite). With
authentication off, a visitor gets an anonymous session the same way, so actions still need
the token. A request that carries `Authorization: Bearer` instead of the cookie (a script,
not a browser) needs no CSRF token: no browser attaches that header on its own.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from typing import Final

import msgspec

COOKIE: Final = "nereus_console"
SESSION_S: Final = 8 * 3600


class Session(msgspec.Struct, frozen=True, array_like=True):
    sid: str
    digest: str  # hex sha256 of the token; "" for an anonymous session (auth off)
    expires_at_s: int


class Sessions:
    def __init__(self, key: bytes | None = None) -> None:
        # A key per process unless one is given: sessions end with the process, which is
        # what a restart of an operator tool should do.
        self._key = key or secrets.token_bytes(32)

    def issue(self, digest: str, now_s: float | None = None) -> tuple[Session, str]:
        """A new session for the credential `digest`, and its cookie value."""
        now = time.time() if now_s is None else now_s
        session = Session(secrets.token_hex(16), digest, int(now) + SESSION_S)
        payload = msgspec.msgpack.encode(session)
        return session, f"{_b64(payload)}.{_b64(self._sign(b'session' + payload))}"

    def read(self, cookie_value: str | None, now_s: float | None = None) -> Session | None:
        """The session a cookie value names, or None (absent, forged, malformed, expired)."""
        if not cookie_value or cookie_value.count(".") != 1:
            return None
        raw_payload, raw_sig = cookie_value.split(".")
        try:
            payload, sig = _unb64(raw_payload), _unb64(raw_sig)
        except ValueError:
            return None
        if not hmac.compare_digest(sig, self._sign(b"session" + payload)):
            return None
        try:
            session = msgspec.msgpack.decode(payload, type=Session)
        except msgspec.DecodeError:
            return None
        now = time.time() if now_s is None else now_s
        return session if session.expires_at_s > now else None

    def csrf(self, session: Session) -> str:
        return self._sign(b"csrf" + session.sid.encode()).hex()

    def csrf_ok(self, session: Session, token: str | None) -> bool:
        return token is not None and hmac.compare_digest(
            self.csrf(session).encode(), token.encode("utf-8", "replace")
        )

    def _sign(self, data: bytes) -> bytes:
        return hmac.new(self._key, data, hashlib.sha256).digest()


def set_cookie(value: str, *, secure: bool) -> str:
    flags = f"; Path=/console; Max-Age={SESSION_S}; HttpOnly; SameSite=Strict"
    return f"{COOKIE}={value}{flags}{'; Secure' if secure else ''}"


def clear_cookie() -> str:
    return f"{COOKIE}=; Path=/console; Max-Age=0; HttpOnly; SameSite=Strict"


def cookie_value(header: str | None, name: str = COOKIE) -> str | None:
    """The value of cookie `name` in a Cookie header (the first, if repeated)."""
    if not header:
        return None
    for part in header.split(";"):
        k, _, v = part.strip().partition("=")
        if k == name:
            return v
    return None


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    """Strict: only the one text `_b64` writes for these bytes. base64 ignores the spare bits
    of a last character, so without the check two cookie texts would be one session."""
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError) as exc:
        raise ValueError("not base64") from exc
    if _b64(data) != text:
        raise ValueError("not the canonical base64 of its bytes")
    return data
