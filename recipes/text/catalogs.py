"""Text from gettext catalogs: parallel pairs (extracted, cleaned, deduplicated, split by hash, each side written to
its cluster) and the translated messages of each language (`load_corpus`)."""
from __future__ import annotations

import hashlib
import json
import logging
import re
import struct
import unicodedata
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from security._files import PUBLIC, atomic_write

__all__ = [
    "CatalogError",
    "DataConfig",
    "Pair",
    "read_mo",
    "extract_pairs",
    "clean_text",
    "keep_pair",
    "deduplicate",
    "bucket_of",
    "split_of",
    "restrict_vocabulary",
    "prepare_data",
    "load_corpus",
    "read_side",
    "SPLITS",
    "LOCALE_OF",
]

log = logging.getLogger(__name__)

SPLITS = ("train", "dev", "test")
# Target language code -> locale directory names tried in order.
LOCALE_OF: dict[str, tuple[str, ...]] = {"es": ("es",), "zh": ("zh_CN", "zh")}
# Packages whose catalogs hold most of the pairs on a Debian system.
DEBIAN_PACKAGES = "iso-codes coreutils grep tar findutils diffutils gettext libc-bin"

_MO_MAGIC_LE = 0x950412DE
_MO_MAGIC_BE = 0xDE120495

# Things that make a message a template rather than a sentence: printf/Python/brace specifiers,
# shell variables, markup and entities, escapes, command-line options, paths and URLs.
_REJECT = re.compile(
    r"%(\d+\$)?[-+ #0']*\d*(\.\d+)?[hlLqjzt]*[diouxXeEfFgGcspnm%]"
    r"|%\(\w+\)"
    r"|\{[\w.:]*\}"
    r"|\$\{?\w"
    r"|<[^>]*>|&\w+;"
    r"|[\\\n\t\r\x00-\x08]"
    r"|(^|\s)--?\w"
    r"|https?:|www\.|/\w+/|\w+\.\w{2,4}\b(?=\s|$)"
    r"|[\[\]=|@#*]"
)
_MNEMONIC = re.compile(r"_(?=\w)|&(?=\w)")
_SPACE = re.compile(r"\s+")


class CatalogError(RuntimeError):
    """No usable gettext catalogs: names the directory and the Debian packages that provide them."""


@dataclass(frozen=True, kw_only=True, slots=True)
class DataConfig:
    """How pairs are cleaned and split. Defaults: short messages, 2% test, 2% dev (by hash of the source)."""

    min_chars: int = 3  # shorter messages are labels like "OK" that carry no translation signal
    max_chars: int = 60
    max_words: int = 8
    dev_per_mille: int = 25
    test_per_mille: int = 25
    min_pairs: int = 50  # fewer pairs than this cannot train anything: treat as missing catalogs
    # Keep only pairs whose words (both sides) are among each language's `vocab_top_k` most frequent words
    # (0: keep all). A small model on 2 CPU cores sees each frequent word many times within minutes.
    vocab_top_k: int = 0
    salt: str = "nebula-abnet-v1"  # changing it reshuffles the split deterministically

    def __post_init__(self) -> None:
        if not 1 <= self.min_chars <= self.max_chars:
            raise ValueError(f"min_chars={self.min_chars}, max_chars={self.max_chars}: need 1 <= min_chars <= max_chars")
        if self.vocab_top_k < 0:
            raise ValueError(f"vocab_top_k={self.vocab_top_k}: must be >= 0 (0 keeps every pair)")
        if self.max_words < 1:
            raise ValueError(f"max_words={self.max_words}: must be >= 1")
        if self.dev_per_mille < 0 or self.test_per_mille < 1 or self.dev_per_mille + self.test_per_mille >= 1000:
            raise ValueError(
                f"dev_per_mille={self.dev_per_mille}, test_per_mille={self.test_per_mille}: need test >= 1 and "
                "dev + test < 1000"
            )


