"""Nereus replay layer."""
