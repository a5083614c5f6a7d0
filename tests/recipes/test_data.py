"""Data extraction from gettext catalogs: parsing, cleaning, deduplication, deterministic split, side separation."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from recipes.text.catalogs import (CatalogError, DataConfig, Pair, deduplicate, extract_pairs, keep_pair, prepare_data,
                                read_mo, read_side, restrict_vocabulary, split_of)
from tests.recipes.conftest import corpus_pairs, write_mo


def test_read_mo_both_byte_orders_context_and_header(tmp_path):
    pairs = [("ctx\x04Open", "Abrir"), ("Save", "Guardar")]
    for big in (False, True):
        got = read_mo(write_mo(tmp_path / f"x{big}.mo", pairs, big_endian=big))
        assert sorted(got) == [("Open", "Abrir"), ("Save", "Guardar")]  # header dropped, context stripped


def test_read_mo_rejects_non_catalogs(tmp_path):
    bad = tmp_path / "bad.mo"
    bad.write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="bad magic"):
        read_mo(bad)
    short = tmp_path / "short.mo"
    short.write_bytes(b"\xde\x12")
    with pytest.raises(ValueError, match="too short"):
        read_mo(short)


@pytest.mark.parametrize("src,tgt,keep", [
    ("open file", "abrir archivo", True),
    ("cannot open %s", "no se puede abrir %s", False),
    ("%1$s of %2$d", "%1$s de %2$d", False),
    ("could not close file: %m", "no se pudo cerrar: %m", False),
    ("value {name}", "valor {name}", False),
    ("<b>bold</b>", "<b>negrita</b>", False),
    ("use --force", "usa --force", False),
    ("OK", "Aceptar", False),
    ("same", "same", False),
    ("see https://example.org", "ver https://example.org", False),
    ("one two three four five six seven eight nine", "uno dos tres cuatro cinco seis siete ocho nueve", False),
])
def test_cleaning_rules(src, tgt, keep):
    assert keep_pair(src, tgt, DataConfig()) is keep


def test_deduplicate_keeps_most_frequent_translation():
    ps = [Pair("1", "Open", "Abrir"), Pair("2", "open", "Abre"), Pair("3", "Open", "Abrir"), Pair("4", "Save", "Guardar")]
    out = {p.src.lower(): p.tgt for p in deduplicate(ps)}
    assert out == {"open": "Abrir", "save": "Guardar"}


def test_split_is_deterministic_and_order_free():
    cfg = DataConfig(test_per_mille=100, dev_per_mille=100)
    srcs = [f"sentence {i}" for i in range(2000)]
    a = [split_of(s, cfg) for s in srcs]
    b = [split_of(s, cfg) for s in reversed(srcs)][::-1]
    assert a == b
    frac = {k: a.count(k) / len(a) for k in ("train", "dev", "test")}
    assert 0.06 < frac["test"] < 0.14 and 0.06 < frac["dev"] < 0.14
    other = [split_of(s, DataConfig(test_per_mille=100, dev_per_mille=100, salt="x")) for s in srcs]
    assert other != a  # the salt really reshuffles


def test_extract_cleans_and_deduplicates(locale_dir):
    pairs = deduplicate(extract_pairs("es", locale_dir))
    srcs = {p.src for p in pairs}
    assert len(pairs) == len(corpus_pairs()) + 1  # the corpus plus "Quit program"; duplicates merged, noise dropped
    assert "Quit program" in srcs and not any("%" in s or "<" in s or "--" in s for s in srcs)
    assert {p.tgt for p in pairs if p.src == "Quit program"} == {"Salir del programa"}


def test_prepare_writes_each_side_only_to_its_cluster(locale_dir, tmp_path):
    enc, dec = tmp_path / "A", tmp_path / "B"
    counts = prepare_data(enc, dec, ["es"], locale_dir, DataConfig(test_per_mille=100, dev_per_mille=100))
    c = counts["en-es"]
    assert c["train"] + c["dev"] + c["test"] == len(corpus_pairs()) + 1 and c["test"] > 0 and c["dev"] > 0
    english = {en for en, _ in corpus_pairs()}
    spanish = {es for _, es in corpus_pairs()}
    enc_files = sorted(p.name for p in enc.rglob("*.tsv"))
    dec_files = sorted(p.name for p in dec.rglob("*.tsv"))
    assert enc_files == ["dev.en.tsv", "test.en.tsv", "train.en.tsv"]
    assert dec_files == ["dev.es.tsv", "test.es.tsv", "train.es.tsv"]
    enc_text = "\n".join(p.read_text() for p in enc.rglob("*") if p.is_file())
    dec_text = "\n".join(p.read_text() for p in dec.rglob("*") if p.is_file())
    assert not any(s in enc_text for s in spanish)  # the encoder cluster never sees the target side
    assert not any(f"\t{s}\n" in dec_text for s in english)
    for split in ("train", "dev", "test"):
        ids_a, _ = read_side(enc / "en-es" / f"{split}.en.tsv")
        ids_b, _ = read_side(dec / "en-es" / f"{split}.es.tsv")
        assert ids_a == ids_b  # aligned only by ids
    again = tmp_path / "again"
    prepare_data(again / "A", again / "B", ["es"], locale_dir, DataConfig(test_per_mille=100, dev_per_mille=100))
    for f in ("train.en.tsv", "test.en.tsv"):
        assert (again / "A" / "en-es" / f).read_text() == (enc / "en-es" / f).read_text()


def test_missing_catalogs_name_debian_packages(tmp_path):
    with pytest.raises(CatalogError, match="apt-get install .*iso-codes.*coreutils"):
        prepare_data(tmp_path / "A", tmp_path / "B", ["es"], tmp_path / "empty")
    proc = subprocess.run([sys.executable, "-m", "recipes.abnet.prepare", "data", "--encoder-out", str(tmp_path / "A"),
                           "--decoder-out", str(tmp_path / "B"), "--langs", "zh", "--locale-dir", str(tmp_path)],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 2 and "zh_CN/LC_MESSAGES" in proc.stderr and "apt-get install" in proc.stderr


def test_too_few_pairs_is_reported_like_missing_catalogs(tmp_path):
    write_mo(tmp_path / "loc" / "es" / "LC_MESSAGES" / "a.mo", [("open file", "abrir archivo")])
    with pytest.raises(CatalogError, match="only 1 usable pairs"):
        prepare_data(tmp_path / "A", tmp_path / "B", ["es"], tmp_path / "loc")


def test_restrict_vocabulary_keeps_pairs_of_frequent_words():
    ps = [Pair("1", "open file", "abrir archivo"), Pair("2", "open window", "abrir ventana"),
          Pair("3", "open file now", "abrir archivo ya"), Pair("4", "rare thing", "cosa rara")]
    assert restrict_vocabulary(ps, 0) == ps
    kept = {p.id for p in restrict_vocabulary(ps, 3)}  # top 3 English words: open, file, + one tie
    assert "1" in kept and "4" not in kept
    zh = [Pair("5", "error", "错误"), Pair("6", "errors", "错误错误"), Pair("7", "rare", "罕")]
    assert {p.id for p in restrict_vocabulary(zh, 2)} == {"5", "6"}  # Chinese counted per character
    with pytest.raises(ValueError, match="vocab_top_k"):
        DataConfig(vocab_top_k=-1)