@dataclass(frozen=True, slots=True)
class Pair:
    """One cleaned translation pair with its stable id (hash of both sides)."""

    id: str
    src: str
    tgt: str
    catalog: str = field(default="", compare=False)


def read_mo(path: str | Path) -> list[tuple[str, str]]:
    """Parse a GNU .mo file into (msgid, msgstr) pairs: header dropped, context stripped, plural -> singular form."""
    data = Path(path).read_bytes()
    if len(data) < 28:
        raise ValueError(f"{path}: {len(data)} bytes is too short for a .mo file (needs a 28-byte header)")
    (magic,) = struct.unpack("<I", data[:4])
    if magic == _MO_MAGIC_LE:
        order = "<"
    elif magic == _MO_MAGIC_BE:
        order = ">"
    else:
        raise ValueError(f"{path}: bad magic 0x{magic:08x}; not a GNU .mo catalog (compile .po files with msgfmt)")
    _rev, count, off_ids, off_strs = struct.unpack(order + "4I", data[4:20])
    pairs = []
    for i in range(count):
        try:
            id_len, id_off = struct.unpack(order + "2I", data[off_ids + 8 * i : off_ids + 8 * i + 8])
            st_len, st_off = struct.unpack(order + "2I", data[off_strs + 8 * i : off_strs + 8 * i + 8])
        except struct.error as exc:
            raise ValueError(f"{path}: string table entry {i} lies outside the file ({exc})") from exc
        if id_off + id_len > len(data) or st_off + st_len > len(data):
            raise ValueError(f"{path}: string {i} lies outside the file; the catalog is truncated")
        msgid = data[id_off : id_off + id_len].decode("utf-8", errors="replace")
        msgstr = data[st_off : st_off + st_len].decode("utf-8", errors="replace")
        if not msgid:
            continue  # header entry
        msgid = msgid.split("\x04", 1)[-1].split("\x00", 1)[0]
        msgstr = msgstr.split("\x00", 1)[0]
        pairs.append((msgid, msgstr))
    return pairs


def _catalog_files(locale_root: Path, lang: str) -> list[Path]:
    """Every .mo file for target language `lang`, sorted (the order fixes deduplication ties)."""
    files: list[Path] = []
    for name in LOCALE_OF.get(lang, (lang,)):
        files.extend(sorted((locale_root / name / "LC_MESSAGES").glob("*.mo")))
        if files:
            break
    return files


def _missing(locale_root: Path, lang: str, found: str) -> CatalogError:
    dirs = ", ".join(str(locale_root / n / "LC_MESSAGES") for n in LOCALE_OF.get(lang, (lang,)))
    return CatalogError(
        f"{found} for English->{lang} under {dirs}. Install Debian packages that ship translations, e.g. "
        f"`apt-get install --reinstall {DEBIAN_PACKAGES}` (container images often exclude /usr/share/locale "
        "through /etc/dpkg/dpkg.cfg.d/excludes: remove that rule first), or pass --locale-dir to a directory "
        "holding <lang>/LC_MESSAGES/*.mo."
    )


def clean_text(text: str) -> str:
    """Normalise one message: NFC, mnemonic markers removed, whitespace collapsed, typographic ellipsis -> '...'."""
    text = unicodedata.normalize("NFC", text).replace("\u2026", "...")
    text = _MNEMONIC.sub("", text)
    return _SPACE.sub(" ", text).strip()


def keep_pair(src: str, tgt: str, cfg: DataConfig) -> bool:
    """True when a raw (msgid, msgstr) pair is a usable sentence pair under `cfg`."""
    if not src or not tgt or "\n" in src.strip() or "\n" in tgt.strip():
        return False
    if _REJECT.search(src) or _REJECT.search(tgt):
        return False
    s, t = clean_text(src), clean_text(tgt)
    if s.lower() == t.lower() or not any(c.isalpha() for c in s):
        return False
    for side in (s, t):
        if not cfg.min_chars <= len(side) <= cfg.max_chars:
            return False
    return len(s.split()) <= cfg.max_words


