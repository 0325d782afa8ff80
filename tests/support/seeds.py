"""Seeds of the randomised crash and fuzz tests: fixed by default, random on request.

A kill that lands somewhere different on every run makes a test's verdict luck: what one
run catches the next may miss, and a failure cannot be rerun. So each such test has a fixed
default seed (the run is the same every time, CI's included), its variable names another
seed to replay, and the value `random` draws a fresh one, which the test prints (and every
assertion message names) so that a failure it finds can be replayed.
"""

from __future__ import annotations

import os
import random


def seed_from_env(name: str, default: int) -> int:
    """The seed in `$name`: unset or empty means `default`, `random` a fresh draw."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    if raw.lower() == "random":
        seed = random.SystemRandom().randrange(2**32)
        print(f"{name}={seed} (drawn at random)")
        return seed
    return int(raw)
