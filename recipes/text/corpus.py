"""A language-model corpus built from text any Debian machine can install: the Python documentation (HTML), the
manual pages (roff) and the gettext catalogs (English messages and their German, Spanish and French translations).

Each source yields documents; their text is cleaned (markup, navigation, code and very short lines dropped,
whitespace normalised), deduplicated paragraph by paragraph, packed into lines of about `line_chars` characters cut
at word boundaries (one line: about one training sequence), and split into train and held-out **by document**: the
held-out documents are those with the smallest salted hash of their id, so no held-out text is seen in training.

`python -m recipes.text.corpus OUT [--max-chars N] [--no-install]` writes OUT/train.txt, OUT/heldout.txt and
OUT/corpus.json; a second call with the same parameters reuses them.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import os
import random
import re
import shutil
import subprocess
import sys
import time
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

from security._files import PUBLIC, atomic_write

__all__ = [
    "CorpusError",
    "CorpusInfo",
    "Doc",
    "SOURCES",
    "PACKAGES",
    "GETTEXT_LANGS",
    "ensure_packages",
    "default_roots",
    "documents",
    "html_to_text",
    "roff_to_text",
    "clean_paragraphs",
    "is_prose",
    "normalise",
    "pack_lines",
    "build_corpus",
    "main",
]

SOURCES = ("python-doc", "man", "gettext")
# Debian packages that provide each source (gettext catalogs come with the programs themselves).
PACKAGES: dict[str, tuple[str, ...]] = {"python-doc": ("python3-doc",), "man": ("manpages", "manpages-dev"),
                                        "gettext": ()}
GETTEXT_LANGS = ("de", "es", "fr")  # the languages the LLM recipe already trains on
_VERSION = 1  # bump when cleaning or packing changes, so older builds are not reused
_HELDOUT_SALT = "nebula-corpus-heldout-v1"  # fixed: the held-out documents never depend on the seed
_MAN_FAMILY_CAP = 200  # pages per command family (e.g. thousands of generated `gcloud_*` pages): keeps the mix
_GROFF_TIMEOUT_S = 60


class CorpusError(RuntimeError):
    """A source cannot be read: names it and the fix."""


@dataclass(frozen=True)
class Doc:
    """One document: a stable id, its source and its cleaned text (paragraphs split by '\\n'; a blank line ends a
    section, which packed lines never cross)."""

    id: str
    source: str
    text: str

    def __post_init__(self) -> None:
        if not self.id or self.source not in SOURCES:
            raise ValueError(f"Doc(id={self.id!r}, source={self.source!r}): need an id and a source in {SOURCES}")


@dataclass(frozen=True)
class CorpusInfo:
    """What `build_corpus` wrote: the two files, their sizes and the documents used per source."""

    train: Path
    heldout: Path
    train_lines: int
    heldout_lines: int
    train_chars: int
    sources: dict[str, int] = field(default_factory=dict)  # source name -> documents used (train + held-out)
    heldout_chars: int = 0

    def __post_init__(self) -> None:
        if min(self.train_lines, self.heldout_lines, self.train_chars, self.heldout_chars) < 0:
            raise ValueError(f"{self}: line and character counts must be >= 0")

    def to_json(self) -> dict:
        d = asdict(self)
        d["train"], d["heldout"] = str(self.train), str(self.heldout)
        return d


# ----------------------------------------------------------------------------------------------------------- packages
def _installed(pkg: str) -> bool:
    if not shutil.which("dpkg-query"):
        return False
    r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True, text=True)
    return r.returncode == 0 and r.stdout.strip().endswith("installed") and "not-installed" not in r.stdout


def ensure_packages(packages: Sequence[str] = ("python3-doc", "manpages", "manpages-dev"), *,
                    install: bool = True) -> list[str]:
    """The `packages` present after installing the missing ones with apt-get (when root and `install`). Never
    raises: when some stay missing it prints one line saying which and how to install them."""
    missing = [p for p in packages if not _installed(p)]
    can = install and hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get") is not None
    if missing and can:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
        for attempt in range(2):  # a stale package list fails the first try: update it once and retry
            try:
                r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
            except (OSError, subprocess.TimeoutExpired):
                break
            if r.returncode == 0 or attempt:
                break
            try:
                subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=600)
            except (OSError, subprocess.TimeoutExpired):
                break
        missing = [p for p in missing if not _installed(p)]
    if missing:
        why = "" if can or not install else " (not root or no apt-get here)"
        print(f"recipes.text.corpus: Debian packages {' '.join(missing)} are missing{why}; install them with "
              f"`sudo apt-get install {' '.join(missing)}`, or the corpus is built from the other sources",
              file=sys.stderr)
    return [p for p in packages if p not in missing]


# ------------------------------------------------------------------------------------------------------------- roots
def _python_doc_root() -> Path | None:
    """The Python documentation's HTML directory (python3-doc installs it under /usr/share/doc/python3.X/html)."""
    seen = set()
    for cand in sorted(Path("/usr/share/doc").glob("python3*/html"), key=lambda p: (p.parent.name != "python3-doc",
                                                                                    p.as_posix())):
        real = cand.resolve()
        if real in seen or not real.is_dir():
            continue
        seen.add(real)
        if (real / "library").is_dir() and any(real.glob("*.html")):
            return real
    return None


def default_roots() -> dict[str, Path | None]:
    """Where each source lives on this machine (None: not installed)."""
    man, locale = Path("/usr/share/man"), Path("/usr/share/locale")
    return {"python-doc": _python_doc_root(), "man": man if man.is_dir() else None,
            "gettext": locale if locale.is_dir() else None}


# ---------------------------------------------------------------------------------------------------------- cleaning
_WS = re.compile(r"\s+")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\ufeff]")
# A word that is code rather than prose: identifiers with underscores or dots inside, calls, operators, options,
# paths, markup and shell syntax.
_CODE_WORD = re.compile(r"[_{}\[\]<>=;$\\|`#]|\w\(|^\(?\)|^--?\w|\w/\w|^/|\w\.\w+\.|::|\w\.\w+\(|[*&]\w|\w[*&]")
_TABLE = re.compile(r"[\u2500-\u257f]")  # box drawing: a table rendered by tbl, not running text
_BOILERPLATE = re.compile(r"permalink|copyright ©|©|all rights reserved|created using sphinx|last updated on|"
                          r"found a bug\?|^table of contents$|^navigation$", re.I)


def normalise(text: str) -> str:
    """NFC, control and zero-width characters dropped, every whitespace run one space."""
    text = unicodedata.normalize("NFC", text).replace("\u00ad", "")  # soft hyphens
    text = _CONTROL.sub(" ", text)
    return _WS.sub(" ", text).strip()


def is_prose(line: str, *, min_words: int = 6, min_chars: int = 30) -> bool:
    """True for a normalised line of running text: long enough, mostly letters, few words that look like code."""
    if len(line) < min_chars or _BOILERPLATE.search(line) or _TABLE.search(line):
        return False
    words = line.split()
    if len(words) < min_words:
        return False
    chars = len(line) - line.count(" ")
    if sum(c.isalpha() for c in line) < 0.7 * chars:
        return False
    code = sum(1 for w in words if _CODE_WORD.search(w))
    return code <= 0.2 * len(words)


def clean_paragraphs(paragraphs: Iterable[str], **prose: int) -> list[str]:
    """Normalised paragraphs that are prose (see `is_prose`), in order, each once."""
    out, seen = [], set()
    for p in paragraphs:
        p = normalise(p)
        if p and p not in seen and is_prose(p, **prose):
            seen.add(p)
            out.append(p)
    return out


# -------------------------------------------------------------------------------------------------------------- HTML
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source", "track", "wbr"}
_SKIP_TAGS = {"script", "style", "pre", "nav", "head", "noscript", "svg", "math", "form", "button", "select",
              "textarea", "iframe", "object", "template", "kbd"}
_SKIP_CLASSES = {"sphinxsidebar", "sphinxsidebarwrapper", "related", "footer", "header", "headerlink", "mobile-nav",
                 "menu-wrapper", "inline-search", "version_switcher_placeholder", "language_switcher_placeholder",
                 "clearer", "toctree-wrapper", "sig", "breadcrumbs", "navigation", "highlight", "doctest",
                 "literal-block", "search", "sidebar", "toc", "contents"}
