"""The language-model corpus: HTML and roff cleaned to prose, paragraphs deduplicated, lines packed to a length,
train and held-out split by document, byte-identical rebuilds, reuse of a complete build, bad roots refused.
Every input is written by the test (a few HTML pages, man pages, a gettext catalog); nothing is installed."""
from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from recipes.text.corpus import (CorpusError, build_corpus, documents, ensure_packages, html_to_text, is_prose,
                                 pack_lines, roff_to_text)
from tests.recipes.conftest import write_mo

WORDS = ("the system reads every file from the given directory and writes a short report about its contents while "
         "each user keeps a separate copy of the settings so that later changes never affect another session").split()


def prose(rng: random.Random, marker: str, sentences: int) -> list[str]:
    """Sentences of common words, each carrying the document's marker word (to trace a document's text)."""
    out = []
    for _ in range(sentences):
        words = [rng.choice(WORDS) for _ in range(rng.randint(10, 18))]
        words.insert(rng.randint(1, len(words) - 1), marker)
        out.append(" ".join(words).capitalize() + ".")
    return out


def html_page(rng: random.Random, marker: str) -> str:
    paras = "".join(f"<p>{' '.join(prose(rng, marker, 3))}</p>\n" for _ in range(3))
    return f"""<!DOCTYPE html><html><head><title>Page {marker}</title>
<script>var secretScript = "scriptword scriptword scriptword scriptword scriptword scriptword";</script>
<style>.body {{ color: red; }}</style></head>
<body><div class="sphinxsidebar"><p>Sidebar navword navword navword navword navword navword navword.</p></div>
<div class="body" role="main"><section><h1>Title {marker}<a class="headerlink" href="#x">¶</a></h1>
{paras}<p>Every page of this reference repeats this boilerplate repeatword sentence at the very same place.</p>
<div class="highlight-python3"><pre>def codeword(x): return codeword(x) + codeword(x) * 2 if x else None</pre></div>
<dl><dt class="sig sig-object py">sigword(a, b, c, d, e, f, g, h, i, j, k)</dt><dd><p>{prose(rng, marker, 1)[0]}
<code>os.stat(path)</code> &amp; more text.</p></dd></dl></section></div>
<div class="footer">Footword footword footword footword footword footword created using Sphinx.</div></body></html>
"""


def man_page(rng: random.Random, marker: str, name: str) -> str:
    body = "\n.PP\n".join(" ".join(prose(rng, marker, 3)).replace(". ", ".\n") for _ in range(3))
    return f""".\\" a comment with commentword commentword commentword commentword
.TH {name.upper()} 1 "January 2024" "tools 1.0" "User Commands"
.SH NAME
{name} \\- do things for {marker}
.SH SYNOPSIS
.B {name}
[\\fIOPTION\\fR]... \\fIFILE\\fR
.SH DESCRIPTION
{body}
.TP
.BR \\-a ", " \\-\\-all
.IR {marker} " and the system reads every file from the given directory " often .
.PP
.nf
codeword = nofillword(x); nofillword(y); nofillword(z); nofillword(w);
.fi
.SH "SEE ALSO"
.BR ls (1)
"""


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    """30 HTML pages (plus an index page to skip), 20 man pages (gzip, plain, a .so redirect, a symlink) and a
    German catalog."""
    base = tmp_path_factory.mktemp("sources")
    rng = random.Random(7)
    html = base / "html"
    (html / "library").mkdir(parents=True)
    for k in range(30):
        (html / "library" / f"page{k:02d}.html").write_text(html_page(rng, f"htmlmark{k:02d}"), encoding="utf-8")
    (html / "genindex.html").write_text(html_page(rng, "indexword"), encoding="utf-8")
    man = base / "man"
    (man / "man1").mkdir(parents=True)
    (man / "man7").mkdir()
    for k in range(20):
        src = man_page(rng, f"manmark{k:02d}", f"tool{k:02d}")
        if k % 2:
            (man / "man1" / f"tool{k:02d}.1.gz").write_bytes(gzip.compress(src.encode(), mtime=0))
        else:
            (man / "man7" / f"tool{k:02d}.7").write_text(src, encoding="utf-8")
    (man / "man1" / "alias.1").write_text(".so man7/tool00.7\n")
    (man / "man1" / "link.1.gz").symlink_to("tool01.1.gz")
    (man / "de" / "man1").mkdir(parents=True)  # translations are not read
    (man / "de" / "man1" / "tool99.1").write_text(man_page(rng, "germanmark", "tool99"))
    msgs = [(s, "Übersetzt: " + s) for s in prose(rng, "gettextmark", 40)]
    write_mo(base / "locale" / "de" / "LC_MESSAGES" / "app.mo", msgs + [("Short", "Kurz"), ("%s failed", "%s x")])
    return {"python-doc": html, "man": man, "gettext": base / "locale"}


