"""Commands the README prints beside its figures, found and run exactly as printed (every README command is run by
a test, or it rots)."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def printed_commands(start: str, end: str, prefix: str, flag: str = "") -> list[str]:
    """Every inline command of the README between the texts `start` and `end` that begins with `prefix` and holds
    `flag`, its whitespace joined (the README wraps long commands over lines); sorted, each once."""
    text = (REPO / "README.md").read_text()
    block = text[text.index(start):]
    block = block[:block.index(end)]
    spans = (" ".join(span.split()) for span in re.findall(r"`([^`]+)`", block))
    commands = sorted({c for c in spans if c.startswith(prefix) and flag in c})
    assert commands, f"the README prints no command starting {prefix!r} with {flag!r} after {start!r}"
    return commands


def run_printed(command: str, timeout_s: float = 1800) -> str:
    """Run a printed command in the checkout (its leading NAME=value words set the environment); its output,
    after asserting it succeeded."""
    words = shlex.split(command)
    env = dict(os.environ)
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    out = subprocess.run(words, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout
