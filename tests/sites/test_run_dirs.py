"""Two runs of a recipe started in the same second get run directories of their own (they shared one, and one of
them failed with `[Errno 39] Directory not empty`)."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import REPO

STUB = "#!/bin/sh\nexit 0\n"  # an environment whose python does nothing: each run stops at its first real tool


@pytest.mark.parametrize("recipe", ["abnet", "electra", "federated", "llm"])
def test_runs_started_together_get_their_own_directories(tmp_path, recipe):
    here = tmp_path / "recipes" / recipe
    here.mkdir(parents=True)
    shutil.copy(REPO / "recipes" / recipe / "run_local.sh", here / "run_local.sh")
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text(STUB)
    (venv / "python").chmod(0o755)
    (venv / "nebula-admin").write_text("#!/bin/sh\nexit 1\n")  # provisioning fails: the run ends there
    (venv / "nebula-admin").chmod(0o755)
    runs = [subprocess.Popen(["bash", str(here / "run_local.sh")], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True) for _ in range(2)]
    for p in runs:
        p.wait(60)
    made = sorted((tmp_path / "runs").iterdir())
    assert len(made) == 2 and all(d.name.startswith(f"{recipe}-") for d in made), made
