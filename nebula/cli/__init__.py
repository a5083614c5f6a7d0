"""`nebula` command line: one subcommand module per command, each a thin layer over a library call."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys
from types import ModuleType

__all__ = ["build_parser", "main"]

# subcommand name -> module under nebula.cli exposing add_parser(subparsers) and run(args) -> int
_COMMANDS = {
    "launch": "nebula.cli.launch",
    "bench": "nebula.cli.bench",
    "allocate": "nebula.cli.allocate",
    "fl": "nebula.cli.fl",
    "plan": "nebula.cli.plan",
}


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, ModuleType]]:
    """The argument parser of `nebula`, and the module of each subcommand it has (those whose module imports)."""
    parser = argparse.ArgumentParser(prog="nebula", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, modname in _COMMANDS.items():
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as exc:
            if exc.name != modname:
                raise
            continue
        mod.add_parser(sub)
        modules[name] = mod
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    """Entry point of `nebula`."""
    parser, modules = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return int(modules[args.command].run(args) or 0)

if __name__ == "__main__":
    sys.exit(main())
