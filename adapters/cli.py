"""The `nereus` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from adapters import clientcmd, demo, servecmd, storecmd
from replay import cli as replay_cli
from runtime import compiled


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nereus", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo.register(sub)
    replay_cli.register(sub)
    storecmd.register(sub)
    servecmd.register(sub)
    clientcmd.register(sub)
    args = parser.parse_args(argv)
    try:
        compiled.check()
    except compiled.StaleBuild as exc:
        print(f"nereus: error: {exc}", file=sys.stderr)
        return 2
    handler = args.handler
    result: int = handler(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