def _pair_id(src: str, tgt: str) -> str:
    return hashlib.sha256(f"{src}\t{tgt}".encode()).hexdigest()[:16]


def extract_pairs(lang: str, locale_root: str | Path = "/usr/share/locale", cfg: DataConfig | None = None) -> list[Pair]:
    """All clean English->`lang` pairs from the catalogs under `locale_root`, before deduplication."""
    cfg = cfg or DataConfig()
    root = Path(locale_root)
    files = _catalog_files(root, lang)
    if not files:
        raise _missing(root, lang, "no gettext catalogs (*.mo)")
    pairs = []
    for f in files:
        try:
            raw = read_mo(f)
        except ValueError as exc:
            log.warning("skipping unreadable catalog: %s", exc)
            continue
        for msgid, msgstr in raw:
            if keep_pair(msgid, msgstr, cfg):
                s, t = clean_text(msgid), clean_text(msgstr)
                pairs.append(Pair(_pair_id(s, t), s, t, f.stem))
    return pairs


def deduplicate(pairs: Iterable[Pair]) -> list[Pair]:
    """One pair per source (case-insensitive): its most frequent translation, ties to the smallest; sorted by id."""
    by_src: dict[str, Counter] = defaultdict(Counter)
    first: dict[tuple[str, str], Pair] = {}
    for p in pairs:
        key = p.src.lower()
        by_src[key][p.tgt] += 1
        first.setdefault((key, p.tgt), p)
    out = []
    for key, counts in by_src.items():
        tgt = min(counts, key=lambda t: (-counts[t], t))
        out.append(first[(key, tgt)])
    # A target shared by many sources is kept once per source: different sources are different examples.
    return sorted(out, key=lambda p: p.id)


# Words: runs of letters/digits, except that each CJK character counts as a word (Chinese has no spaces).
_WORD = re.compile(r"[\u3400-\u9fff]|[^\W\u3400-\u9fff]+")


def restrict_vocabulary(pairs: list[Pair], top_k: int) -> list[Pair]:
    """Pairs whose words are all among the `top_k` most frequent words of their side (top_k=0: all pairs)."""
    if not top_k:
        return pairs
    words = lambda s: _WORD.findall(s.lower())  # noqa: E731
    keep = []
    for side in ("src", "tgt"):
        counts = Counter(w for p in pairs for w in words(getattr(p, side)))
        keep.append({w for w, _ in counts.most_common(top_k)})
    return [p for p in pairs if all(w in keep[0] for w in words(p.src)) and all(w in keep[1] for w in words(p.tgt))]


def bucket_of(text: str, salt: str) -> int:
    """Bucket 0..999 of an English sentence under `salt` (case-insensitive): the hash every recipe splits by."""
    return int(hashlib.sha256(f"{salt}\t{text.lower()}".encode()).hexdigest()[:8], 16) % 1000


def split_of(src: str, cfg: DataConfig) -> str:
    """Split ('train', 'dev' or 'test') of a source sentence: a salted hash, so it never depends on order."""
    bucket = bucket_of(src, cfg.salt)
    if bucket < cfg.test_per_mille:
        return "test"
    if bucket < cfg.test_per_mille + cfg.dev_per_mille:
        return "dev"
    return "train"


def _write_tsv(path: Path, rows: Iterable[tuple[str, str]]) -> int:
    n = 0

    def write(tmp: Path) -> None:
        nonlocal n
        with open(tmp, "w", encoding="utf-8") as fh:
            for rid, text in rows:
                fh.write(f"{rid}\t{text}\n")
                n += 1

    atomic_write(path, write, PUBLIC)
    return n


