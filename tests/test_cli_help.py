"""Every option, positional argument and subcommand of the three console scripts (`nebula`, `nebula-switch`,
`nebula-admin`, setup.py's console_scripts) has help text: the test walks each argparse parser, subparsers included,
and names every one without."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import nebula.cli
import security.cli
import switch_server.cli

ROOT = Path(__file__).resolve().parents[1]


def missing_help(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[str]:
    """`prog subcommand... --option` for every argument and subcommand of `parser` (recursively) without help."""
    path = path or (parser.prog,)
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            helped = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                if not (helped.get(name) or "").strip():
                    out.append(" ".join(path + (name,)) + " (the subcommand)")
                out += missing_help(sub, path + (name,))
            continue
        if action.help == argparse.SUPPRESS:
            continue
        if not (action.help or "").strip():
            out.append(" ".join(path + ("/".join(action.option_strings) or action.dest,)))
    return out


def _parsers() -> dict[str, argparse.ArgumentParser]:
    parser, modules = nebula.cli.build_parser()
    assert set(modules) == set(nebula.cli._COMMANDS), "a `nebula` subcommand's module did not import"
    return {"nebula": parser, "nebula-switch": switch_server.cli.build_parser(),
            "nebula-admin": security.cli.build_parser()}


def test_the_walk_covers_every_console_script():
    """The parsers walked are those of setup.py's console_scripts, and each has subcommands to walk."""
    scripts = set(re.findall(r'"([\w-]+)=[\w.]+:main"', (ROOT / "setup.py").read_text()))
    parsers = _parsers()
    assert scripts == set(parsers)
    for name, parser in parsers.items():
        assert parser.prog == name
        assert any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


def test_the_walk_finds_an_option_without_help():
    """The walker names a nested option, a positional and a subcommand that lack help (so the real test can fail)."""
    p = argparse.ArgumentParser(prog="tool")
    p.add_argument("--top", help="has help")
    sub = p.add_subparsers(dest="cmd")
    a = sub.add_parser("a", help="has help")
    a.add_argument("--bare")
    a.add_argument("thing")
    g = a.add_mutually_exclusive_group()
    g.add_argument("--x", action="store_true", help="x")
    g.add_argument("--y", action="store_true")
    sub.add_parser("b")
    assert missing_help(p) == ["tool a --bare", "tool a thing", "tool a --y", "tool b (the subcommand)"]


def test_every_option_of_every_cli_has_help():
    """Every argument and subcommand of nebula, nebula-switch and nebula-admin says what it is for."""
    missing = [m for parser in _parsers().values() for m in missing_help(parser)]
    assert not missing, "options without help text:\n  " + "\n  ".join(missing)
