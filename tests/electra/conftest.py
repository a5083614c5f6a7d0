"""Fixtures of the ELECTRA recipe tests: gettext catalogs in four languages written by the test, a prepared corpus."""
from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.recipes.conftest import ADJS, NOUNS, VERBS, write_mo

GROUPS = {"romance": ("es", "it"), "slavic_cjk": ("ru", "ja")}
_CYR = str.maketrans("abcdefghijklmnopqrstuvwxyz", "абцдефгхийклмнопкрстувшхыз")
_KANA = dict(zip("abcdefghijklmnopqrstuvwxyz",
                 "アブクデエフグハイジカルムンオプクルスツウヴワクヤズ"))


def _translate(lang: str, phrase: str) -> str:
    """A deterministic stand-in translation: Spanish words, then respelled per language."""
    words = [{**VERBS, **NOUNS, **ADJS}.get(w, w) for w in phrase.split()]
    es = " ".join(words)
    if lang == "es":
        return es
    if lang == "it":
        return " ".join(w[:-1] + "o" if w.endswith("a") else w + "e" for w in words)
    if lang == "ru":
        return es.translate(_CYR)
    return "".join(_KANA.get(c, c) for c in es.replace(" ", ""))


def phrases() -> list[str]:
    """English messages: verb + (adjective) + noun."""
    out = [f"{v} {n}" for v, n in itertools.product(VERBS, NOUNS)]
    out += [f"{v} {a} {n}" for v, a, n in itertools.product(VERBS, ADJS, NOUNS)]
    return out


def write_catalogs(root: Path, langs: tuple[str, ...] = ("es", "it", "ru", "ja")) -> Path:
    """<root>/<lang>/LC_MESSAGES/{files,images}.mo: two software domains per language."""
    ps = phrases()
    first = tuple(VERBS)[:4]  # the domain follows the verb, so a classifier can learn it
    files = [p for p in ps if p.split()[0] in first]
    images = [p for p in ps if p.split()[0] not in first]
    for lang in langs:
        for domain, part in (("files", files), ("images", images)):
            write_mo(root / lang / "LC_MESSAGES" / f"{domain}.mo", [(p, _translate(lang, p)) for p in part])
    return root


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    """A prepared corpus (both groups, tokenizer, meta) from the test's own catalogs."""
    from recipes.electra.data import CorpusConfig, prepare

    root = tmp_path_factory.mktemp("electra")
    write_catalogs(root / "locale")
    prepare(root / "corpus", CorpusConfig(groups=GROUPS, vocab_size=300, max_len=32, test_per_mille=100),
            root / "locale")
    return root / "corpus"
