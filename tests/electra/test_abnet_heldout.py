"""ELECTRA's training text never holds ABNet's dev/test sentences: both corpora prepared from the same catalogs."""
from __future__ import annotations

import json

import pytest

from recipes.text.catalogs import DataConfig, prepare_data, read_side
from recipes.electra.data import CorpusConfig, prepare, split_of
from tests.electra.conftest import GROUPS, write_catalogs


def test_no_abnet_dev_or_test_sentence_or_translation_is_in_electra_training_text(tmp_path):
    locale = write_catalogs(tmp_path / "locale", ("es", "it"))
    abnet = DataConfig(test_per_mille=100, dev_per_mille=100)  # the share of the published ABNet comparison
    prepare_data(tmp_path / "A", tmp_path / "B", ["es"], locale, abnet)
    heldout_en, heldout_es = set(), set()
    for split in ("dev", "test"):
        heldout_en |= {t.lower() for t in read_side(tmp_path / "A" / "en-es" / f"{split}.en.tsv")[1]}
        heldout_es |= {t.lower() for t in read_side(tmp_path / "B" / "en-es" / f"{split}.es.tsv")[1]}
    cfg = CorpusConfig(groups={"romance": ("es", "it")}, vocab_size=300, max_len=24)
    # Without the exclusion these sentences would train ELECTRA: its own hash puts most of them in train.
    by_electra_hash = [s for s in heldout_en if split_of(s, cfg.salt, cfg.test_per_mille, cfg.dev_per_mille) == "train"]
    assert len(heldout_en) >= 20 and len(by_electra_hash) > len(heldout_en) // 2
    meta = prepare(tmp_path / "E", cfg, locale)
    train = [json.loads(line) for line in (tmp_path / "E" / "train.jsonl").read_text(encoding="utf-8").splitlines()]
    texts = {e["en"].lower() for e in train} | {e["text"].lower() for e in train}
    assert not texts & heldout_en
    assert not texts & heldout_es
    assert meta["split_sizes"]["train"] > 0
    # ELECTRA's own dev/test split is unchanged: it still follows ELECTRA's hash alone.
    for split in ("dev", "test"):
        rows = (tmp_path / "E" / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()
        assert rows and all(split_of(json.loads(r)["en"], cfg.salt, cfg.test_per_mille, cfg.dev_per_mille) == split
                            for r in rows)


def test_abnet_share_out_of_range_is_refused():
    with pytest.raises(ValueError, match="abnet_test_per_mille=500"):
        CorpusConfig(groups=GROUPS, abnet_test_per_mille=500)


def test_overlap_cli_reports_zero_for_abnet_split_of_the_same_catalogs(tmp_path, capsys):
    from recipes.electra.overlap import main

    locale = write_catalogs(tmp_path / "locale")
    assert main(["--locale-dir", str(locale), "--vocab-top-k", "0", "--groups", "a=es,it;b=ru,ja"]) == 0
    out = capsys.readouterr().out
    assert "ABNet test: " in out and "ABNet dev: " in out
    assert out.count(" 0 in ELECTRA's training English, 0 English or translation") == 2
    assert "ABNet test: 0 English" not in out  # there was something to leak
