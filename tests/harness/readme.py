"""Commands the README, the recipes' READMEs and docs/ print, found and run exactly as printed (every printed command
is run by a test, or it rots: tests/test_readme_commands.py)."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Iterable

import pytest

from nebula.smoke import ENV as SMOKE
from testbed.procs import BIN, REPO

__all__ = ["READMES", "REPO", "all_commands", "bash_lines", "invocations", "is_template", "printed_commands",
           "readme_files", "readme_tier", "run_printed", "scratch_checkout", "section_commands"]

READMES = ("README.md", "recipes/*/README.md", "docs/*.md")  # every file whose commands a test must run as printed
# what a printed command starts with, after its NAME=value words: a program of the environment, a shell tool, a script
_PROGRAM = re.compile(r"^(\w+=\S+ )*\(?(\.venv/bin/\S+|python3?|pytest|nebula(-switch|-admin)?|bash|make|pip|apt-get|"
                      r"mkdir|tar|sed|cd|kill|nice|visualdl|ip|tc|\.|\S+\.sh|\S+/start)( |$)")
# a word a user replaces (JOB, RUN_DIR, stage:NAME), a choice (a|b), an optional part ([--x]) or an elision (...)
_PLACEHOLDER = re.compile(r"(?<![${\w])[A-Z][A-Z_]*[A-Z](?![\w=}])|[|[\]]|\.\.\.")


def printed_commands(start: str, end: str, prefix: str, flag: str = "") -> list[str]:
    """Every command of the README between the texts `start` and `end` (inline, or a line of a ```bash block) that
    begins with `prefix` and holds `flag`, its whitespace joined (the README wraps long commands over lines);
    sorted, each once."""
    text = (REPO / "README.md").read_text()
    block = text[text.index(start):]
    block = block[:block.index(end)]
    commands = sorted({c for c in all_commands(block) if c.startswith(prefix) and flag in c})
    assert commands, f"the README prints no command starting {prefix!r} with {flag!r} after {start!r}"
    return commands


def all_commands(text: str) -> set[str]:
    """Every command `text` prints: its inline spans and the lines of its ```bash blocks (without their trailing
    comments), whitespace joined; what is not a command is the caller's to leave out."""
    lines = bash_lines(text)
    inline = re.sub(r"```.*?```", "", text, flags=re.S)
    return {c for c in lines | {" ".join(span.split()) for span in re.findall(r"`([^`]+)`", inline)} if c}


def readme_files() -> list[Path]:
    """The checkout's files that print commands (READMES), in order."""
    return [p for pattern in READMES for p in sorted(REPO.glob(pattern))]


def invocations(text: str) -> set[str]:
    """The commands markdown `text` prints for a user to run: every line of its ```bash blocks, and every inline span
    that starts with a program (`nebula ...`, `python ...`, `PYTHONPATH=. .venv/bin/python ...`, a script)."""
    bash = bash_lines(text)
    return {c for c in all_commands(text) if c and not c.startswith("#") and (_PROGRAM.match(c) or c in bash)}


def is_template(command: str) -> bool:
    """Whether `command` is a form to fill in, not one to run as printed: a placeholder (JOB, RUN_DIR, stage:NAME),
    a choice (a|b), an optional part ([--method m]) or an elision (...); `${VAR:-default}` and NAME= words are not."""
    return bool(_PLACEHOLDER.search(re.sub(r"\$\{[^}]*\}|'[^']*'|\"[^\"]*\"", "", command)))


def section_commands(path: Path, title: str) -> list[str]:
    """The lines of the ```bash blocks of section `title` (a heading, up to the next of its level) of `path`, as
    printed (comments kept off, whitespace joined), in order: what a test that runs the section's blocks runs."""
    text = path.read_text(encoding="utf-8")
    start = text.index(title)
    level = title.split(" ")[0]
    end = text.find(f"\n{level} ", start + len(title))
    return [c for c in _bash(text[start:] if end < 0 else text[start:end]) if c and not c.startswith("#")]


def bash_lines(text: str) -> set[str]:
    """The lines of the ```bash blocks of markdown `text`, without their trailing comments, whitespace joined."""
    return set(_bash(text))


def _bash(text: str) -> list[str]:
    return [" ".join(line.split(" #")[0].split()) for body in re.findall(r"```bash\n(.*?)```", text, re.S)
            for line in body.splitlines()]


def readme_tier(commands: Iterable[str], ci: Iterable[str]) -> list:
    """`commands` as pytest parameters, those in `ci` (the smallest printed: what CI runs) marked `readme`, which
    `make test` runs slow or not; the others stay the slow tier's."""
    ci = set(ci)
    return [pytest.param(c, marks=pytest.mark.readme) if c in ci else c for c in commands]


def run_printed(command: str, timeout_s: float = 1800, *, smallest: bool = False, cwd: Path = REPO) -> str:
    """Run a printed command in the checkout (or `cwd`, e.g. a `scratch_checkout`) as the README tells a user to,
    with the environment activated (its bin directory first on PATH: `python`, `nebula`); its leading NAME=value
    words set the environment; `smallest`: at its smallest size (NEBULA_SMOKE=1, nebula/smoke.py), how CI runs a
    command that takes minutes to hours at the size printed. Its output, after asserting it succeeded."""
    words = shlex.split(command)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    if smallest:
        env[SMOKE] = "1"
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    out = subprocess.run(words, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def scratch_checkout(dest: Path, keep_out: Iterable[str] = ("runs",)) -> Path:
    """`dest`, a view of the checkout (a link to each of its top-level entries but `keep_out`): a printed command run
    there (`run_printed(..., cwd=dest)`) reads the checkout's files and writes its own runs/, never the rows a user
    measured at the full size."""
    dest.mkdir(parents=True, exist_ok=True)
    for entry in REPO.iterdir():
        if entry.name not in keep_out:
            (dest / entry.name).symlink_to(entry)
    return dest
