"""README "Your model across two clusters", executed as printed: its make_model.py and job.yaml are written as they
appear, and every line of its command block runs in order (a line ending in `&` in the background)."""
from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest

from nebula.logbook import read_scalars
from nebula.pipeline import read_metrics
from tests.conftest import REPO
from tests.llm.conftest import NEEDS_FORMERS
from testbed.federation import BIN, drain, finish, wait_for_line
from tests.harness.readme import section_commands

pytestmark = [NEEDS_FORMERS, pytest.mark.readme]
SECTION = "## Your model across two clusters"
PRINTED = section_commands(REPO / "README.md", SECTION)


def _blocks() -> dict[str, str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    body = text[text.index(SECTION):]
    body = body[: body.index("\n## ", len(SECTION))]
    blocks = dict((lang, code) for lang, code in re.findall(r"```(\w+)\n(.*?)```", body, re.S))
    assert set(blocks) == {"python", "yaml", "bash"}
    return blocks


def _argv(line: str) -> list[str]:
    """A command line of the block without its comment and trailing `&`, console scripts from this environment."""
    words = shlex.split(line, comments=True)
    if words and words[-1] == "&":
        words = words[:-1]
    if words[0] == "python":
        return [sys.executable, *words[1:]]
    return [str(Path(BIN) / words[0]), *words[1:]]


def test_readme_section_runs_as_printed(procs, tmp_path):
    blocks = _blocks()
    user_code = [ln for ln in blocks["python"].splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert len(user_code) <= 25
    (tmp_path / "make_model.py").write_text(blocks["python"])
    (tmp_path / "job.yaml").write_text(blocks["yaml"])
    background = []
    for line in (ln for ln in blocks["bash"].splitlines() if ln.strip()):
        argv = _argv(line)
        p = procs.start(argv, cwd=str(tmp_path))
        if line.split("#")[0].rstrip().endswith("&"):
            if argv[0].endswith("nebula-switch"):
                wait_for_line(p, "listening wan=", 60)
                drain(p)
            else:
                background.append(p)
            continue
        code, out = finish(p, 300)
        assert code == 0, f"{line}: exit {code}\n{out[-3000:]}"
    for p in background:
        code, out = finish(p, 300)
        assert code == 0, out[-3000:]
    b = read_metrics(tmp_path / "metrics" / "B.rank0.jsonl")
    a = read_metrics(tmp_path / "metrics" / "A.rank0.jsonl")
    assert len(b) == 12 and np.mean([r["loss"] for r in b[-3:]]) < np.mean([r["loss"] for r in b[:3]]) - 0.3
    # int8 at the cut: about a quarter of the float32 hidden states cross
    assert 3.0 < sum(r["raw_bytes_sent"] for r in a) / sum(r["bytes_sent"] for r in a) < 4.0
    assert [v for _, v in read_scalars(tmp_path / "vdl" / "B")["loss"]] == \
        [np.float32(r["loss"]) for r in b]
