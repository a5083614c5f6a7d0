"""The per-cluster launch scripts that the recipes' "On real clusters" sections run, as an operator meets them:
on a site whose environment is not active, or without the data the admin ships, each stops at once with one line
naming what is missing and the fix (the LLM script ran `./nebula` there and ELECTRA's `<site>/.venv/bin/nebula`,
both "No such file or directory"; a generator without its data printed a cat error and a Python traceback)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

BARE = "/usr/bin:/bin"  # a shell on the site's host before the environment is activated


def _run(argv: list[str], cwd: Path, path: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PY", "VIRTUAL_ENV")}
    return subprocess.run(argv, cwd=cwd, env={**env, "PATH": path}, capture_output=True, text=True, timeout=60)


@pytest.fixture
def site(tmp_path) -> Path:
    """A site's directory, the checkout's `recipes` in it (as a checkout there would have), no `.venv`."""
    (tmp_path / "recipes").symlink_to(REPO / "recipes")
    (tmp_path / "run").mkdir()
    return tmp_path


@pytest.mark.parametrize("argv", [["recipes/llm/launch_cluster.sh", "A", "pipeline.yaml"],
                                  ["recipes/electra/launch_generator.sh", "run", "G1"],
                                  ["recipes/electra/launch_discriminator.sh", "run"]])
def test_without_the_environment_one_line_says_to_activate_it(site, argv):
    r = _run(argv, site, BARE)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("error: nebula not found") and "activate" in lines[0] and "PY=" in lines[0]


def test_a_generator_site_without_its_data_is_told_to_ship_it(site):
    r = _run(["recipes/electra/launch_generator.sh", "run", "G1"], site, f"{Path(sys.executable).parent}:{BARE}")
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert f"{site / 'run' / 'G1' / 'data' / 'meta.json'} not found" in lines[0] and "ship G1's data" in lines[0]
