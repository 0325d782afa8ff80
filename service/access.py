"""What a credential may do, and the one bound on a payload no configuration can raise.

Theory of operation: a credential (`adapters.tenancy.Principal`) holds some of the closed
list of grants below; each operation of the service needs one of them (the HTTP routes name
theirs in `adapters.http.contract.ROUTES`). The payload ceiling is the service's own: the
configuration (cell, tenant) and the kernel may only narrow it. Both are service rules, not
one edge's, so the configuration reads them here without importing an edge.
"""

from __future__ import annotations

from typing import Final, Literal

Grant = Literal["produce", "read", "admin"]
GRANTS: Final[tuple[Grant, ...]] = ("produce", "read", "admin")

# The payload ceiling never exceeds this, whatever the cell, plan or kernel say.
MAX_PAYLOAD_CEILING_BYTES: Final = 1024 * 1024
