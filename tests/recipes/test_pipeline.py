"""ABNet on the nebula.pipeline runtime: stages train through codecs, bad bases fail before training, the
reachability check names an unreachable cluster, and (slow) the whole two-cluster main job through real switches."""
from __future__ import annotations

import json
import os
import queue
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import paddle
import pytest
import yaml

from nebula.compress import codec_path
from nebula.config.job import load_job_config
from nebula.pipeline import read_metrics
from nebula.modes import run
from nebula.pipeline.links import QueueLink
from recipes.text.catalogs import DataConfig, prepare_data
from recipes.abnet.model import BertConfig, BertModel
from recipes.abnet.pretrain import PretrainedError, save_base
from recipes.abnet.stages import ABNetRecipe
from recipes.text.tokenizer import train_tokenizer
from tests.pipeline.helpers import run_two_clusters
from tests.recipes.conftest import corpus_pairs

REPO = Path(__file__).resolve().parents[2]
SPLIT = DataConfig(test_per_mille=100, dev_per_mille=100)


def _train_yaml(tmp: Path, **kw) -> Path:
    doc = {"preset": "tiny", "steps": 40, "batch_size": 16, "lr": 0.005, "warmup_steps": 5, "max_len": 12,
           "pretrain_steps": 20, "pretrain_vocab": 60, "eval_batch": 64, **kw}
    f = tmp / "train.yaml"
    f.write_text(yaml.safe_dump(doc))
    return f


def _job(tmp: Path, clusters: list[dict], stages: list[dict], steps: int, **recipe) -> Path:
    doc = {"job": "abnet-test",
           "recipe": {"factory": "recipes.abnet:ABNetRecipe",
                      "args": {"config": str(_train_yaml(tmp, steps=steps)), "encoder_data": str(tmp / "A"),
                               "decoder_data": str(tmp / "B"), "encoder_work": str(tmp / "wa"),
                               "decoder_work": str(tmp / "wb"), **recipe}},
           "clusters": clusters, "stages": stages,
           "train": {"steps": steps, "global_batch": 16, "micro_batches": 2, "seed": 0},
           "compression": {"forward": "int8", "backward": "int8_row"},
           "metrics": {"dir": str(tmp / "metrics"), "progress": False}}
    f = tmp / "job.yaml"
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    return f


class TapLink(QueueLink):
    """The runtime's in-process link, keeping a copy of every message it sends (what would cross the WAN)."""

    def __init__(self, out_q: queue.Queue, in_q: queue.Queue, peer_cluster: str) -> None:
        super().__init__(out_q, in_q, peer_cluster=peer_cluster)
        self.sent: list[bytes] = []

    def send(self, frames, lane: str):
        self.sent.append(b"".join(bytes(memoryview(f).cast("B")) for f in frames))
        return super().send(frames, lane)


def _two_cluster_wiring() -> tuple[dict, dict]:
    """Cluster A's `next` and cluster B's `prev` boundary joined by in-process links (activation, gradient, control)."""
    a, b = {}, {}
    for kind in ("act", "grad", "ctl"):
        ab, ba = queue.Queue(), queue.Queue()
        a[kind], b[kind] = TapLink(ab, ba, "B"), TapLink(ba, ab, "A")
    return {"next": a}, {"prev": b}


def _messages(link: TapLink) -> list[tuple[tuple[int, int, int], bytes, Any]]:
    """(key, whole message, Encoded) of every message a link sent."""
    from nebula.compress import frames_to_encoded

    head = struct.Struct("<qii")
    return [(head.unpack_from(m), m, frames_to_encoded([memoryview(m)[head.size:]])) for m in link.sent]


