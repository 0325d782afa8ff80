"""What the access log may write of a request target: credentials in the query are redacted.

Theory of operation: the API takes a credential only in the Authorization header, and a
token sent as `?access_token=...` is refused, but the access log writes every answered
request's target, refused ones included, so a client's mistake would put its secret in the
log. `redact_target` rewrites the query of a target before it is logged: each parameter
whose name looks like a credential (`contract.CREDENTIAL_QUERY_NAMES`, matched on the name
percent-decoded and lower-cased, so `Access%5FToken` is caught too) keeps its name and has
its value replaced by `[redacted]`. Everything else is written as it came (`;` separates
pairs here too, for readers of the log that split on it); the path is not touched
(credentials are never path segments of this API).
"""

from __future__ import annotations

import re
import urllib.parse

from nereus.adapters.http.contract import CREDENTIAL_QUERY_NAMES

REDACTED = "[redacted]"
# One `name=value` pair. `;` separates pairs as well as `&`: this API reads only `&`, but a
# value is redacted wherever some other reader of the log could take it for a parameter.
_PAIR = re.compile(r"(?P<lead>^|[&;])(?P<name>[^&;=]*)=(?P<value>[^&;]*)")


def is_credential_name(raw_name: str) -> bool:
    """`raw_name` as it appears in the query (percent-encoded, `+` for a space)."""
    decoded = urllib.parse.unquote(raw_name.replace("+", " "), errors="replace")
    name = decoded.strip().lower().replace("-", "_").replace(".", "_")
    return name in CREDENTIAL_QUERY_NAMES or name.rpartition("_")[2] in CREDENTIAL_QUERY_NAMES


def redact_query(query: str) -> str:
    return _PAIR.sub(_redact_pair, query) if query else query


def _redact_pair(found: re.Match[str]) -> str:
    if not is_credential_name(found["name"]):
        return found[0]
    return f"{found['lead']}{found['name']}={REDACTED}"


def redact_target(target: str) -> str:
    path, sep, query = target.partition("?")
    return path + sep + redact_query(query) if sep else target
