"""From the READMEs alone, every cluster on its own host (a namespace, a directory): the federation provisioned from
its file and started from the kits, the toy recipe and ABNet run by their per-cluster launch scripts ("On real
clusters", as printed), cluster D added live and C removed, and every switch's audit log reviewed."""
from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from tests.conftest import REPO
from testbed.netns import Sites
from tests.harness.readme import section_commands
from tests.recipes.conftest import corpus_pairs, write_mo
from tests.sites.readme import SiteRunner, blocks, section

pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.readme]
STEPS = 20
PRINTED = [*section_commands(REPO / "README.md", "## Running a federation by hand"),
           *(c for r in ("toy", "abnet") for c in section_commands(REPO / "recipes" / r / "README.md",
                                                                   "## On real clusters"))]


def _code(path, title: str) -> list[tuple[str, str]]:
    return blocks(section(path, title))


def _jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_sites_from_the_readmes_alone(procs, tmp_path):
    main = [code for _, code in _code(REPO / "README.md", "## Running a federation by hand")]
    toy = _code(REPO / "recipes" / "toy" / "README.md", "## On real clusters")
    abnet = _code(REPO / "recipes" / "abnet" / "README.md", "## On real clusters")
    assert [lang for lang, _ in toy] == ["bash"] and [lang for lang, _ in abnet] == ["bash"]
    locale = tmp_path / "locale"
    write_mo(locale / "es" / "LC_MESSAGES" / "demo.mo", corpus_pairs())
    spec = yaml.safe_load(main[0])
    hosts = {c["name"]: c["host"] for c in spec["clusters"]}
    with Sites(list(hosts), addresses=hosts) as sites:
        try:
            runner = SiteRunner(procs, tmp_path / "sites", sites,
                                env={"STEPS": str(STEPS), "PRETRAIN_STEPS": "20", "LOCALE_DIR": str(locale)})
            (runner.admin / "federation.yaml").write_text(main[0])
            runner.run_block(main[1])
            runner.run_block(toy[0][1], timeout_s=600)
            runner.run_block(abnet[0][1], timeout_s=900)
            runner.run_block(main[2])
            runner.stop_servers()
            runner.collect("review")
            runner.run_block(main[3])
        finally:
            procs.reap()

    a, b = runner.site_dir("A"), runner.site_dir("B")
    # the toy job trained across A and B, each cluster's ranks in its own namespace
    losses = [r["loss"] for r in _jsonl(b / "metrics" / "B.rank0.jsonl")]
    job = yaml.safe_load((REPO / "recipes" / "toy" / "job.yaml").read_text())
    assert len(losses) == job["train"]["steps"] and np.mean(losses[-10:]) < np.mean(losses[:10])
    assert sum(r["bytes_sent"] for r in _jsonl(a / "metrics" / "A.rank0.jsonl")) > 0
    # ABNet: each side where its job file says, its base pretrained once there, BLEU evaluated over the switches
    ev = json.loads((b / "run" / "B" / "eval.json").read_text())
    assert ev["step"] == STEPS and ev["num_test"] == len(ev["hypotheses"]) > 0
    assert sorted(p.name for p in (a / "run").iterdir()) == ["A", "ckpt", "job.yaml", "metrics", "train.yaml"]
    assert len(list((a / "run" / "A" / "work").glob("base_*"))) == 1 and not (b / "run" / "A").exists()
    spanish = {s for _, s in corpus_pairs()}
    a_text = "\n".join(f.read_text() for f in (a / "run" / "A").rglob("*.tsv"))
    assert a_text and not any(s in a_text for s in spanish)  # cluster A never held the target side
    verdicts = {line.split("review/")[1].split("/")[0]: runner.stdout[n]
                for n, (_, line) in enumerate(runner.ran, 1) if "audit verify" in line}
    # A and B stopped while D ran, which holds their closing checkpoints (C, cut off, and D, stopped last, end with
    # records no peer holds: SUSPICIOUS, as the README says)
    assert sorted(verdicts) == ["A", "B"] and all(v.startswith("OK") for v in verdicts.values()), verdicts