def build(out: Path, roots: dict[str, Path], **kw):
    kw = {"line_chars": 120, "heldout_fraction": 0.1, "min_heldout_lines": 10, "install": False, **kw}
    return build_corpus(out, roots=roots, **kw)


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("main", [True, False])
def test_html_keeps_prose_and_drops_markup_scripts_navigation_and_code(main):
    page = html_page(random.Random(0), "mark")
    if not main:  # a page that marks no main element: navigation is recognised by its class
        page = page.replace(' role="main"', "")
    text = "\n".join(html_to_text(page))
    assert "mark" in text and "os.stat(path) & more text." in text
    for gone in ("<", "scriptword", "color: red", "navword", "codeword", "sigword", "¶", "footword", "Sphinx"):
        assert gone not in text, gone


def test_prose_filter_drops_short_code_and_table_lines():
    assert is_prose("The module provides a portable way of using operating system dependent functionality.")
    for line in ("See also.", "Return value", "x = os.stat(path); y = x.st_mode & 0o777; print(y, file=sys.stderr)",
                 "--block-size=SIZE -l --all -a --almost-all -A --author -b --escape",
                 "│ 67 │ EX_NOUSER │ Addressee unknown │ 68 │ EX_NOHOST │ Host name unknown │",
                 "Copyright © 2001-2023 Python Software Foundation. All rights reserved."):
        assert not is_prose(line), line


@pytest.mark.parametrize("groff", ["auto", None])
def test_roff_keeps_prose_and_drops_macros(groff):
    # "auto" renders with groff where it is installed and falls back to the regex otherwise: either must hold
    paras = roff_to_text(man_page(random.Random(0), "mark", "tool"), groff=groff)
    text = "\n".join(paras)
    assert len(paras) >= 3 and "mark" in text
    assert "mark and the system reads every file from the given directory often." in text  # .IR arguments joined
    for gone in ("\\f", "\\-", ".TH", ".SH", ".PP", "commentword", "nofillword", "TOOL(1)", "January 2024"):
        assert gone not in text, gone
    assert not any(p.startswith((".", "'")) for p in paras)


def test_pack_lines_cuts_at_words_within_the_limit_and_never_across_sections():
    words = [f"w{i}" * (1 + i % 5) for i in range(400)]
    text = " ".join(words[:300]) + "\n" + " ".join(words[300:350]) + "\n\n" + " ".join(words[350:])
    out = pack_lines(text, line_chars=60, min_chars=0)
    assert all(len(ln) <= 60 for ln in out)
    assert " ".join(out).split() == words  # nothing lost, nothing split inside a word, order kept
    assert any(ln.endswith(words[349]) for ln in out)  # the section break ends a line
    assert pack_lines("a" * 150, line_chars=60, min_chars=0) == ["a" * 60, "a" * 60, "a" * 30]


def test_documents_read_each_source_and_skip_indexes_redirects_links_and_translations(roots):
    docs = list(documents(roots=roots))
    ids = [d.id for d in docs]
    assert sum(d.source == "python-doc" for d in docs) == 30 and "python-doc/genindex.html" not in ids
    assert sorted(i for i in ids if i.startswith("man/")) == sorted(
        f"man/man{1 if k % 2 else 7}/tool{k:02d}.{'1.gz' if k % 2 else '7'}" for k in range(20))
    (gettext,) = [d for d in docs if d.source == "gettext"]
    assert "gettextmark" in gettext.text and "Übersetzt" in gettext.text and "%s" not in gettext.text
    assert "\n\n" in gettext.text  # English and German are separate sections


