"""`python -m nereus`: the `nereus` command."""

import sys

from nereus.runtime import compiled

# `NEREUS_PURE_PYTHON=1 python -m nereus ...` runs the source build (tests start the service
# this way): before the command's modules import any compiled one.
compiled.from_environment()

from nereus.adapters.cli.main import main  # noqa: E402

sys.exit(main())
