"""Commands the README prints beside its figures, found and run exactly as printed (every README command is run by
a test, or it rots)."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
from tests.harness.procs import BIN, REPO

__all__ = ["REPO", "all_commands", "printed_commands", "run_printed"]


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
    lines = set()
    for body in re.findall(r"```bash\n(.*?)```", text, re.S):
        lines |= {" ".join(line.split(" #")[0].split()) for line in body.splitlines()}
    inline = re.sub(r"```.*?```", "", text, flags=re.S)
    return {c for c in lines | {" ".join(span.split()) for span in re.findall(r"`([^`]+)`", inline)} if c}


def run_printed(command: str, timeout_s: float = 1800) -> str:
    """Run a printed command in the checkout as the README tells a user to, with the environment activated (its bin
    directory first on PATH: `python`, `nebula`); its leading NAME=value words set the environment. Its output,
    after asserting it succeeded."""
    words = shlex.split(command)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    out = subprocess.run(words, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout
