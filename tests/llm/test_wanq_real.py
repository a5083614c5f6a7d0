"""Quality-per-WAN-byte rows through real switches (`benchmarks/_wanq_real.py`): a DiLoCo and a pipeline row of a
tiny Llama trained by `nebula launch` in two clusters joined by two switch servers, scored on held-out lines."""
from __future__ import annotations

import importlib
import math
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.llm.conftest import NEEDS_FORMERS

pytestmark = [NEEDS_FORMERS, pytest.mark.slow]  # two two-cluster jobs, ~30 s each on 2 busy cores

SEQ_LEN, STEPS, BATCH, SEED = 32, 20, 16, 1


def _module():
    """benchmarks/_wanq_real.py (benchmarks/ is a directory of scripts, not a package)."""
    if str(REPO / "benchmarks") not in sys.path:
        sys.path.insert(0, str(REPO / "benchmarks"))
    return importlib.import_module("_wanq_real")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """A tiny Llama (hidden 64, 2 layers, vocabulary 512) with its BPE, training lines and other, held-out lines."""
    from recipes.llm.prepare import gettext_lines, save_tiny

    out = tmp_path_factory.mktemp("wanq")
    lines = list(dict.fromkeys(ln.strip() for ln in gettext_lines(per_lang=120) if ln.strip()))
    train, held = [ln for i, ln in enumerate(lines) if i % 5], [ln for i, ln in enumerate(lines) if i % 5 == 0]
    (out / "train.txt").write_text("\n".join(train) + "\n", encoding="utf-8")
    (out / "heldout.txt").write_text("\n".join(held) + "\n", encoding="utf-8")
    model = save_tiny(out / "tiny", train, hidden=64, layers=2, vocab_size=512, max_positions=64)
    return {"model_dir": model, "train": out / "train.txt", "heldout": out / "heldout.txt", "root": out}


def _ours(root: Path) -> list[int]:
    """Processes whose working directory or command line is under `root` (what a run started and left behind)."""
    left = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(p / "cwd")
            cmd = (p / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if cwd.startswith(str(root)) or str(root) in cmd:
            left.append(int(p.name))
    return left


@pytest.mark.parametrize("mode", ["diloco", "pipeline"])
def test_a_row_through_real_switches_trains_the_model_and_counts_its_wan_bytes(data, tmp_path, mode):
    from nebula.quality.rows import RowSpec

    wanq = _module()
    spec = RowSpec(mode=mode, codec="int8", sync_every=5 if mode == "diloco" else 1)
    run = wanq.run_real(spec, model_dir=data["model_dir"], train=data["train"], heldout=data["heldout"],
                        steps=STEPS, global_batch=BATCH, seq_len=SEQ_LEN, lr=2e-3, seed=SEED, rate_mbit=None,
                        delay_ms=0.0, workdir=tmp_path)
    initial = wanq.heldout_of(data["model_dir"], data["train"], data["heldout"], SEQ_LEN, SEED,
                              num_stages=2 if mode == "pipeline" else 1)
    assert math.isfinite(run.heldout_loss) and run.heldout_loss < initial - 0.5, (run.heldout_loss, initial)
    assert run.steps == STEPS and 0 < run.step_s < run.wall_s
    assert run.run_dir.is_relative_to(tmp_path) and (run.run_dir / "job.yaml").is_file()

    from nebula.quality.evaluate import build_full, num_params

    params = num_params(build_full(wanq._recipe(data["model_dir"].resolve(), data["train"].resolve(), SEQ_LEN,
                                                1).layered(), SEED))
    if mode == "diloco":  # int8 pseudo-gradients: ~1 byte per parameter, each cluster to the other, every sync
        syncs = STEPS // spec.sync_every
        assert run.traffic.exchanges == syncs and len(run.sync_s) == syncs
        assert params * syncs * 2 <= run.wan_bytes <= 2 * params * syncs * 2, (run.wan_bytes, params)
        # the switches also carried the start-up handshake: both initial models in float32
        assert run.switch_bytes >= run.wan_bytes + 2 * 4 * params
    else:  # int8 hidden states forward and their gradients back: ~1 byte per value, each way, every step
        values = BATCH * SEQ_LEN * 64
        assert run.traffic.exchanges == STEPS
        assert values * STEPS * 2 <= run.wan_bytes <= 2 * values * STEPS * 2, (run.wan_bytes, values)
        assert run.switch_bytes >= run.wan_bytes
    assert _ours(tmp_path) == [], "run_real left processes running"