_BLOCK = {"p", "div", "section", "article", "aside", "li", "dt", "dd", "ul", "ol", "dl", "h1", "h2", "h3", "h4", "h5",
          "h6", "td", "th", "tr", "table", "caption", "figcaption", "blockquote", "br", "hr", "header", "footer",
          "body", "main", "title", "figure"}


class _TextParser(HTMLParser):
    """Paragraphs of an HTML page: text of block elements, inside the main element when the page marks one, with
    scripts, styles, code blocks, navigation and Sphinx's signatures and permalinks skipped."""

    def __init__(self, main_only: bool) -> None:
        super().__init__(convert_charrefs=True)
        self.paragraphs: list[str] = []
        self._buf: list[str] = []
        self._skip: tuple[str, int] | None = None  # (tag, nesting depth) of the element being skipped
        self._main: tuple[str, int] | None = None if main_only else ("", -1)  # depth -1: everywhere is main

    def _flush(self) -> None:
        if self._buf:
            self.paragraphs.append("".join(self._buf))
            self._buf = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if self._skip is not None:
            if tag == self._skip[0]:
                self._skip = (tag, self._skip[1] + 1)
            return
        if self._main is None:
            if a.get("role") == "main" and tag not in _VOID:
                self._main = (tag, 1)
            return
        if tag == self._main[0]:
            self._main = (tag, self._main[1] + 1)
        if tag in _BLOCK:
            self._flush()
        classes = set((a.get("class") or "").split())
        skip = tag in _SKIP_TAGS or a.get("role") in ("navigation", "search") or bool(classes & _SKIP_CLASSES) \
            or any(c.startswith("highlight") for c in classes)
        if skip and tag not in _VOID:
            self._skip = (tag, 1)

    def handle_endtag(self, tag: str) -> None:
        if self._skip is not None:
            if tag == self._skip[0]:
                depth = self._skip[1] - 1
                self._skip = (tag, depth) if depth else None
            return
        if self._main is None:
            return
        if tag in _BLOCK:
            self._flush()
        if tag == self._main[0] and self._main[1] > 0:
            depth = self._main[1] - 1
            if depth == 0:
                self._flush()
                self._main = None  # the main element ended; anything later (footers) is skipped
            else:
                self._main = (tag, depth)

    def handle_data(self, data: str) -> None:
        if self._skip is None and self._main is not None:
            self._buf.append(data)

    def close(self) -> None:
        super().close()
        self._flush()


def html_to_text(html: str) -> list[str]:
    """Cleaned prose paragraphs of one HTML page (stdlib html.parser; no markup, scripts, navigation or code)."""
    parser = _TextParser(main_only='role="main"' in html)
    parser.feed(html)
    parser.close()
    return clean_paragraphs(parser.paragraphs)


# Sphinx pages that are indexes, tables of contents or search forms rather than text.
_HTML_SKIP = re.compile(r"^(genindex.*|py-modindex|search|contents|modindex|objects)\.html$")


