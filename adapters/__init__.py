"""Edges of Nereus: CLI, HTTP timer API, Kafka, the local destination, clock sources.

The library entry point is `adapters.Nereus` (see `adapters/embedded.py`).
"""

from adapters.embedded import Nereus, Peek, Result

__all__ = ["Nereus", "Peek", "Result"]
