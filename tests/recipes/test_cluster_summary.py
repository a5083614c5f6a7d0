"""The summary each cluster of the ABNet job prints on a real cluster, from its own files alone: the decoder's side
the BLEU, the loss and its WAN bytes and gradient codec's ratio, the encoder's side its steps, bytes and activation
codec's ratio (and where the loss and BLEU are); nebula.launch.summary's numbers under it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from nebula.launch.summary import ClusterSummary, main as launch_summary_main, summarize_records
from recipes.abnet.summary import main

REPO = Path(__file__).resolve().parents[2]


def _records(cluster: str, rank: int, steps: int, *, loss: bool, sent: int, raw: int, recv: int) -> list[dict]:
    return [{"step": s, "cluster": cluster, "rank": rank, "loss": (3.0 - s / steps) if loss else None,
             "step_s": 0.5, "bytes_sent": sent, "raw_bytes_sent": raw, "bytes_recv": recv, "time": 100.0 + s}
            for s in range(steps)]


@pytest.fixture
def site_run(tmp_path: Path) -> Path:
    """A finished run's directory as the two sites hold it (here side by side): job.yaml, metrics, B's eval.json."""
    run = tmp_path / "run"
    text = (REPO / "recipes" / "abnet" / "configs" / "job.yaml.in").read_text()
    for k, v in {"@RUN@": str(run), "@FED@": str(tmp_path / "fed"), "@STEPS@": "40", "@FORWARD@": "int8",
                 "@BACKWARD@": "int8_row"}.items():
        text = text.replace(k, v)
    (run / "metrics").mkdir(parents=True)
    (run / "job.yaml").write_text(text)
    for rank in (0, 1):  # A sends activations (int8: a quarter of float32), B gradients back
        (run / "metrics" / f"A.rank{rank}.jsonl").write_text("".join(
            json.dumps(r) + "\n" for r in _records("A", rank, 40, loss=False, sent=1000, raw=4000, recv=1200)))
        (run / "metrics" / f"B.rank{rank}.jsonl").write_text("".join(
            json.dumps(r) + "\n" for r in _records("B", rank, 40, loss=True, sent=1200, raw=4000, recv=1000)))
    (run / "B").mkdir()
    (run / "B" / "eval.json").write_text(json.dumps({
        "pair": "en-es", "step": 40, "num_test": 1, "bleu_before": 1.5, "bleu_after": 42.25,
        "hypotheses": [{"id": "x1", "ref": "abrir el archivo", "before": "la la", "after": "abrir el archivo"}]}))
    return run


def test_decoder_side_prints_bleu_loss_bytes_and_its_codec_ratio(site_run, capsys):
    assert main([str(site_run), "--cluster", "B"]) == 0
    out = capsys.readouterr().out
    assert "| BLEU (test, case-insensitive) untrained -> trained | 1.50 -> 42.25 |" in out
    assert "| loss, first 20 -> last 20 steps | 2.763 -> 2.263 |" in out  # means of 3 - s/40 over 0..19, 20..39
    assert "| WAN bytes per step (B->A + A->B) | 4,400 |" in out  # 2 ranks x (1200 sent + 1000 received)
    assert "| compression ratio backward (gradients) | 0.300 |" in out and "| steps / s | 2.00 |" in out
    assert "after:   abrir el archivo" in out
    assert (site_run / "B" / "summary.md").read_text().startswith("Cluster B (decoder)")
    assert (site_run / "B" / "loss.png").stat().st_size > 1000


def test_encoder_side_says_where_bleu_and_loss_are(site_run, capsys):
    assert main([str(site_run), "--cluster", "A"]) == 0
    out = capsys.readouterr().out
    assert "| BLEU (test, case-insensitive) untrained -> trained | on cluster B (the decoder's side) |" in out
    assert "| compression ratio forward (activations) | 0.250 |" in out
    assert "| WAN bytes per step (A->B + B->A) | 4,400 |" in out and not (site_run / "A" / "loss.png").exists()


def test_a_cluster_outside_the_job_is_one_line(site_run, capsys):
    assert main([str(site_run), "--cluster", "C"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cluster C runs no ABNet stage" in err[0] and "encoder@A" in err[0]


def test_launch_summary_counts_a_resumed_step_once_and_reads_from_the_cli(site_run, capsys):
    recs = _records("B", 0, 10, loss=True, sent=100, raw=400, recv=50)
    again = _records("B", 0, 10, loss=True, sent=300, raw=400, recv=50)[5:]  # a relaunch resumed from step 5
    s = summarize_records("B", recs + again + [{"event": "not a step"}])
    assert isinstance(s, ClusterSummary) and s.steps == 10 and s.bytes_sent_per_step == (5 * 100 + 5 * 300) / 10
    assert launch_summary_main([str(site_run / "metrics"), "A"]) == 0
    line = capsys.readouterr().out.strip()
    assert line == ("cluster A: steps 0..39 (40), 2 steps/s, WAN bytes per step: 2,000 sent, 2,400 received (sent "
                    "at 0.250 of its uncompressed size)")
    assert launch_summary_main([str(site_run / "metrics"), "Z"]) == 2
    assert "no Z.rank*.jsonl under" in capsys.readouterr().err
