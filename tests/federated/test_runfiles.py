"""The files through which `nebula fl status|stop` speak to a running job: a status document replaced whole every
round (public, no temporary file left), and one that a stopped machine left torn named with its fix."""
from __future__ import annotations

import stat

import pytest

from nebula.federated.runfiles import RunFiles


@pytest.mark.parametrize("state", ["running", "finished", "stopped"])
def test_a_status_is_replaced_whole_and_public_and_leaves_no_temporary_file(tmp_path, state):
    files = RunFiles(tmp_path)
    assert files.read_status() is None
    files.write_status({"job": "j", "state": "running", "round": 1})
    files.write_status({"job": "j", "state": state, "round": 2})
    doc = files.read_status()
    assert (doc["job"], doc["state"], doc["round"]) == ("j", state, 2) and doc["updated"] > 0
    assert stat.S_IMODE(files.status_path.stat().st_mode) == 0o644  # (read by operators' tools)
    assert [f.name for f in tmp_path.iterdir()] == ["status.json"]


@pytest.mark.parametrize("torn", [b"", b'{"job": "j", "sta', b"[1, 2]"])
def test_a_torn_status_file_is_named_with_its_fix(tmp_path, torn):
    """A "running" status is not waited onto the disk: a machine that stopped meanwhile can leave the file empty
    on some file systems. Reading it names the file and what to do, in one line."""
    files = RunFiles(tmp_path)
    files.status_path.write_bytes(torn)
    with pytest.raises(ValueError, match="status file .*status.json is not a whole JSON document") as err:
        files.read_status()
    assert "\n" not in str(err.value) and "start the job again" in str(err.value)