def prepare_data(
    encoder_dir: str | Path,
    decoder_dir: str | Path,
    langs: Iterable[str] = ("es",),
    locale_root: str | Path = "/usr/share/locale",
    cfg: DataConfig | None = None,
) -> dict:
    """Write `<encoder_dir>/en-<lang>/<split>.en.tsv` (English + ids only) and `<decoder_dir>/en-<lang>/<split>.<lang>.tsv`
    (target + ids only); returns counts per pair and split."""
    cfg = cfg or DataConfig()
    summary: dict = {}
    for lang in langs:
        pairs = restrict_vocabulary(deduplicate(extract_pairs(lang, locale_root, cfg)), cfg.vocab_top_k)
        if len(pairs) < cfg.min_pairs:
            raise _missing(Path(locale_root), lang, f"only {len(pairs)} usable pairs (need {cfg.min_pairs})")
        pair_name = f"en-{lang}"
        enc, dec = Path(encoder_dir) / pair_name, Path(decoder_dir) / pair_name
        enc.mkdir(parents=True, exist_ok=True)
        dec.mkdir(parents=True, exist_ok=True)
        by_split: dict[str, list[Pair]] = {s: [] for s in SPLITS}
        for p in pairs:
            by_split[split_of(p.src, cfg)].append(p)
        counts = {}
        for split, rows in by_split.items():
            counts[split] = _write_tsv(enc / f"{split}.en.tsv", ((p.id, p.src) for p in rows))
            _write_tsv(dec / f"{split}.{lang}.tsv", ((p.id, p.tgt) for p in rows))
        for side_dir, side_lang in ((enc, "en"), (dec, lang)):
            (side_dir / "manifest.json").write_text(
                json.dumps({"pair": pair_name, "side": side_lang, "counts": counts, "config": _cfg_dict(cfg)}, indent=1)
            )
        summary[pair_name] = counts
        log.info("%s: %s", pair_name, counts)
    return summary


def _cfg_dict(cfg: DataConfig) -> dict:
    return {k: getattr(cfg, k) for k in cfg.__slots__}


def read_side(path: str | Path) -> tuple[list[str], list[str]]:
    """Read one side file written by prepare_data: (ids, texts) in file order."""
    ids, texts = [], []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            line = line.rstrip("\n")
            if not line:
                continue
            rid, sep, text = line.partition("\t")
            if not sep:
                raise ValueError(f"{path}:{n}: expected 'id<TAB>text', got {line[:60]!r}; regenerate with prepare_data")
            ids.append(rid)
            texts.append(text)
    return ids, texts


def iter_files(side_dir: str | Path) -> Iterator[Path]:
    """Every side file under a cluster's data directory (used to check that a cluster holds only its own side)."""
    yield from sorted(Path(side_dir).rglob("*.tsv"))


def load_corpus(langs: tuple[str, ...], locale_root: str | Path = "/usr/share/locale",
                max_per_lang: int = 3000) -> dict[str, list[str]]:
    """Cleaned, deduplicated translated strings (msgstr) per language, 12..160 characters, none that two languages
share (untranslated strings), at most `max_per_lang` chosen by hash."""
    texts: dict[str, set[str]] = {}
    for lang in langs:
        files = sorted((Path(locale_root) / lang / "LC_MESSAGES").glob("*.mo"))
        if not files:
            raise FileNotFoundError(f"no gettext catalogs under {locale_root}/{lang}/LC_MESSAGES; install packages "
                                    "that ship translations (e.g. coreutils, tar, grep, iso-codes) or pick other "
                                    "languages")
        got = set()
        for f in files:
            for _, msgstr in read_mo(f):
                t = clean_text(msgstr)
                if 12 <= len(t) <= 160 and "%" not in t and "<" not in t:
                    got.add(t)
        texts[lang] = got
    owners: dict[str, int] = defaultdict(int)
    for got in texts.values():
        for t in got:
            owners[t] += 1
    out = {}
    for lang, got in texts.items():
        keep = sorted((t for t in got if owners[t] == 1), key=lambda t: hashlib.sha1(t.encode()).hexdigest())
        out[lang] = keep[:max_per_lang]
    return out
