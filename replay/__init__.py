"""Deterministic replay and audit tools: obligations, verify, point-in-time state."""
