"""`--file-mode`: the mode of the files the command creates (`storage.files`).

Every command that creates files under a data directory (`serve`, `export`, `import`,
`snapshot`, `tail --group`) takes it; `main` applies it to the process before the command
runs, so everything the command opens is created with it. Without it files are 0600 and
directories 0700. A `serve --processes N` supervisor passes it on to its processes with the
rest of its command line.
"""

from __future__ import annotations

import argparse

from nereus.storage import files


def _mode(text: str) -> int:
    try:
        return files.parse_file_mode(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_file_mode(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--file-mode",
        type=_mode,
        default=None,
        metavar="OCTAL",
        help="mode of the files created (default 0600; directories get search permission "
        "where read is granted: 0700, or 0750 for 0640); the umask still applies",
    )


def apply_file_mode(args: argparse.Namespace) -> None:
    """Set the process's file mode from the command line, if the command takes one."""
    mode = getattr(args, "file_mode", None)
    if mode is not None:
        files.set_file_mode(mode)
