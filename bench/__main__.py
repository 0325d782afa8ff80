"""`python -m bench`: the whole benchmark suite (see bench/suite.py and bench/README.md)."""

import sys

from nereus.runtime import compiled

try:
    compiled.check()  # figures of a stale build would describe code that is not there
except compiled.StaleBuild as exc:
    sys.exit(f"bench: error: {exc}")

from bench.suite import main

sys.exit(main())
