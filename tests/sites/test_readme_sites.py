"""README "Running a federation by hand", run as printed with every cluster on its own host (a network namespace at
the README's address, a directory of its own): provisioned from the federation file, kits shipped and started,
a link test, cluster D added live and C removed (the others never restarted), then every audit log reviewed."""
from __future__ import annotations

import json
import time

import pytest
import yaml

from tests.conftest import REPO
from testbed.netns import Sites
from tests.harness.readme import section_commands
from tests.sites.readme import SiteRunner, blocks, section

pytestmark = [pytest.mark.root, pytest.mark.readme]
SECTION = "## Running a federation by hand"
PRINTED = section_commands(REPO / "README.md", SECTION)


def _refusals(runner: SiteRunner) -> list[str]:
    return [ln for ln in runner.output("C", "fed/C/start").splitlines()
            if "refuses this switch's certificate as revoked" in ln]


def _audit(path) -> list[dict]:
    done = path.read_text().rpartition("\n")[0]
    return [json.loads(line) for line in done.splitlines() if line.strip()]


@pytest.fixture
def readme():
    found = blocks(section(REPO / "README.md", SECTION))
    # (blocks 4 and 5, the federation view and renewal, are run by tests/security/test_federation_status.py and
    # tests/security/test_renew.py)
    assert [lang for lang, _ in found] == ["yaml", "bash", "bash", "bash", "bash", "bash"]
    return [code for _, code in found]


@pytest.fixture
def runner(procs, tmp_path, readme):
    spec = yaml.safe_load(readme[0])
    with Sites([c["name"] for c in spec["clusters"]], addresses={c["name"]: c["host"] for c in spec["clusters"]}) \
            as sites:
        try:
            yield SiteRunner(procs, tmp_path, sites)
        finally:
            procs.reap()  # the processes inside the namespaces go before them


def test_federation_by_hand_across_sites(runner, readme):
    first = readme[0].splitlines()[0]
    assert first.startswith("# federation.yaml")
    (runner.admin / "federation.yaml").write_text(readme[0])

    runner.run_block(readme[1])
    sent = runner.result("A", "--send --to B")
    got = runner.result("B", "--recv")
    assert (got["received"], got["missing"], got["duplicates"]) == (100, 0, 0)
    assert sent["received"] == 100 and sent["mbit_s"] > 0
    # every site holds only its own secrets: no other cluster's kit and no CA key ever reached it
    for c in "ABC":
        d = runner.site_dir(c)
        assert sorted(p.name for p in (d / "fed").iterdir()) == [c]
        assert not list(d.rglob("ca.key")) and not (d / "fed" / c / "ca.pem").is_symlink()
    pids = {c: [p.pid for p in runner.servers[c]] for c in "ABC"}

    runner.run_block(readme[2])
    got = runner.result("D", "--recv")
    assert (got["received"], got["missing"], got["duplicates"]) == (20, 0, 0)  # through D, which joined live
    for c in "ABC":  # A, B and C were never restarted
        assert [p.pid for p in runner.servers[c] if p.poll() is None] == pids[c]
    a_log = runner.site_dir("A") / "fed" / "A" / "audit.log"
    reloads = [r for r in _audit(a_log) if r["action"] == "reload"]
    assert [r["outcome"] for r in reloads] == ["ok", "ok"] and "C" not in reloads[-1]["detail"]["peers"]
    # C is refused from now on, and audited as such; C itself says so once per peer that refuses it, in one line
    deadline = time.monotonic() + 30
    while not _refusals(runner) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(3)  # (C retries meanwhile: each retry would have said it again)
    runner.stop_servers()
    assert any(r["action"] == "peer_rejected" and r["target"] == "C" and r["detail"].get("reason") == "revoked"
               for r in _audit(a_log))
    refusals = _refusals(runner)
    peers = [ln.split("peer ")[1].split(" ")[0] for ln in refusals]
    assert refusals and len(set(peers)) == len(peers) and set(peers) <= {"A", "B", "D"}, runner.output("C", "fed/C/start")[-4000:]
    assert "Traceback" not in runner.output("C", "fed/C/start")

    runner.collect("review")
    runner.run_block(readme[3])
    verdicts = {line.split("review/")[1].split("/")[0]: runner.stdout[n]
                for n, (where, line) in enumerate(runner.ran, 1) if "audit verify" in line}
    # A and B stopped while D ran, which holds their closing checkpoints: OK (C, cut off, and D, stopped last, end
    # with records no peer holds, SUSPICIOUS as the README says: tests/security/test_audit_witnessed.py)
    assert sorted(verdicts) == ["A", "B"] and all(v.startswith("OK") for v in verdicts.values()), verdicts
