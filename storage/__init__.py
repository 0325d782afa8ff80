"""Nereus storage layer."""
