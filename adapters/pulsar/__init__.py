"""The Pulsar destination: ordinary managed delivery and certified delayed handoff."""
