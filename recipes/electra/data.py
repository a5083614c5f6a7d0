"""Multilingual corpus from the gettext catalogs: monolingual text (MRTD), English-X pairs (TRTD), language groups.

Every catalog message gives an English msgid and its translation; both sides are cleaned and deduplicated (ABNet's
rules), then split by a salted hash of the English text, so a sentence and all its translations land in one split.
One sentencepiece vocabulary is trained on the training split of every language. Each language group (one
generator cluster each, M3) gets its own encoded examples: monolingual sentences of its languages and
English-X pairs ``[CLS] en [CLS] x``; English monolingual text goes to the first group.
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from recipes.text.catalogs import DataConfig as PairRules
from recipes.text.catalogs import Pair, bucket_of, deduplicate, extract_pairs
from recipes.text.catalogs import split_of as abnet_split_of
from recipes.text.tokenizer import CLS_ID, PAD_ID, Tokenizer, train_tokenizer

__all__ = ["CorpusConfig", "Example", "DEFAULT_GROUPS", "parse_groups", "split_of", "abnet_heldout",
           "build_corpus", "encode_group",
           "prepare", "load_group", "read_meta", "MRTD", "TRTD", "TOKENIZER_FILE", "GroupData"]

log = logging.getLogger(__name__)

MRTD, TRTD = 0, 1
TOKENIZER_FILE, META_FILE = "spm.model", "meta.json"
# Grouped by family as M2M-100 does: Romance + Germanic on one generator, Slavic + CJK on the other.
DEFAULT_GROUPS = {"romance_germanic": ("es", "fr", "it", "pt_BR", "de"), "slavic_cjk": ("ru", "zh_CN", "ja")}


@dataclass(frozen=True, kw_only=True, slots=True)
class CorpusConfig:
    """How the corpus is built: languages by group, message length, split sizes, vocabulary, sequence length."""

    groups: dict[str, tuple[str, ...]]
    max_chars: int = 80
    max_words: int = 12
    test_per_mille: int = 50
    dev_per_mille: int = 25
    vocab_size: int = 2000
    character_coverage: float = 0.995  # CJK scripts hold thousands of characters: the rarest become <unk>
    max_len: int = 32  # tokens per example, [CLS] included (TRTD pairs share it)
    max_per_language: int = 0  # 0: every message
    salt: str = "nebula-electra-v1"
    # ABNet's --test-per-mille (its dev share is the same): every message ABNet holds out (dev or test) at this
    # share or any smaller one, and every translation of it, stays out of the training split, so a discriminator
    # exported as an ABNet base has never seen ABNet's evaluation sentences. 100 covers the published comparison.
    abnet_test_per_mille: int = 100

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError("groups is empty; name at least one language group, e.g. romance=es,fr")
        seen: set[str] = set()
        for name, langs in self.groups.items():
            if not langs:
                raise ValueError(f"language group {name!r} lists no language; give it at least one (e.g. {name}=es)")
            dup = seen & set(langs)
            if dup:
                raise ValueError(f"language {sorted(dup)[0]} is in two groups; put each language in one group")
            if "en" in langs:
                raise ValueError(f"group {name!r} lists en: English is the pivot of every pair and already the "
                                 "first group's monolingual text; remove it")
            seen |= set(langs)
        if self.max_len < 8 or self.vocab_size < 100:
            raise ValueError(f"max_len={self.max_len} must be >= 8 and vocab_size={self.vocab_size} >= 100")
        t, d = self.test_per_mille, self.dev_per_mille
        if not (0 < t and d >= 0 and t + d < 1000):
            raise ValueError(f"test_per_mille={self.test_per_mille}, dev_per_mille={self.dev_per_mille}: need "
                             "test >= 1 and dev + test < 1000")
        if not 1 <= self.abnet_test_per_mille < 500:
            raise ValueError(f"abnet_test_per_mille={self.abnet_test_per_mille}: must be ABNet's --test-per-mille, "
                             "1..499 (its dev + test must stay under 1000)")

    @property
    def languages(self) -> tuple[str, ...]:
        """English first, then every group's languages in order."""
        return ("en",) + tuple(lang for langs in self.groups.values() for lang in langs)


