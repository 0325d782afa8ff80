"""What a command opens directly, without a running service: the local destination's topics.

Theory of operation: `nereus tail` reads what the embedded service delivered, from the files
the local destination keeps under the data directory (`DIR/destination`), possibly while the
service runs (the destination's own locking makes that safe). The CLI is an edge like the
others and must not import another edge, so it opens those files here, in the composition
root, which is where the service decides where each edge keeps its files. The read side is
the local destination's own (`adapters.local.destination`, `adapters.local.consumer`); the
names below are that API, given to the CLI through this one door.
"""

from __future__ import annotations

import os

from nereus.adapters.local.consumer import DESTINATION_DIR, ConsumerBusy, LocalConsumer
from nereus.adapters.local.destination import LocalDestination, LocalRecord

__all__ = [
    "ConsumerBusy",
    "LocalConsumer",
    "LocalDestination",
    "LocalRecord",
    "local_destination_dir",
    "open_local_destination",
]


def local_destination_dir(data_dir: str) -> str:
    """Where the embedded service's local destination keeps its topics."""
    return os.path.join(data_dir, DESTINATION_DIR)


def open_local_destination(data_dir: str) -> LocalDestination:
    """The local destination under `data_dir`, for reading (StoreError when refused)."""
    return LocalDestination(local_destination_dir(data_dir))
