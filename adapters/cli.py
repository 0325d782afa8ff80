"""The `nereus` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from adapters import demo


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nereus", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo.register(sub)
    args = parser.parse_args(argv)
    handler = args.handler
    result: int = handler(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
