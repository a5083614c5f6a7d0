"""ELECTRA recipe pieces against hand-computed values: masking, sampling, packing, the three losses, grouping, plan."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import paddle
import pytest

from nebula.config.schema import ConfigError
from nebula.pipeline.oneway import plan_for, signatures_agree
from recipes.text.tokenizer import CLS_ID, MASK_ID, NUM_SPECIAL, PAD_ID
from recipes.electra.data import (DEFAULT_GROUPS, MRTD, TRTD, CorpusConfig, load_group, parse_groups, read_meta,
                                  split_of)
from recipes.electra.model import (clm_loss, corrupt, gumbel_sample, mask_positions, mlm_loss, pack, rtd_loss,
                                   unpack)


def test_masking_picks_real_tokens_at_the_rate_and_at_least_one():
    row = np.array([CLS_ID] + list(range(10, 40)) + [CLS_ID] + list(range(50, 80)) + [PAD_ID] * 8)
    rng = np.random.default_rng(0)
    masks = np.stack([mask_positions(row, rng, 0.15) for _ in range(2000)])
    assert not masks[:, row == PAD_ID].any() and not masks[:, row == CLS_ID].any()
    assert masks.mean(0)[row >= NUM_SPECIAL].mean() == pytest.approx(0.15, abs=0.01)
    first, second = masks[:, 1:31].sum(), masks[:, 32:62].sum()  # a TRTD pair: both languages get masks
    assert abs(first - second) / (first + second) < 0.05
    short = np.array([CLS_ID, 9, PAD_ID])
    assert all(mask_positions(short, np.random.default_rng(s), 0.01).tolist() == [False, True, False]
               for s in range(20))
    a, b = (mask_positions(row, np.random.default_rng((1, 2, 3)), 0.15) for _ in range(2))
    assert (a == b).all()  # a pure function of the seed: every run and every resume draws the same mask


def test_gumbel_sampling_follows_the_softmax_and_never_proposes_special_tokens():
    logits = np.log(np.array([[9.0, 9.0, 9.0, 9.0, 1.0, 2.0, 7.0]]))  # specials 0..3 would dominate if allowed
    rng = np.random.default_rng(1)
    draws = np.array([gumbel_sample(logits, rng.random(logits.shape))[0] for _ in range(20000)])
    assert draws.min() >= NUM_SPECIAL
    freq = np.bincount(draws, minlength=7)[4:] / len(draws)
    assert freq == pytest.approx([0.1, 0.2, 0.7], abs=0.015)
    sharp = np.array([[0, 0, 0, 0, 0, 50.0, 0]])
    assert gumbel_sample(sharp, np.full(sharp.shape, 0.5))[0] == 5


def test_corrupt_counts_a_sample_equal_to_the_original_as_original():
    ids = np.array([[3, 10, 11, 12, 0]])
    mask = np.array([[False, True, True, False, False]])
    corrupted, replaced = corrupt(ids, mask, np.array([10, 20]))
    assert corrupted.tolist() == [[3, 10, 20, 12, 0]]
    assert replaced.tolist() == [[False, False, True, False, False]]


def test_pack_sends_token_ids_only_and_unpacks_to_the_originals():
    ids = np.array([[3, 10, 11, 12, 0], [3, 7, 8, 0, 0]])
    corrupted = np.array([[3, 10, 20, 12, 0], [3, 9, 8, 0, 0]])
    x = pack(np.array([2, 5]), np.array([MRTD, TRTD]), corrupted, ids, corrupted != ids, vocab_size=4000)
    assert x.dtype == np.int16 and x.shape == (2, 2 + 2 * 5) and x.nbytes == 24 * 2
    lang, task, c, replaced, original = unpack(x)
    assert lang.tolist() == [2, 5] and task.tolist() == [MRTD, TRTD]
    assert (c == corrupted).all() and (original == ids).all() and (replaced == (corrupted != ids)).all()
    assert pack(np.array([0]), np.array([0]), ids[:1], ids[:1], ids[:1] < 0, vocab_size=250_000).dtype == np.int32


def test_generator_mlm_loss_by_hand():
    logits = paddle.to_tensor([[0.0, math.log(3.0), 0.0], [2.0, 0.0, 0.0]])
    want = (-math.log(3 / 5) - math.log(1 / (math.e ** 2 + 2))) / 2
    assert float(mlm_loss(logits, paddle.to_tensor([1, 2]))) == pytest.approx(want, rel=1e-6)


def test_rtd_loss_by_hand_ignores_padding():
    logits = paddle.to_tensor([[0.0, 2.0, 5.0]])
    replaced = paddle.to_tensor([[True, False, True]])
    valid = paddle.to_tensor([[True, True, False]])
    want = (math.log(2.0) + math.log(1 + math.e ** 2)) / 2  # -log sigmoid(0), -log(1 - sigmoid(2))
    assert float(rtd_loss(logits, replaced, valid)) == pytest.approx(want, rel=1e-6)


def test_clm_loss_by_hand_at_every_position():
    logits = paddle.to_tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 3.0]])
    want = (math.log(1 + math.e ** -1) + math.log(2) + math.log(1 + math.e ** -3)) / 3
    assert float(clm_loss(logits, paddle.to_tensor([0, 1, 1]))) == pytest.approx(want, rel=1e-6)


def test_discriminator_loss_is_lambda_rtd_plus_mu_clm(corpus):
    from nebula.pipeline import StageContext
    from recipes.electra import ElectraRecipe

    recipe = ElectraRecipe(data=str(corpus), groups=["romance", "slavic_cjk"], lambda_rtd=50.0, mu_clm=1.0)
    ctx = StageContext(job="t", stage="disc", stage_index=2, num_stages=3, cluster="D", device="cpu", rank=0,
                       world_size=1, seed=0)
    stage = recipe.stage("disc")
    paddle.seed(0)
    model = stage.build_model(ctx)
    ids = np.array([[CLS_ID, 10, 11, 12, 13, PAD_ID]])
    corrupted = np.array([[CLS_ID, 10, 30, 12, 13, PAD_ID]])
    out = stage.forward(model, None, paddle.to_tensor(pack(np.array([1]), np.array([MRTD]), corrupted, ids,
                                                           corrupted != ids, 137)))
    m = out.metrics
    assert float(out.loss) == pytest.approx(50.0 * m["rtd_loss"] + m["clm_loss"], rel=1e-5)
    assert m["n/es"] == 5 and m["rep_n/es"] == 1  # 5 real tokens, one of them replaced
    with pytest.raises(ValueError, match="lambda_rtd=0.0 must be > 0"):
        ElectraRecipe(data=str(corpus), lambda_rtd=0.0)
    with pytest.raises(ValueError, match="lambda_rtd=-1 must be > 0"):
        ElectraRecipe(data=str(corpus), lambda_rtd=-1)


def test_language_groups_follow_families_and_reject_overlaps():
    assert set(DEFAULT_GROUPS) == {"romance_germanic", "slavic_cjk"}
    assert {"es", "fr", "de"} <= set(DEFAULT_GROUPS["romance_germanic"])
    assert {"ru", "zh_CN", "ja"} <= set(DEFAULT_GROUPS["slavic_cjk"])
    assert sum(len(v) for v in DEFAULT_GROUPS.values()) >= 6
    assert parse_groups("a=es, it; b=ru") == {"a": ("es", "it"), "b": ("ru",)}
    with pytest.raises(ValueError, match="must read name=lang"):
        parse_groups("es,it")
    with pytest.raises(ValueError, match="language es is in two groups"):
        CorpusConfig(groups={"a": ("es",), "b": ("es", "ru")})
    with pytest.raises(ValueError, match="group 'b' lists no language"):
        CorpusConfig(groups={"a": ("es",), "b": ()})
    # one split for a sentence and every translation of it
    assert len({split_of("Open file", "s", 100, 50) for _ in range(3)}) == 1


def test_each_group_holds_only_its_languages_and_english_once(corpus):
    meta = read_meta(corpus)
    langs = meta["languages"]
    rom, sla = load_group(corpus, "romance"), load_group(corpus, "slavic_cjk")
    assert {langs[i] for i in rom.lang} == {"en", "es", "it"}
    assert {langs[i] for i in sla.lang} == {"ru", "ja"}
    trtd = sla.ids[sla.task == TRTD]
    assert ((trtd == CLS_ID).sum(1) == 2).all()  # [CLS] en [CLS] x
    assert ((sla.ids[sla.task == MRTD] == CLS_ID).sum(1) == 1).all()
    with pytest.raises(ValueError, match="group 'nordic' is not in"):
        load_group(corpus, "nordic")


def test_a_group_with_no_text_is_refused(corpus, tmp_path):
    import shutil

    for f in ("meta.json", "spm.model"):
        shutil.copy(corpus / f, tmp_path / f)
    np.savez(tmp_path / "group_romance.npz", ids=np.zeros((0, 24), np.int32), lang=np.zeros(0, np.int32),
             task=np.zeros(0, np.int32))
    with pytest.raises(ValueError, match="language group 'romance' \\(es, it\\) has no text"):
        load_group(tmp_path, "romance")
    with pytest.raises(FileNotFoundError, match="holds no text of group 'slavic_cjk'"):
        load_group(tmp_path, "slavic_cjk")


def test_scatter_plan_for_two_generator_clusters_and_a_larger_discriminator():
    p = plan_for([("G1", 1), ("G2", 1)], "D", 2, 1)
    assert [p.root(s) for s in range(2)] == [0, 1] and p.active == 2
    p = plan_for([("G1", 2), ("G2", 1)], "D", 7, 2)  # 3 sender ranks x k=2 = 6 fed ranks, rank 6 idles
    assert p.senders == (("G1", 0), ("G1", 1), ("G2", 0))
    assert p.sender_index("G2", 0) == 2 and p.root(2) == 4 and p.group(2) == [4, 5]
    assert [p.sender_of(r) for r in range(7)] == [0, 0, 1, 1, 2, 2, None]
    assert [p.is_root(r) for r in range(7)] == [True, False, True, False, True, False, False]
    with pytest.raises(ValueError, match="oneway.k=3 is larger than the 2 ranks of receiver cluster D"):
        plan_for([("G1", 1)], "D", 2, 3)
    with pytest.raises(ValueError, match="need 4 ranks on cluster D, it has 3"):
        plan_for([("G1", 1), ("G2", 1)], "D", 3, 2)


def test_signatures_must_agree_on_shared_keys():
    assert signatures_agree({"vocabulary": "a", "x": 1}, {"vocabulary": "a", "y": 2}) is None
    assert "vocabulary: 'b' (sender) != 'a' (receiver)" in signatures_agree({"vocabulary": "a"}, {"vocabulary": "b"})


def _job(tmp_path, **kw):
    from tests.pipeline.helpers import toy_job

    base = dict(mode="oneway", recipe_args={"oneway": True}, oneway={"k": 1},
                clusters=[{"id": "G1"}, {"id": "G2"}, {"id": "D", "procs_per_node": 2}],
                stages=[{"name": "embed", "cluster": "G1"}, {"name": "mid1", "cluster": "G2"},
                        {"name": "head", "cluster": "D"}])
    base.update(kw)
    return toy_job(tmp_path, **base)


def test_job_accepts_three_clusters_of_unequal_size_and_refuses_too_large_k(tmp_path):
    from nebula.config.job import load_job_config

    cfg = load_job_config(_job(tmp_path))
    assert [c for c, _ in cfg.segments] == ["G1", "G2", "D"]
    assert load_job_config(_job(tmp_path, oneway={"k": "auto"})).oneway.k == "auto"
    with pytest.raises(ConfigError, match="oneway.k=2 needs cluster D to have 4 ranks.*at most 1"):
        load_job_config(_job(tmp_path, oneway={"k": 2}))
    with pytest.raises(ConfigError, match="oneway.k='fast' must be an integer >= 1 or 'auto'"):
        load_job_config(_job(tmp_path, oneway={"k": "fast"}))
    intra = load_job_config(_job(tmp_path)).intra("G1")
    assert intra.mode == "oneway" and len(intra.segments) == 1  # several generators: a local hand-off, no chain
    with pytest.raises(ValueError, match="local hand-off\\) runs on one rank, it has 2"):
        load_job_config(_job(tmp_path)).intra("D")


def test_checkpoint_of_another_preset_is_refused(tmp_path):
    from nebula.pipeline import checkpoint as ckpt
    from recipes.electra.model import Discriminator, preset

    tiny = Discriminator(preset("tiny").discriminator.replace(vocab_size=137, max_positions=24))
    small = Discriminator(preset("small").discriminator.replace(vocab_size=137, max_positions=24))
    opt = paddle.optimizer.Adam(parameters=tiny.parameters())
    ckpt.save(tmp_path, 4, "D", {"disc": (tiny, opt)}, {"job": "t"})
    opt2 = paddle.optimizer.Adam(parameters=small.parameters())
    with pytest.raises(ValueError, match="saved with another model size \\(preset\\)"):
        ckpt.load(ckpt.step_dir(tmp_path, 4), {"disc": (small, opt2)})


def test_progress_sums_counts_in_each_window_and_keeps_pairs_apart():
    from recipes.electra.summary import progress

    def rec(step, rep_ok):
        return {"step": step, "rtd_loss": 1.0 + step, "n/es": 10.0, "rtd_ok/es": 9.0, "clm_ok/es": 5.0,
                "rep_n/es": 4.0, "rep_ok/es": rep_ok, "n/en-es": 10.0, "rtd_ok/en-es": 9.0, "clm_ok/en-es": 8.0,
                "rep_n/en-es": 2.0, "rep_ok/en-es": 1.0}

    rows = progress([rec(0, 0.0), rec(1, 2.0), rec(2, 4.0)], [2, 3, 50], window=2)
    assert [r["steps"] for r in rows] == [(0, 1), (1, 2)]  # step 50's window holds no record
    assert rows[0]["rtd_loss"] == 1.5 and rows[0]["replaced_recall_mono"] == 2.0 / 8.0
    assert rows[1]["replaced_recall_mono"] == 6.0 / 8.0 and rows[1]["clm_acc_pairs"] == 0.8
