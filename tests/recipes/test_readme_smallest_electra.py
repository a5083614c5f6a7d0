"""The ELECTRA commands recipes/electra/README.md prints, run as printed at their smallest size (NEBULA_SMOKE=1: at
most 400 messages per language and a 1,000-piece vocabulary, 20 intra + 10 inter-cluster steps with the hot start
at 10; ABNet's reference training capped at 20 steps): the main job's script, and the long-pretraining sequence
followed by the ABNet-on-ELECTRA sequence, which trains its encoder on the discriminator the first one exports."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.recipes.smallest import REPO, fresh_paths, run_smallest, scratch_checkout, start_smallest

MAIN = "bash recipes/electra/run_local.sh"
MAIN_TMP = "bash recipes/electra/run_local.sh /tmp/elmain"
LONG = Path("/tmp/electra-long")
LONG_PREPARE = f"python -m recipes.electra.prepare data --out {LONG} --max-per-language 0"
LONG_LAUNCH = (f"nice -n 5 nebula launch {LONG}/intra.yaml --cluster D & nice -n 5 nebula launch {LONG}/english.yaml "
               "--cluster D")
LONG_EXPORT = (f"python -m recipes.electra.prepare export --ckpt {LONG}/ckpt_intra/step_00000750 --data {LONG}/D/data "
               f"--out {LONG}/bases/intra750")
LONG_PROGRESS = f"python -m recipes.electra.summary --progress {LONG}/metrics_intra/D.rank0.jsonl 750,1500,2250"
ABNET_PREPARE = ("python -m recipes.abnet.prepare data --encoder-out A/data --decoder-out B/data --langs es "
                 "--max-words 6 --vocab-top-k 300 --test-per-mille 100")
ABNET_DEFAULT = ("python -m recipes.abnet.train --encoder-data A/data --decoder-data B/data --work default --config "
                 "default.yaml")
ABNET_ELECTRA = ("python -m recipes.abnet.train --encoder-data A/data --decoder-data B/data --work electra --config "
                 "electra.yaml")
PRINTED = [MAIN, MAIN_TMP, LONG_PREPARE, LONG_LAUNCH, LONG_EXPORT, LONG_PROGRESS, ABNET_PREPARE, ABNET_DEFAULT,
           ABNET_ELECTRA]

pytestmark = [pytest.mark.slow, pytest.mark.readme, pytest.mark.timeout(1500)]
CONFIGS = REPO / "recipes" / "electra" / "configs"


@pytest.mark.parametrize("command", [MAIN, MAIN_TMP])
def test_the_main_job_runs_as_printed(command, tmp_path):
    checkout = scratch_checkout(tmp_path / "checkout")  # (its runs/ of its own)
    with fresh_paths(*([Path("/tmp/elmain")] if command == MAIN_TMP else [])):
        out = run_smallest(command, tmp_path / "logs", cwd=checkout)
        run = Path(re.search(r"run directory (\S+)", out).group(1))
        assert run == Path("/tmp/elmain") if command == MAIN_TMP else run.parent == checkout / "runs"
        # what the job is for: the inter-cluster run continues the intra one (hot start), token ids on the WAN,
        # accuracy per language, the discriminator exported as an ABNet base
        intra, inter = map(float, re.search(r"hot start at step 10: intra loss (\S+), inter loss (\S+)$", out,
                                            re.M).groups())
        assert inter == pytest.approx(intra, abs=1e-3)
        assert int(re.search(r"WAN bytes per step \(all clusters, sent\): (\d+)", out).group(1)) > 0
        assert re.search(r"^en-es +0\.\d{3}", out, re.M)
        assert (run / "loss.png").stat().st_size > 1000
        assert {p.name for p in (run / "D" / "electra_base").iterdir()} >= {"config.json", "model.pdparams",
                                                                             "spm.model"}


def _job(template: str, steps: int, every: int) -> str:
    """configs/<template> as the README's comment says (tiny, STEPS steps, checkpoints every EVERY), with the
    smallest batch: the file is described in prose, not printed."""
    text = (CONFIGS / template).read_text()
    for key, value in (("@PRESET@", "tiny"), ("@STEPS@", str(steps)), ("@DECAY@", str(steps)),
                       ("@EVERY@", str(every)), ("every: 0, keep: 1", f"every: {every}, keep: 10"),
                       ("global_batch: 32", "global_batch: 4")):
        text = text.replace(key, value)
    return text


def test_the_long_pretraining_and_abnet_on_its_discriminator_run_as_printed(tmp_path):
    logs = tmp_path / "logs"
    checkout = scratch_checkout(tmp_path / "checkout")  # (ABNet's A/, B/, default/, ... written there)
    with fresh_paths(LONG):
        out = run_smallest(LONG_PREPARE, logs, cwd=checkout)
        assert "vocabulary 1000" in out  # (every message: --max-per-language 0, capped at the smallest size)
        # the step-750 checkpoint is what the printed export reads, so the multilingual run keeps 750 steps (of 4
        # examples); the English-only baseline beside it, which no printed command reads, runs 20
        (LONG / "intra.yaml").write_text(_job("intra.yaml.in", 750, 750))
        (LONG / "english.yaml").write_text(_job("english.yaml.in", 20, 20))
        launch = start_smallest(LONG_LAUNCH, logs, cwd=checkout)
        try:
            launch.wait(1200)  # the English run, in the foreground
            launch.wait_group(600)  # the multilingual one, started with `&`
        finally:
            launch.stop()
        for run, steps in (("intra", 750), ("english", 20)):
            assert f"cluster D: steps 0..{steps - 1} ({steps})" in launch.both(), launch.both()[-3000:]
            assert (LONG / f"ckpt_{run}" / f"step_{steps:08d}" / "disc" / "model.pdparams").is_file(), run
        out = run_smallest(LONG_EXPORT, logs, cwd=checkout)
        assert f"ABNet base written to {LONG}/bases/intra750" in out
        out = run_smallest(LONG_PROGRESS, logs, cwd=checkout)
        # the 100 steps before step 750 (1500 and 2250 lie past the smallest run's end)
        assert re.fullmatch(r"steps 650-749: RTD loss \d+\.\d{3} +monolingual: replaced recall \d\.\d{3}, CLM acc "
                            r"\d\.\d{3} +pairs: replaced recall \d\.\d{3}, CLM acc \d\.\d{3}\n", out), out

        # ABNet with ELECTRA's discriminator as its encoder base, beside its own default base
        out = run_smallest(ABNET_PREPARE, logs, cwd=checkout)
        tiny = (REPO / "recipes" / "abnet" / "configs" / "tiny.yaml").read_text()
        default = re.sub(r"(?m)^steps: .*$", "steps: 1000", tiny)  # as the README's comments say
        (checkout / "default.yaml").write_text(default)
        (checkout / "electra.yaml").write_text(default + f"source_pretrained: {LONG}/bases/intra750\n")
        for command in (ABNET_DEFAULT, ABNET_ELECTRA):  # (each scores BLEU on the test split)
            out = run_smallest(command, logs, cwd=checkout)
            assert re.search(r"^BLEU before \d+\.\d\d after \d+\.\d\d; [\d.]+ steps/s$", out, re.M), out[-2000:]
        # the electra run's encoder is the exported discriminator (its multilingual vocabulary), not a base of its own
        assert not (checkout / "electra" / "base_en").exists() and (checkout / "default" / "base_en").is_dir()