def test_build_splits_by_document_and_packs_lines(tmp_path, roots):
    info = build(tmp_path / "c", roots)
    train, held = lines(info.train), lines(info.heldout)
    assert (info.train_lines, info.heldout_lines) == (len(train), len(held))
    assert info.train_chars == sum(map(len, train)) and len(held) >= 10
    assert all(0 < len(ln) <= 120 for ln in train + held)
    assert len(set(train)) == len(train) and not set(train) & set(held)
    meta = json.loads((tmp_path / "c" / "corpus.json").read_text())
    assert meta["heldout_documents"] and info.sources["python-doc"] > 0 and info.sources["man"] > 0

    def markers(rows):
        return {w.strip(".,") for ln in rows for w in ln.split() if w.startswith(("htmlmark", "manmark"))}

    # A held-out document's marker never appears in train: held-out documents are unseen.
    held_marks = {d.split("/")[-1].split(".")[0].replace("page", "htmlmark").replace("tool", "manmark")
                  for d in meta["heldout_documents"] if not d.startswith("gettext")}
    assert held_marks and held_marks <= markers(held) and not held_marks & markers(train)
    everything = "\n".join(train + held)
    for gone in ("scriptword", "navword", "codeword", "indexword", "commentword", "nofillword", "germanmark", "\\f"):
        assert gone not in everything, gone
    assert everything.count("repeatword") == 1  # a paragraph repeated on every page is kept once


def test_build_is_deterministic_capped_and_reused(tmp_path, roots):
    a, b = build(tmp_path / "a", roots), build(tmp_path / "b", roots)
    for name in ("train.txt", "heldout.txt"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert (a.train_lines, a.sources) == (b.train_lines, b.sources)

    ino = a.train.stat().st_ino
    again = build(tmp_path / "a", roots)
    assert again == a and a.train.stat().st_ino == ino  # reused: not rewritten
    capped = build(tmp_path / "a", roots, max_chars=2000)  # other parameters: rebuilt
    assert a.train.stat().st_ino != ino and 1500 < capped.train_chars <= 2000
    # Held-out documents are those of smallest hash: a smaller build holds out a subset of a larger one's.
    held_docs = lambda d: set(json.loads((tmp_path / d / "corpus.json").read_text())["heldout_documents"])  # noqa
    assert held_docs("a") < held_docs("b")
    other_seed = build(tmp_path / "s", roots, seed=1)
    assert lines(other_seed.heldout) == lines(b.heldout) and lines(other_seed.train) != lines(b.train)

    (tmp_path / "b" / "train.txt").write_text("truncated\n")  # a damaged build is not reused: rebuilt
    assert build(tmp_path / "b", roots) == b and lines(b.train)[0] != "truncated"


def test_min_heldout_lines_is_honoured(tmp_path, roots):
    info = build(tmp_path / "c", roots, heldout_fraction=0.01, min_heldout_lines=40)
    assert info.heldout_lines >= 40 and info.train_lines > 0


def test_missing_root_is_a_one_line_error_naming_it_and_the_fix(tmp_path, roots):
    missing = tmp_path / "no-such-dir"
    with pytest.raises(CorpusError) as err:
        build(tmp_path / "c", {**roots, "man": missing})
    msg = str(err.value)
    assert "\n" not in msg and str(missing) in msg and "roots['man']" in msg and "manpages" in msg
    with pytest.raises(ValueError, match="unknown corpus source"):
        build(tmp_path / "c", roots, sources=("wikipedia",))


def test_ensure_packages_reports_what_is_missing_without_failing(capsys):
    assert ensure_packages(("nebula-no-such-package",), install=False) == []
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "nebula-no-such-package" in err and "apt-get install" in err


def test_cli_writes_the_corpus_and_refuses_a_missing_root_in_one_line(tmp_path, roots):
    cmd = [sys.executable, "-m", "recipes.text.corpus", str(tmp_path / "c"), "--no-install", "--line-chars", "120",
           "--min-heldout-lines", "10", *(f"--root={s}={p}" for s, p in roots.items())]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    info = json.loads((tmp_path / "c" / "corpus.json").read_text())["info"]
    assert f"{info['train_lines']} lines" in r.stdout and "man 20" in r.stdout.replace(",", "")
    r = subprocess.run(cmd[:-3] + [f"--root=man={tmp_path / 'nope'}"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "nope" in r.stderr
