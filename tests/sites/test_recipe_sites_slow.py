"""The "On real clusters" sections of the ELECTRA, federated and LLM recipes, run as printed with every cluster on
its own host (a namespace, a directory; only kits and what the section ships cross between them), small step
counts through the sections' own knobs; then every switch's audit log is reviewed as the main README does.
ELECTRA brings its own federation file (sites G1, G2, D); the others run on the main README's federation."""
from __future__ import annotations

import contextlib
import importlib.util
import json

import numpy as np
import pytest
import yaml

from tests.conftest import REPO
from testbed.netns import Sites
from tests.harness.readme import section_commands
from tests.sites.readme import SiteRunner, blocks, section

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.readme]
REAL = "## On real clusters"
MAIN = [code for _, code in blocks(section(REPO / "README.md", "## Running a federation by hand"))]
PRINTED = [c for r in ("electra", "federated", "llm")
           for c in section_commands(REPO / "recipes" / r / "README.md", REAL)]


def _jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _falls(values: list[float], n: int = 5) -> bool:
    return len(values) >= 2 * n and float(np.mean(values[-n:])) < float(np.mean(values[:n]))


@contextlib.contextmanager
def _sites(procs, tmp_path, spec: str, env: dict[str, str]):
    """A SiteRunner over namespaces at the addresses federation file `spec` gives, `spec` in the admin's directory;
    every process it started killed before the namespaces go."""
    hosts = {c["name"]: c["host"] for c in yaml.safe_load(spec)["clusters"]}
    with Sites(list(hosts), addresses=hosts) as sites:
        try:
            runner = SiteRunner(procs, tmp_path / "sites", sites, env=env)
            (runner.admin / "federation.yaml").write_text(spec)
            yield runner
        finally:
            procs.reap()


def _review(runner: SiteRunner, clusters: list[str], block: str | None = None) -> list[str]:
    """Stop the switches one by one in the order of `clusters`, copy each site's kit directory to the admin's
    review/, verify every audit log there but the last stopped one's (with `block`, the README's own review
    commands), each exiting 0; the last one's tail has no witness left: SUSPICIOUS, exit 3, with the fix. The
    verdicts, the last one's last."""
    for c in clusters:
        runner.stop_servers([c])
    runner.collect("review")
    if block is None:
        for c in clusters[:-1]:
            runner.run("admin", f"nebula-admin audit verify --log review/{c}/audit.log")
    else:
        runner.run_block(block)
    runner.run("admin", f"nebula-admin audit verify --log review/{clusters[-1]}/audit.log", exit_code=3)
    return [runner.stdout[n] for n, (_, line) in enumerate(runner.ran, 1) if "audit verify" in line]


def test_electra_on_real_clusters(procs, tmp_path):
    found = blocks(section(REPO / "recipes" / "electra" / "README.md", REAL))
    assert [lang for lang, _ in found] == ["yaml", "bash", "bash"]
    spec, run, review = (code for _, code in found)
    assert spec.startswith("# federation.yaml")
    with _sites(procs, tmp_path, spec, {"STEPS": "40", "MAX_PER_LANGUAGE": "300"}) as runner:
        runner.run_block(run, timeout_s=900)
        verdicts = _review(runner, ["G1", "G2", "D"], review)
    g1, g2, d = (runner.site_dir(c) for c in ("G1", "G2", "D"))
    # the discriminator learned from both generators' batches, which crossed the WAN as token ids only
    disc = [r["loss"] for r in _jsonl(d / "run" / "metrics" / "D.rank0.jsonl")]
    assert len(disc) == 40 and _falls(disc), disc
    for site, c in ((g1, "G1"), (g2, "G2")):
        sent = _jsonl(site / "run" / "metrics" / f"{c}.rank0.jsonl")
        assert len(sent) == 40 and sum(r["bytes_sent"] for r in sent) > 0
    assert {p.name for p in (d / "run" / "D" / "electra_base").iterdir()} >= {"config.json", "model.pdparams",
                                                                               "spm.model"}
    # each generator site held its own group's text only; D held no text at all
    assert not (g1 / "run" / "G2").exists() and not (g2 / "run" / "G1").exists()
    assert not (d / "run" / "G1").exists() and not (d / "run" / "G2").exists() and not (d / "run" / "corpus").exists()
    assert len(verdicts) == 3 and all(v.startswith("OK") for v in verdicts[:-1]), verdicts
    assert verdicts[-1].startswith("SUSPICIOUS"), verdicts


def test_federated_on_real_clusters(procs, tmp_path):
    found = blocks(section(REPO / "recipes" / "federated" / "README.md", REAL))
    assert [lang for lang, _ in found] == ["bash"]
    with _sites(procs, tmp_path, MAIN[0], {"ROUNDS": "3"}) as runner:
        runner.run_block(MAIN[1])
        runner.run_block(found[0][1], timeout_s=900)
        verdicts = _review(runner, ["A", "B", "C"])
    # three rounds, each valid with every client's update from both sites; the global model learned
    rounds = runner.output("A", "nebula fl rounds")
    table = [ln.split() for ln in rounds.splitlines() if ln.split() and ln.split()[0].isdigit()]
    assert [(r[0], r[1], r[3]) for r in table] == [(str(n), "valid", "6") for n in (1, 2, 3)], rounds
    accuracy = runner.output("A", "recipes.federated.evaluate")
    values = [float(ln.split()[2]) for ln in accuracy.splitlines() if ln.split() and ln.split()[0].isdigit()]
    assert len(values) == 4 and values[-1] > values[0] + 0.2, accuracy
    assert len(verdicts) == 3 and all(v.startswith("OK") for v in verdicts[:-1]), verdicts
    assert verdicts[-1].startswith("SUSPICIOUS"), verdicts


@pytest.mark.skipif(importlib.util.find_spec("paddleformers") is None,
                    reason="needs the formers extra (PaddleFormers): pip install -e '.[formers]'")
def test_llm_on_real_clusters(procs, tmp_path):
    found = blocks(section(REPO / "recipes" / "llm" / "README.md", REAL))
    assert [lang for lang, _ in found] == ["bash"]
    with _sites(procs, tmp_path, MAIN[0], {"STEPS": "24", "SYNC": "6", "PER_LANG": "60"}) as runner:
        runner.run_block(MAIN[1])
        runner.run_block(found[0][1], timeout_s=900)
        verdicts = _review(runner, ["A", "B", "C"])
    a, b = runner.site_dir("A"), runner.site_dir("B")
    # the pipeline: B computed the loss on what A's layers sent it, and it fell
    pipe = [r["loss"] for r in _jsonl(b / "pipeline" / "metrics" / "B.rank0.jsonl")]
    assert len(pipe) == 24 and _falls(pipe), pipe
    assert sum(r["bytes_sent"] for r in _jsonl(a / "pipeline" / "metrics" / "A.rank0.jsonl")) > 0
    # DiLoCo: each site's replica learned and both averaged over the WAN every SYNC steps
    for site, c in ((a, "A"), (b, "B")):
        recs = _jsonl(site / "diloco" / "metrics" / f"{c}.rank0.jsonl")
        assert len(recs) == 24 and _falls([r["loss"] for r in recs])
        assert sum(1 for r in recs if r.get("synced")) == 4
    assert len(verdicts) == 3 and all(v.startswith("OK") for v in verdicts[:-1]), verdicts
    assert verdicts[-1].startswith("SUSPICIOUS"), verdicts
