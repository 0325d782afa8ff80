"""Nereus runtime layer."""
