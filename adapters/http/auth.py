"""Bearer authentication: a token's sha256 digest against the configured ones.

Theory of operation: the configuration holds only sha256 digests of tokens (a clear `token`
is hashed when the file is loaded). A request's token is hashed once and compared with every
configured digest by `hmac.compare_digest`, without stopping at the first match, so the time
taken says nothing about which digest (or how much of one) matched. The credential decides
the tenant; nothing in a request can name another.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from nereus.adapters.tenancy import Principal

_SCHEME = "bearer"


class Unauthorized(Exception):
    """No credential, a malformed one, or an unknown one (the message says which)."""


class Authenticator:
    def __init__(
        self, credentials: Sequence[tuple[bytes, Principal]], *, disabled_as: Principal | None
    ) -> None:
        """`disabled_as`: authentication is off and every request is this principal."""
        self._credentials = list(credentials)
        self._disabled_as = disabled_as

    @property
    def disabled(self) -> bool:
        return self._disabled_as is not None

    def authenticate(self, authorization: str | None) -> Principal:
        if self._disabled_as is not None:
            return self._disabled_as
        if authorization is None:
            raise Unauthorized("no Authorization header: send 'Authorization: Bearer <token>'")
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != _SCHEME or not token or " " in token:
            raise Unauthorized("malformed Authorization header: expected 'Bearer <token>'")
        found = self.principal_of(self.digest_of(token))
        if found is None:
            raise Unauthorized("unknown token")
        return found

    def principal_of(self, digest: bytes) -> Principal | None:
        """The principal a token's sha256 digest names (a console session keeps the digest,
        never the token), compared as `authenticate` compares."""
        if self._disabled_as is not None:
            return self._disabled_as
        found: Principal | None = None
        for known, principal in self._credentials:
            if hmac.compare_digest(digest, known):
                found = principal
        return found

    @staticmethod
    def digest_of(token: str) -> bytes:
        return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
