"""The operator console: HTML pages at `/console` over the service's inspection port.

`Console` (in `app`) answers every path under `/console` for `TimerApi`; `pages` and
`actions` register its routes when imported here. specs/console.md says what each page shows
and the rules it keeps.
"""

from nereus.adapters.http.console import actions, pages
from nereus.adapters.http.console.app import Console

__all__ = ["Console", "actions", "pages"]