@dataclass(frozen=True, slots=True)
class Example:
    """One translated message: English text, its translation, the language and the catalog (software domain)."""

    lang: str
    en: str
    text: str
    domain: str


def parse_groups(spec: str) -> dict[str, tuple[str, ...]]:
    """'romance=es,fr;slavic=ru' -> {'romance': ('es', 'fr'), 'slavic': ('ru',)}."""
    out: dict[str, tuple[str, ...]] = {}
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        name, sep, langs = part.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"group {part!r} must read name=lang,lang (e.g. romance=es,fr)")
        out[name.strip()] = tuple(x.strip() for x in langs.split(",") if x.strip())
    return out


def split_of(en: str, salt: str, test_per_mille: int, dev_per_mille: int) -> str:
    """'train', 'dev' or 'test' for an English sentence: a salted hash, the same for every language."""
    bucket = bucket_of(en, salt)
    if bucket < test_per_mille:
        return "test"
    return "dev" if bucket < test_per_mille + dev_per_mille else "train"


def abnet_heldout(pairs: Iterable[Pair], abnet_test_per_mille: int) -> set[str]:
    """Lower-cased English originals that ABNet's own split puts in dev or test at `abnet_test_per_mille` (dev the
    same share, as its CLI sets), with every translation any catalog gives them."""
    rules = PairRules(test_per_mille=abnet_test_per_mille, dev_per_mille=abnet_test_per_mille)
    return {s.lower() for p in pairs if abnet_split_of(p.src, rules) != "train" for s in (p.src, p.tgt)}


def build_corpus(cfg: CorpusConfig, locale_root: str | Path = "/usr/share/locale") -> dict[str, list[Example]]:
    """Examples per split over all languages; a language without catalogs is an error naming the fix.
    Training examples touching ABNet's held-out sentences (either side, see `abnet_heldout`) are dropped."""
    rules = PairRules(max_chars=cfg.max_chars, max_words=cfg.max_words, min_pairs=1)
    out: dict[str, list[Example]] = {"train": [], "dev": [], "test": []}
    heldout: set[str] = set()
    for lang in cfg.languages[1:]:
        raw = extract_pairs(lang, locale_root, rules)
        heldout |= abnet_heldout(raw, cfg.abnet_test_per_mille)  # before deduplication: every translation
        pairs: list[Pair] = deduplicate(raw)
        if cfg.max_per_language:
            pairs = sorted(pairs, key=lambda p: hashlib.sha256(f"{cfg.salt}{p.src}".encode()).digest())
            pairs = pairs[:cfg.max_per_language]
        seen: set[str] = set()
        for p in pairs:
            if p.tgt.lower() in seen:  # a translation shared by several English messages: keep it once
                continue
            seen.add(p.tgt.lower())
            split = split_of(p.src, cfg.salt, cfg.test_per_mille, cfg.dev_per_mille)
            out[split].append(Example(lang, p.src, p.tgt, p.catalog))
    kept = [e for e in out["train"] if e.en.lower() not in heldout and e.text.lower() not in heldout]
    log.info("dropped %d training examples held out by ABNet", len(out["train"]) - len(kept))
    out["train"] = kept
    for split in out:
        out[split].sort(key=lambda e: (e.lang, e.en))
    return out


@dataclass(frozen=True, slots=True)
class GroupData:
    """Encoded examples of one language group: ids [N, L] (PAD-padded), language index and task per row."""

    ids: np.ndarray
    lang: np.ndarray
    task: np.ndarray


