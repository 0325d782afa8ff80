"""Golden shard logs: committed logs of earlier record versions that every later build must
still decode, replay and verify (see README.md here and `tests/replay/test_golden_logs.py`)."""
