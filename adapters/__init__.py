"""Edges of Nereus: CLI, HTTP timer API, Kafka, the local destination, clock sources."""
