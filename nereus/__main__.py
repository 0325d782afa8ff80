"""`python -m nereus`: the `nereus` command."""

import sys

from nereus.adapters.cli.main import main

sys.exit(main())
