"""The `lathe` command line: parse the sub-command, hand it to its module. Kept import-light so
`lathe --help` answers fast (torch is imported only by commands that need it)."""
from __future__ import annotations

import argparse
import sys


def _env(_options) -> int:
    from lathe.env import describe

    print(describe())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lathe", description="Train and fine-tune PyTorch models.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    env = commands.add_parser("env", help="print versions of python, torch, lathe and optional packages, and the devices")
    env.set_defaults(run=_env)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    options = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if getattr(options, "run", None) is None:
        parser.print_help()
        return 0
    return options.run(options)