def test_stages_train_through_codecs_on_the_runtime(locale_dir, tmp_path):
    """Encoder on cluster A, decoder on cluster B, joined by the runtime's boundary: every activation and gradient
    crosses it encoded by the job's codecs on the path codec_path picks for the device, the bytes counted are the encoded sizes, and the model
    still learns."""
    prepare_data(tmp_path / "A", tmp_path / "B", ["es"], locale_dir, SPLIT)
    job = _job(tmp_path, [{"id": "A"}, {"id": "B"}],
               [{"name": "encoder", "cluster": "A"}, {"name": "decoder", "cluster": "B"}], steps=40)
    cfg = load_job_config(job)
    recipe = ABNetRecipe(**cfg.recipe.args)
    assert recipe.num_examples == len((tmp_path / "A" / "en-es" / "train.en.tsv").read_text().splitlines())
    with pytest.raises(ValueError, match="not 'head'"):
        recipe.stage("head")
    wa, wb = _two_cluster_wiring()
    losses = run_two_clusters(cfg, wa, wb, tmp_path)[1].losses
    assert np.mean([losses[s] for s in range(35, 40)]) < np.mean([losses[s] for s in range(5)]) - 0.3, losses
    # each cluster pretrained its base from its own side only
    assert (tmp_path / "wa" / "base_en" / "model.pdparams").is_file()
    assert (tmp_path / "wb" / "base_es" / "model.pdparams").is_file()
    for cluster, link, data_spec in (("A", wa["next"]["act"], "int8"), ("B", wb["prev"]["grad"], "int8_row")):
        data = _messages(link)
        assert {k[0] for k, _, _ in data} == set(range(40)) and len(data) == 40 * 2  # 2 micro-batches per step
        for _, msg, enc in data:
            assert enc.spec == data_spec and len(msg) == 16 + enc.nbytes  # what left is the codec's encoding
            # encoded where codec_path puts this device's tensors: numpy on the CPU, paddle ops on an accelerator
            assert enc.kind == codec_path(paddle.get_device())
        raw = sum(int(np.prod(enc.shape)) * 4 for _, _, enc in data)
        assert sum(len(m) for _, m, _ in data) < 0.35 * raw  # int8 codecs: about a quarter of float32
        recs = read_metrics(tmp_path / "metrics" / f"{cluster}.rank0.jsonl")
        ctl = wa["next"]["ctl"] if cluster == "A" else wb["prev"]["ctl"]
        assert sum(r["bytes_sent"] for r in recs) == sum(len(m) for _, m, _ in data) + sum(map(len, ctl.sent))
        assert sum(r["codec_s"] for r in recs) > 0


def test_wrong_shape_pretrained_base_fails_before_training(locale_dir, tmp_path):
    prepare_data(tmp_path / "A", tmp_path / "B", ["es"], locale_dir, SPLIT)
    tok = train_tokenizer([e for e, _ in corpus_pairs()], tmp_path / "tok" / "en.model", vocab_size=60)
    wrong = save_base(BertModel(BertConfig(vocab_size=tok.vocab_size, hidden=32, num_layers=2, num_heads=2,
                                           ff_hidden=64, max_positions=32)), tok, tmp_path / "wrong")
    job = _job(tmp_path, [{"id": "A"}], [{"name": "encoder", "cluster": "A"}, {"name": "decoder", "cluster": "A"}],
               steps=5, source_pretrained=str(wrong))
    with pytest.raises(PretrainedError, match=r"hidden=32 \(the preset expects 64\)"):
        run(load_job_config(job), "A", workdir=tmp_path)
    assert not (tmp_path / "metrics" / "A.rank0.jsonl").exists() or \
        (tmp_path / "metrics" / "A.rank0.jsonl").read_text() == ""  # not a single step ran


def test_unreachable_encoder_cluster_is_named_before_training(procs, locale_dir, tmp_path):
    from testbed.federation import start_switches

    prepare_data(tmp_path / "A", tmp_path / "B", ["es"], locale_dir, SPLIT)
    workers = start_switches(procs, tmp_path / "fed", ["A", "B"])
    train = _train_yaml(tmp_path)

    def reach(side: str, me: str, peer: str, timeout: int):
        return procs.start([sys.executable, "-m", "recipes.abnet.remote", "reach", "--side", side, "--worker",
                            str(workers[me]), "--peer", peer, "--data", str(tmp_path / me), "--config", str(train),
                            "--timeout", str(timeout)], cwd=str(REPO))

    p = reach("decoder", "B", "A", 4)
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 2, out
    assert "cluster B cannot reach cluster A" in out and "launch script" in out
    # with the encoder side answering, both agree on the split
    a, b = reach("encoder", "A", "B", 60), reach("decoder", "B", "A", 60)
    out_a, _ = a.communicate(timeout=120)
    out_b, _ = b.communicate(timeout=120)
    assert a.returncode == 0 and b.returncode == 0, out_a + out_b
    assert "cluster A reachable; same en-es split" in out_b