def _python_doc_docs(root: Path) -> Iterator[Doc]:
    for path in sorted(root.rglob("*.html")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("_") or "/_" in rel or _HTML_SKIP.match(path.name):
            continue
        paras = html_to_text(path.read_text(encoding="utf-8", errors="replace"))
        if paras:
            yield Doc(f"python-doc/{rel}", "python-doc", "\n".join(paras))


# -------------------------------------------------------------------------------------------------------------- roff
_ROFF_ESCAPES = [
    (re.compile(r'\\".*$'), ""),  # comment to end of line
    (re.compile(r"\\f(\[[^\]]*\]|\(..|.)"), ""),  # font changes
    (re.compile(r"\\s[-+]?(\[[^\]]*\]|\(..|\d+|'[^']*')"), ""),  # size changes
    (re.compile(r"\\\*(\[[^\]]*\]|\(..|.)"), ""),  # string interpolation
    (re.compile(r"\\[nkgm](\[[^\]]*\]|\(..|.)"), ""),  # registers, colours
    (re.compile(r"\\[hvwlLoDXbrxHSRNZ]'[^']*'"), ""),  # motions and drawing
    (re.compile(r"\\\((em|en)"), "\u2014"),
    (re.compile(r"\\\((lq|rq|dq)"), '"'),
    (re.compile(r"\\\((oq|cq|aq)"), "'"),
    (re.compile(r"\\\((bu|ci)"), ""),
    (re.compile(r"\\\((co)"), "\u00a9"),
    (re.compile(r"\\\((hy|mi)"), "-"),
    (re.compile(r"\\\(\S\S"), ""),  # any other special character
    (re.compile(r"\\\[[^\]]*\]"), ""),
    (re.compile(r"\\[-]"), "-"),
    (re.compile(r"\\[e\\]"), "\\\\"),
    (re.compile(r"\\[ ~0|^&%:c)/,dupat!{}]"), lambda m: " " if m.group(0) in ("\\ ", "\\~", "\\0") else ""),
    (re.compile(r"\\(.)"), r"\1"),  # anything left: the character itself
]
# Macros whose arguments are running text (font macros join alternate arguments without spaces).
_ALTERNATING = {"BR", "RB", "IR", "RI", "BI", "IB"}
_TEXT_MACROS = {"B", "I", "SM", "SB", "Nm", "Ar", "Em", "Sy", "Dq", "Ql", *_ALTERNATING}
_BREAK_MACROS = {"SH", "SS", "PP", "P", "LP", "TP", "TQ", "IP", "HP", "sp", "br", "bp", "RS", "RE", "Sh", "Ss", "Pp",
                 "It", "Bl", "El", "in", "ti", "ne"}
_NOFILL = {"nf": "fi", "EX": "EE", "TS": "TE", "EQ": "EN", "PS": "PE", "Bd": "Ed", "de": "..", "ig": ".."}
_ARGS = re.compile(r'"((?:[^"]|"")*)"|(\S+)')


def _roff_regex(src: str) -> list[str]:
    """The fallback when groff is absent: macros dropped (their text arguments kept), escapes resolved, no-fill
    blocks (code examples, tables, macro definitions) dropped, paragraphs split at the macros that break lines."""
    paras: list[list[str]] = [[]]
    end: str | None = None
    heading_next = False
    for line in src.splitlines():
        if end is not None:
            if line.lstrip(".'").split()[:1] == [end] or (end == ".." and line.strip() == ".."):
                end = None
            continue
        if line.startswith((".", "'")):
            parts = line[1:].strip().split(None, 1)
            if not parts or parts[0].startswith('\\"'):
                continue
            name, rest = parts[0], parts[1] if len(parts) > 1 else ""
            if name in _NOFILL:
                end = _NOFILL[name]
                paras.append([])
                continue
            if name in _BREAK_MACROS or name == "TH":
                paras.append([])
                # The line after .SH/.TP is a heading or a term, not part of the next paragraph.
                heading_next = name in ("TP", "TQ", "SH", "SS") and not rest
                if rest and name in ("SH", "SS", "IP", "Sh", "Ss"):
                    paras[-1].append(rest.replace('"', ""))
                    paras.append([])
                continue
            if name in _TEXT_MACROS:
                args = [a or b for a, b in _ARGS.findall(rest)]
                args = [a.replace('""', '"') for a in args]
                text = "".join(args) if name in _ALTERNATING else " ".join(args)
                paras[-1].append(text)
            continue  # any other request or macro: no text
        if not line.strip():
            paras.append([])
            continue
        paras[-1].append(line)
        if heading_next:
            paras.append([])
            heading_next = False
    return [" ".join(_roff_escapes(line) for line in p) for p in paras]


def _roff_escapes(line: str) -> str:
    for pat, rep in _ROFF_ESCAPES:
        line = pat.sub(rep, line)
    return line


def _groff_paragraphs(src: str, groff: str) -> list[str] | None:
    """groff's rendering with hyphenation off and one very long line per filled paragraph; None when it fails."""
    # -t runs tbl; -rLL makes every filled paragraph one output line; -P-cbou: plain text, no overstriking.
    cmd = [groff, "-t", "-mandoc", "-Tutf8", "-rLL=4000n", "-rHY=0", "-rcR=1", "-P-cbou"]
    try:
        r = subprocess.run(cmd, input=src.encode("utf-8", "replace"), capture_output=True, timeout=_GROFF_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0 or not r.stdout.strip():
        return None
    lines = [ln for ln in r.stdout.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[1:-1]  # the page header (NAME(1) ... NAME(1)) and footer (source, date)


def roff_to_text(src: str, *, groff: str | None = "auto") -> list[str]:
    """Cleaned prose paragraphs of one man page: rendered by groff when present (`groff="auto"`), else (or with
    `groff=None`) by the regex fallback."""
    exe = shutil.which("groff") if groff == "auto" else groff
    paras = _groff_paragraphs(src, exe) if exe else None
    if paras is None:
        paras = _roff_regex(src)
    return clean_paragraphs(paras)


def _read_man(path: Path) -> str | None:
    """A man page's source, or None for a `.so` redirect (the page it names is read on its own)."""
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    text = raw.decode("utf-8", errors="replace")
    head = text.lstrip()[:200]
    if head.startswith(".so ") and len(text.strip().splitlines()) <= 2:
        return None
    return text


_MAN_FILE = re.compile(r"^[^.].*\.\d\w*(\.gz)?$")
_FAMILY = re.compile(r"^[^-_.]+")


def _man_files(root: Path) -> list[Path]:
    """English pages under root/man<N>/ (translations live in root/<lang>/ and are not read), symlinks skipped,
    at most _MAN_FAMILY_CAP per command family chosen by hash."""
    files = [p for d in sorted(root.glob("man[1-9]*")) if d.is_dir() for p in sorted(d.iterdir())
             if _MAN_FILE.match(p.name) and p.is_file() and not p.is_symlink()]
    families: dict[str, list[Path]] = {}
    for p in files:
        fam = _FAMILY.match(p.name)
        families.setdefault(fam.group(0) if fam else p.name, []).append(p)
    keep = set()
    for members in families.values():
        members = sorted(members, key=lambda p: _hash(f"man-family\t{p.relative_to(root).as_posix()}"))
        keep.update(members[:_MAN_FAMILY_CAP])
    return [p for p in files if p in keep]


def _man_docs(root: Path, groff: str | None = "auto") -> Iterator[Doc]:
    files = _man_files(root)

    def one(path: Path) -> Doc | None:
        try:
            src = _read_man(path)
        except (OSError, EOFError, gzip.BadGzipFile):
            return None
        if src is None:
            return None
        paras = roff_to_text(src, groff=groff)
        return Doc(f"man/{path.relative_to(root).as_posix()}", "man", "\n".join(paras)) if paras else None

    # groff runs in subprocesses, so threads overlap them; map keeps the sorted order.
    with ThreadPoolExecutor(max_workers=max(1, min(4, os.cpu_count() or 1))) as pool:
        for doc in pool.map(one, files):
            if doc is not None:
                yield doc


# ----------------------------------------------------------------------------------------------------------- gettext
def _gettext_docs(root: Path, langs: Sequence[str] = GETTEXT_LANGS) -> Iterator[Doc]:
    """One document per catalog domain: a section of its English messages, then one per language of their
    translations, each message cleaned and filtered as the translation recipes do (no format strings, markup,
    options or paths; untranslated messages dropped)."""
    from recipes.text.catalogs import LOCALE_OF, DataConfig, clean_text, keep_pair, read_mo

    cfg = DataConfig(min_chars=12, max_chars=400, max_words=80)
    by_domain: dict[str, dict[str, list[tuple[str, str]]]] = {}
    for lang in langs:
        for name in LOCALE_OF.get(lang, (lang,)):
            files = sorted((root / name / "LC_MESSAGES").glob("*.mo"))
            if files:
                break
        for f in files:
            try:
                pairs = read_mo(f)
            except (OSError, ValueError):
                continue
            by_domain.setdefault(f.stem, {})[lang] = pairs
    for domain in sorted(by_domain):
        english: dict[str, None] = {}
        sections = []
        for lang in langs:
            kept = [(clean_text(s), clean_text(t)) for s, t in by_domain[domain].get(lang, ()) if keep_pair(s, t, cfg)]
            english.update((s, None) for s, _ in kept)
            sections.append(clean_paragraphs((t for _, t in kept), min_words=2, min_chars=12))
        sections.insert(0, clean_paragraphs(english, min_words=2, min_chars=12))
        text = "\n\n".join("\n".join(s) for s in sections if s)
        if text:
            yield Doc(f"gettext/{domain}", "gettext", text)


# --------------------------------------------------------------------------------------------------------- documents
def _resolve_roots(sources: Sequence[str], roots: Mapping[str, str | Path] | None) -> dict[str, Path | None]:
    unknown = [s for s in sources if s not in SOURCES]
    if unknown:
        raise ValueError(f"unknown corpus source(s) {unknown}; choose from {list(SOURCES)}")
    given = dict(roots or {})
    bad = [s for s in given if s not in SOURCES]
    if bad:
        raise ValueError(f"roots name unknown source(s) {bad}; use keys from {list(SOURCES)}")
    found = default_roots() if any(s not in given for s in sources) else {}
    out: dict[str, Path | None] = {}
    for s in sources:
        if s in given:
            p = Path(given[s])
            if not p.is_dir():
                raise CorpusError(f"corpus source {s!r}: root {p} does not exist or is not a directory; pass an "
                                  f"existing directory in roots[{s!r}] or omit it to use this machine's "
                                  f"{' '.join(PACKAGES[s]) or 'installed catalogs'}")
            out[s] = p
        else:
            out[s] = found.get(s)
    return out


def documents(sources: Sequence[str] = SOURCES, *, roots: Mapping[str, str | Path] | None = None) -> Iterator[Doc]:
    """Cleaned documents of each source, sources in the given order, documents sorted by id. `roots` points a
    source at another directory (python-doc: an HTML tree; man: a directory of man<N>/ folders; gettext: a locale
    tree); a source without a root on this machine is skipped with one line on stderr."""
    for source, root in _resolve_roots(sources, roots).items():
        if root is None:
            print(f"recipes.text.corpus: no {source} text on this machine; install "
                  f"{' '.join(PACKAGES[source]) or 'packages with translations'} (and drop any rule excluding "
                  f"/usr/share from /etc/dpkg/dpkg.cfg.d/) or pass roots[{source!r}]", file=sys.stderr)
            continue
        if source == "python-doc":
            yield from _python_doc_docs(root)
        elif source == "man":
            yield from _man_docs(root)
        else:
            yield from _gettext_docs(root)


# ----------------------------------------------------------------------------------------------------------- packing
def pack_lines(text: str, line_chars: int = 320, min_chars: int | None = None) -> list[str]:
    """A document's text as lines of at most `line_chars` characters cut at word boundaries, balanced so that a
    section's lines have about the same length; never across a section break (blank line). Lines shorter than
    `min_chars` (default line_chars // 4) are dropped; a word longer than a line is cut."""
    min_chars = line_chars // 4 if min_chars is None else min_chars
    out = []
    for section in text.split("\n\n"):
        words = []
        for w in section.split():
            words.extend(w[i:i + line_chars] for i in range(0, len(w), line_chars))
        if not words:
            continue
        total = sum(len(w) for w in words) + len(words) - 1
        target = math.ceil(total / math.ceil(total / line_chars))
        cur: list[str] = []
        size = 0
        for w in words:
            extra = len(w) + (1 if cur else 0)
            if cur and (size + extra > line_chars or size >= target):
                out.append(" ".join(cur))
                cur, size = [], 0
                extra = len(w)
            cur.append(w)
            size += extra
        if cur:
            out.append(" ".join(cur))
    return [ln for ln in out if len(ln) >= min_chars]


def _hash(key: str) -> int:
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big")


def _dedup_paragraphs(docs: Iterable[Doc], seen: set[bytes]) -> Iterator[Doc]:
    """Each paragraph once in the whole corpus (first document in id order keeps it): boilerplate repeated across
    pages goes, and no paragraph can sit in both train and held-out."""
    for doc in docs:
        sections = []
        for sec in doc.text.split("\n\n"):
            keep = []
            for p in sec.split("\n"):
                key = hashlib.blake2b(p.casefold().encode("utf-8"), digest_size=12).digest()
                if key not in seen:
                    seen.add(key)
                    keep.append(p)
            if keep:
                sections.append("\n".join(keep))
        if sections:
            yield Doc(doc.id, doc.source, "\n\n".join(sections))


# ------------------------------------------------------------------------------------------------------------- build
def _params(sources: Sequence[str], line_chars: int, heldout_fraction: float, min_heldout_lines: int,
            max_chars: int, seed: int, roots: Mapping[str, Path | None]) -> dict:
    return {"version": _VERSION, "sources": list(sources), "line_chars": line_chars,
            "heldout_fraction": heldout_fraction, "min_heldout_lines": min_heldout_lines, "max_chars": max_chars,
            "seed": seed, "roots": {s: (str(p) if p else None) for s, p in roots.items()}}


def _reuse(out: Path, params: dict) -> CorpusInfo | None:
    """The CorpusInfo of a complete earlier build in `out` with the same parameters, else None."""
    meta = out / "corpus.json"
    try:
        saved = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if saved.get("params") != params:
        return None
    info = saved.get("info", {})
    train, heldout = out / "train.txt", out / "heldout.txt"
    sizes = saved.get("bytes", {})
    if not (train.is_file() and heldout.is_file()) or sizes != {"train": train.stat().st_size,
                                                                 "heldout": heldout.stat().st_size}:
        return None
    return CorpusInfo(train, heldout, info["train_lines"], info["heldout_lines"], info["train_chars"],
                      dict(info["sources"]), info.get("heldout_chars", 0))


def _write_lines(path: Path, lines: Sequence[str]) -> None:
    atomic_write(path, "".join(ln + "\n" for ln in lines).encode("utf-8"), PUBLIC)


def build_corpus(out: str | Path, *, sources: Sequence[str] = SOURCES, line_chars: int = 320,
                 heldout_fraction: float = 0.02, min_heldout_lines: int = 500, max_chars: int = 6_000_000,
                 seed: int = 0, install: bool = True, roots: Mapping[str, str | Path] | None = None) -> CorpusInfo:
    """Write out/train.txt and out/heldout.txt (one packed line per row) and out/corpus.json; reuse them when an
    earlier complete build used the same parameters.

    Held-out: the documents with the smallest salted hash of their id (independent of `seed`), whole documents, as
    many as give `heldout_fraction` of the text used and at least `min_heldout_lines` lines (a large last document
    can take it past that). Train: the other documents in an order drawn with `seed`, line by line until
    `max_chars` characters. Both files are shuffled (train with `seed`, held-out with a fixed salt) so that any
    prefix is a sample of the whole."""
    if line_chars < 32:
        raise ValueError(f"line_chars={line_chars}: use at least 32 (a line is about one training sequence)")
    if not 0.0 < heldout_fraction < 0.5:
        raise ValueError(f"heldout_fraction={heldout_fraction}: use a fraction in (0, 0.5), e.g. 0.02")
    if min_heldout_lines < 0 or max_chars < line_chars:
        raise ValueError(f"min_heldout_lines={min_heldout_lines}, max_chars={max_chars}: need min_heldout_lines >= 0 "
                         f"and max_chars >= line_chars ({line_chars})")
    out = Path(out)
    sources = tuple(dict.fromkeys(sources))
    if install:
        need = [pkg for s in sources if not (roots and s in roots) for pkg in PACKAGES.get(s, ())]
        if need:
            ensure_packages(need, install=True)
    resolved = _resolve_roots(sources, roots)
    params = _params(sources, line_chars, heldout_fraction, min_heldout_lines, max_chars, seed, resolved)
    reused = _reuse(out, params)
    if reused is not None:
        return reused

    seen: set[bytes] = set()
    docs: list[tuple[Doc, list[str]]] = []  # (document, its packed lines)
    found = {s: p for s, p in resolved.items() if p is not None}
    for doc in _dedup_paragraphs(documents(sources, roots=found), seen):
        lines = pack_lines(doc.text, line_chars)
        if lines:
            docs.append((doc, lines))
    if not docs:
        raise CorpusError(f"no text found in sources {list(sources)} (roots {params['roots']}); install "
                          f"{' '.join(p for s in sources for p in PACKAGES.get(s, ()))} or pass roots")

    total = sum(len(ln) for _, lines in docs for ln in lines)
    train_budget = min(max_chars, total * (1 - heldout_fraction))
    heldout_target = train_budget * heldout_fraction / (1 - heldout_fraction)
    by_hash = sorted(docs, key=lambda d: (_hash(f"{_HELDOUT_SALT}\t{d[0].id}"), d[0].id))
    heldout: list[str] = []
    heldout_docs: set[str] = set()
    h_chars = 0
    k = 0
    while k < len(by_hash) - 1 and (h_chars < heldout_target or len(heldout) < min_heldout_lines):
        doc, lines = by_hash[k]
        heldout.extend(lines)
        heldout_docs.add(doc.id)
        h_chars += sum(len(ln) for ln in lines)
        k += 1
    rest = sorted(by_hash[k:], key=lambda d: (_hash(f"{seed}\t{d[0].id}"), d[0].id))
    train: list[str] = []
    used: dict[str, set[str]] = {s: set() for s in sources}
    for doc, _ in by_hash[:k]:
        used[doc.source].add(doc.id)
    t_chars = 0
    by_source = {s: 0 for s in sources}  # training characters per source: the mix the model sees
    for doc, lines in rest:
        if t_chars >= max_chars:
            break
        for ln in lines:
            if t_chars + len(ln) > max_chars:
                t_chars = max_chars
                break
            train.append(ln)
            t_chars += len(ln)
            by_source[doc.source] += len(ln)
        used[doc.source].add(doc.id)
    # Exact duplicate lines (rare after paragraph deduplication): once per file, never in both.
    heldout = list(dict.fromkeys(heldout))
    held = set(heldout)
    train = [ln for ln in dict.fromkeys(train) if ln not in held]
    random.Random(seed).shuffle(train)
    random.Random(_HELDOUT_SALT).shuffle(heldout)

    out.mkdir(parents=True, exist_ok=True)
    (out / "corpus.json").unlink(missing_ok=True)  # the marker of a complete build goes last
    _write_lines(out / "train.txt", train)
    _write_lines(out / "heldout.txt", heldout)
    info = CorpusInfo(out / "train.txt", out / "heldout.txt", len(train), len(heldout), sum(map(len, train)),
                      {s: len(v) for s, v in used.items()}, sum(map(len, heldout)))
    meta = {"params": params, "info": info.to_json(), "heldout_documents": sorted(heldout_docs),
            "train_chars_by_source": by_source, "available_chars": total,
            "bytes": {"train": info.train.stat().st_size, "heldout": info.heldout.stat().st_size}}
    atomic_write(out / "corpus.json", (json.dumps(meta, indent=1, sort_keys=True) + "\n").encode("utf-8"), PUBLIC)
    return info


# --------------------------------------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    """`python -m recipes.text.corpus OUT [--max-chars N] [--no-install]`."""
    ap = argparse.ArgumentParser(prog="python -m recipes.text.corpus", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--max-chars", type=int, default=6_000_000, help="characters of training text at most")
    ap.add_argument("--line-chars", type=int, default=320, help="characters per packed line at most")
    ap.add_argument("--heldout-fraction", type=float, default=0.02)
    ap.add_argument("--min-heldout-lines", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sources", default=",".join(SOURCES), help=f"comma-separated, from {','.join(SOURCES)}")
    ap.add_argument("--root", action="append", default=[], metavar="SOURCE=DIR",
                    help="read SOURCE from DIR instead of this machine's packages (repeatable)")
    ap.add_argument("--no-install", action="store_true", help="do not apt-get install missing packages")
    args = ap.parse_args(argv)
    roots = {}
    for item in args.root:
        source, sep, path = item.partition("=")
        if not sep or not path:
            ap.error(f"--root {item!r}: write SOURCE=DIR, e.g. --root man=/usr/share/man")
        roots[source] = Path(path)
    t0 = time.monotonic()
    try:
        info = build_corpus(args.out, sources=[s for s in args.sources.split(",") if s], line_chars=args.line_chars,
                            heldout_fraction=args.heldout_fraction, min_heldout_lines=args.min_heldout_lines,
                            max_chars=args.max_chars, seed=args.seed, install=not args.no_install,
                            roots=roots or None)
    except (CorpusError, ValueError) as exc:
        print(f"recipes.text.corpus: {exc}", file=sys.stderr)
        return 2
    docs = ", ".join(f"{s} {n}" for s, n in info.sources.items())
    print(f"wrote {info.train}: {info.train_lines} lines, {info.train_chars} chars; {info.heldout}: "
          f"{info.heldout_lines} lines, {info.heldout_chars} chars; documents: {docs} ({time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
