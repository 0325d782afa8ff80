"""The `nereus` command.

Output: commands that print results (schedule, reschedule, cancel, peek, list, tail) print
readable key: value lines when stdout is a terminal and one JSON object per line otherwise
(pipes and scripts keep reading JSON); --json or --text chooses. See each command's --help.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from nereus import __version__
from nereus.adapters.cli import client as clientcmd
from nereus.adapters.cli import demo
from nereus.adapters.cli import serve as servecmd
from nereus.adapters.cli import store as storecmd
from nereus.adapters.cli import tail as tailcmd
from nereus.adapters.cli.modes import apply_file_mode
from nereus.adapters.cli.output import EXIT_CODES
from nereus.adapters.compose.replay import kafka_rebuild
from nereus.replay import cli as replay_cli
from nereus.runtime import compiled


class _Version(argparse.Action):
    """`--version`, with the kernel's build (compiled or Python source) worked out only when
    asked for: it imports the kernel."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(f"nereus {__version__} (kernel: {compiled.describe()})")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """Every command and option of `nereus`; the docs' CLI reference is rendered from it."""
    parser = argparse.ArgumentParser(
        prog="nereus",
        description=__doc__,
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_Version, help="print the version and the build")
    sub = parser.add_subparsers(dest="command", required=True)
    demo.register(sub)
    replay_cli.register(sub, kafka=kafka_rebuild)
    storecmd.register(sub)
    servecmd.register(sub)
    tailcmd.register(sub)
    clientcmd.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # The command line as given, for a command that starts copies of itself (serve
    # --processes).
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        compiled.check()
    except compiled.StaleBuild as exc:
        print(f"nereus: error: {exc}", file=sys.stderr)
        return 2
    # Before the command opens anything: the mode of every file it creates.
    apply_file_mode(args)
    handler = args.handler
    result: int = handler(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
