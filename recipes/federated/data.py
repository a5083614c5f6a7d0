"""Language identification of gettext messages: which language is this translated UI string in?

Every `/usr/share/locale/<lang>/LC_MESSAGES/*.mo` catalog holds the translations of one program's messages;
the translated side (msgstr) of each is an example labelled with its language (`recipes.text.catalogs.load_corpus`:
cleaned, kept when 12..160 characters long, deduplicated, and dropped when the same text occurs in two languages,
untranslated strings). A hash of the text puts each string in train or test (test_per_mille), so
every run and every client sees the same split. Features: a bag of hashed character 1..3-grams.

Non-IID clients: the training examples of each language are split over the clients with proportions drawn from
a Dirichlet(alpha) distribution per language (Hsu et al., 2019); small alpha (default 0.1) gives each client
mostly one or two languages.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from nebula import smoke
from recipes.text.catalogs import load_corpus

__all__ = ["LANGS", "load_corpus", "featurize", "dirichlet_split", "prepare", "load_prepared", "NUM_BUCKETS"]

LANGS = ("de", "es", "fr", "it", "nl", "sv")
NUM_BUCKETS = 4096


def _in_test(text: str, test_per_mille: int) -> bool:
    return int(hashlib.sha1(text.encode()).hexdigest()[:8], 16) % 1000 < test_per_mille


def featurize(texts: list[str], num_buckets: int = NUM_BUCKETS) -> tuple[np.ndarray, np.ndarray]:
    """CSR (indices, indptr) of hashed character 1..3-grams of each lower-cased text (with boundary marks)."""
    indices, indptr = [], [0]
    for t in texts:
        s = f"^{t.lower()}$"
        grams = {s[i : i + n] for n in (1, 2, 3) for i in range(len(s) - n + 1)}
        idx = sorted({int.from_bytes(hashlib.blake2b(g.encode(), digest_size=4).digest(), "little") % num_buckets
                      for g in grams})
        indices.extend(idx)
        indptr.append(len(indices))
    return np.asarray(indices, np.int32), np.asarray(indptr, np.int64)


def densify(indices: np.ndarray, indptr: np.ndarray, rows: np.ndarray, num_buckets: int = NUM_BUCKETS) -> np.ndarray:
    """Dense float32 features of `rows` (1 where an n-gram bucket occurs)."""
    out = np.zeros((len(rows), num_buckets), np.float32)
    for i, r in enumerate(rows):
        out[i, indices[indptr[r] : indptr[r + 1]]] = 1.0
    return out


def dirichlet_split(labels: np.ndarray, num_clients: int, alpha: float, seed: int = 0) -> list[np.ndarray]:
    """Example indices of each client: per label, proportions ~ Dirichlet(alpha) over the clients."""
    if alpha <= 0:
        raise ValueError(f"alpha={alpha} must be > 0 (0.1: mostly one label per client; 100: nearly IID)")
    rng = np.random.default_rng(seed)
    parts: list[list[int]] = [[] for _ in range(num_clients)]
    for lab in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == lab))
        p = rng.dirichlet(np.full(num_clients, alpha))
        cuts = (np.cumsum(p)[:-1] * len(idx)).astype(int)
        for k, chunk in enumerate(np.split(idx, cuts)):
            parts[k].extend(chunk.tolist())
    return [np.sort(np.asarray(p, np.int64)) for p in parts]


def prepare(out: str | Path, langs: tuple[str, ...] = LANGS, locale_root: str | Path = "/usr/share/locale",
            max_per_lang: int = 3000, test_per_mille: int = 150) -> dict:
    """Write `out` (.npz): features and labels of the train and test splits; a summary."""
    max_per_lang = int(smoke.cap(max_per_lang, 500))  # NEBULA_SMOKE: the smallest data set (CI's printed commands)
    corpus = load_corpus(langs, locale_root, max_per_lang)
    split: dict[str, tuple[list[str], list[int]]] = {"train": ([], []), "test": ([], [])}
    for k, lang in enumerate(langs):
        for t in corpus[lang]:
            s = split["test" if _in_test(t, test_per_mille) else "train"]
            s[0].append(t)
            s[1].append(k)
    arrays = {}
    for name, (texts, labels) in split.items():
        ind, ptr = featurize(texts)
        arrays[f"{name}_indices"], arrays[f"{name}_indptr"] = ind, ptr
        arrays[f"{name}_labels"] = np.asarray(labels, np.int64)
    arrays["langs"] = np.asarray(langs)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, **arrays)
    return {"train": len(split["train"][1]), "test": len(split["test"][1]), "langs": list(langs)}


def load_prepared(path: str | Path) -> dict[str, np.ndarray]:
    """The arrays `prepare` wrote."""
    with np.load(path) as z:
        return {k: z[k] for k in z.files}
