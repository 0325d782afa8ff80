"""`python -m bench`: the whole benchmark suite (see bench/suite.py and bench/README.md)."""

import sys

from bench.suite import main

sys.exit(main())