@pytest.mark.slow
def test_main_job_two_clusters_through_switches(locale_dir, tmp_path):
    """run_local.sh end to end on the test's corpus: provision, switches, 2+2 ranks, BLEU, plot, summary."""
    run_dir = tmp_path / "run"
    env = dict(os.environ, STEPS="60", PRETRAIN_STEPS="30", LOCALE_DIR=str(locale_dir), VOCAB_TOP_K="0",
               TEST_PER_MILLE="100", PY=sys.executable, SIDE_SUMMARY="1")
    env.pop("NEBULA_PROGRESS_EVERY", None)
    proc = subprocess.run(["bash", str(REPO / "recipes" / "abnet" / "run_local.sh"), str(run_dir)], env=env,
                          capture_output=True, text=True, timeout=900, start_new_session=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    # quiet: progress every tenth of the run, paddle's launcher lines and its ccache warning in their log files
    said = proc.stdout + proc.stderr
    a_log, b_log = ((run_dir / "logs" / f"cluster_{c}.log").read_text() for c in "AB")
    for noise in ("LAUNCH INFO", "No ccache found", "C++ Traceback"):
        assert noise not in said + a_log + b_log, noise
    assert "LAUNCH INFO" in (run_dir / "metrics" / "log" / "B" / "launch.log").read_text()
    assert len([ln for ln in said.splitlines() if ln.startswith("abnet@B: ")]) == 10, said
    assert len(said.splitlines()) < 150, said  # (with both summary tables and 8 samples each: about 130)
    # each cluster's script ends with its side's summary, from its own files (what a real cluster has)
    assert "Cluster A (encoder)" in a_log and "| compression ratio forward (activations) |" in a_log, a_log[-3000:]
    assert "Cluster B (decoder)" in b_log and "| BLEU (test, case-insensitive) untrained -> trained | " in b_log
    assert "nebula launch: cluster B: steps 0..59 (60), loss " in b_log
    assert (run_dir / "loss.png").stat().st_size > 1000
    summary = (run_dir / "summary.md").read_text()
    assert "WAN bytes per step" in summary and "compression ratio forward" in summary
    ev = json.loads((run_dir / "B" / "eval.json").read_text())
    assert ev["step"] == 60 and ev["num_test"] == len(ev["hypotheses"]) > 0
    recs = [json.loads(x) for x in (run_dir / "metrics" / "B.rank0.jsonl").read_text().splitlines()]
    assert np.mean([r["loss"] for r in recs[-10:]]) < np.mean([r["loss"] for r in recs[:10]])
    a_recs = [json.loads(x) for x in (run_dir / "metrics" / "A.rank1.jsonl").read_text().splitlines()]
    assert all(r["bytes_sent"] > 0 for r in a_recs)  # both ranks of the encoder cluster sent activations
    # The link's throughput meter runs during the job; it reports only once a transfer kept the link busy
    # (>= 64 kB over >= 50 ms), which the demo's few-kB steps may never do: then no estimate, never a wrong one.
    rate = a_recs[-1]["link_bytes_per_s"]
    assert rate is None or rate > 0
    spanish = {s for _, s in corpus_pairs()}
    a_text = "\n".join(f.read_text() for f in (run_dir / "A").rglob("*.tsv"))
    assert not any(s in a_text for s in spanish)  # cluster A never held the target side
    # every process the job started is gone (switches, launchers, ranks)
    left = subprocess.run(["pgrep", "-f", str(run_dir)], capture_output=True, text=True).stdout.split()
    assert left == [], left