def encode_group(tok: Tokenizer, examples: Iterable[Example], langs: tuple[str, ...], languages: tuple[str, ...],
                 max_len: int, with_english: bool) -> GroupData:
    """MRTD rows (one per sentence of each language in `langs`, English too if `with_english`) and TRTD rows."""
    rows: list[list[int]] = []
    lang_of: list[int] = []
    task: list[int] = []
    english: set[str] = set()
    for e in examples:
        if e.lang not in langs:
            continue
        x = tok.encode(e.text)
        rows.append([CLS_ID] + x[:max_len - 1])
        lang_of.append(languages.index(e.lang))
        task.append(MRTD)
        en = tok.encode(e.en)
        half = (max_len - 2) // 2
        a, b = en[:max(half, max_len - 2 - len(x))], x
        rows.append(([CLS_ID] + a + [CLS_ID] + b)[:max_len])
        lang_of.append(languages.index(e.lang))
        task.append(TRTD)
        if with_english and e.en.lower() not in english:
            english.add(e.en.lower())
            rows.append([CLS_ID] + en[:max_len - 1])
            lang_of.append(0)
            task.append(MRTD)
    ids = np.full((len(rows), max_len), PAD_ID, dtype=np.int32)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = r
    return GroupData(ids, np.asarray(lang_of, dtype=np.int32), np.asarray(task, dtype=np.int32))


def prepare(out_dir: str | Path, cfg: CorpusConfig, locale_root: str | Path = "/usr/share/locale") -> dict:
    """Build the corpus, the shared tokenizer and each group's encoded training examples under `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    corpus = build_corpus(cfg, locale_root)
    for split, exs in corpus.items():
        with open(out / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for e in exs:
                f.write(json.dumps({"lang": e.lang, "en": e.en, "text": e.text, "domain": e.domain},
                                   ensure_ascii=False) + "\n")
    train = corpus["train"]
    texts = sorted({e.en for e in train}) + [e.text for e in train]
    tok = train_tokenizer(texts, out / TOKENIZER_FILE, cfg.vocab_size, cfg.character_coverage)
    counts = {}
    for gi, (name, langs) in enumerate(cfg.groups.items()):
        g = encode_group(tok, train, langs, cfg.languages, cfg.max_len, with_english=gi == 0)
        np.savez(out / f"group_{name}.npz", ids=g.ids, lang=g.lang, task=g.task)
        counts[name] = int(len(g.ids))
    meta = {
        "languages": list(cfg.languages), "groups": {k: list(v) for k, v in cfg.groups.items()},
        "vocab_size": tok.vocab_size, "max_len": cfg.max_len, "group_examples": counts,
        "tokenizer_sha256": hashlib.sha256((out / TOKENIZER_FILE).read_bytes()).hexdigest()[:16],
        "split_sizes": {s: len(v) for s, v in corpus.items()},
        "per_language_train": {lang: sum(e.lang == lang for e in train) for lang in cfg.languages[1:]},
    }
    (out / META_FILE).write_text(json.dumps(meta, indent=1))
    return meta


def read_meta(data_dir: str | Path) -> dict:
    """meta.json of a prepared data directory, or FileNotFoundError naming the command that writes it."""
    f = Path(data_dir) / META_FILE
    if not f.is_file():
        raise FileNotFoundError(f"{f} not found: prepare the data first (python -m recipes.electra.prepare --out "
                                f"{data_dir})")
    return json.loads(f.read_text())


def load_group(data_dir: str | Path, group: str) -> GroupData:
    """One group's encoded examples; an error naming the fix when the group has no text."""
    meta = read_meta(data_dir)
    if group not in meta["groups"]:
        raise ValueError(f"language group {group!r} is not in {data_dir} (it has {sorted(meta['groups'])}); "
                         "prepare the data with that group or fix the recipe's groups")
    f = Path(data_dir) / f"group_{group}.npz"
    if not f.is_file():
        raise FileNotFoundError(f"{f} not found: this cluster holds no text of group {group!r}; copy it from "
                                "the prepared data directory")
    z = np.load(f)
    g = GroupData(z["ids"], z["lang"], z["task"])
    if len(g.ids) == 0:
        langs = ", ".join(meta["groups"][group])
        raise ValueError(f"language group {group!r} ({langs}) has no text in {data_dir}: its catalogs gave no "
                         "usable message; install that language's translations or drop the group")
    return g
