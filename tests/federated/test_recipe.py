"""The federated recipe's pieces: real gettext data, the Dirichlet split, and a Paddle client that learns."""
from __future__ import annotations

import numpy as np

from recipes.federated.data import densify, dirichlet_split, featurize, load_corpus


def test_dirichlet_split_partitions_the_examples_and_small_alpha_skews_each_client():
    labels = np.repeat(np.arange(6), 500)
    parts = dirichlet_split(labels, 6, alpha=0.1, seed=0)
    assert sorted(np.concatenate(parts).tolist()) == list(range(len(labels)))
    top = [np.bincount(labels[p], minlength=6).max() / max(len(p), 1) for p in parts if len(p)]
    assert np.mean(top) > 0.6  # mostly one language per client
    iid = dirichlet_split(labels, 6, alpha=100.0, seed=0)
    assert np.mean([np.bincount(labels[p], minlength=6).max() / len(p) for p in iid]) < 0.3


def test_gettext_corpus_and_a_paddle_client_that_learns_language_id(tmp_path):
    from nebula.federated.client import PaddleClient
    from recipes.federated.model import LangIdModel

    corpus = load_corpus(("de", "fr"), max_per_lang=300)
    texts = corpus["de"] + corpus["fr"]
    assert len(corpus["de"]) == 300 and not set(corpus["de"]) & set(corpus["fr"])
    y = np.array([0] * 300 + [1] * 300)
    ind, ptr = featurize(texts)
    x = densify(ind, ptr, np.arange(len(texts)))
    perm = np.random.default_rng(0).permutation(len(y))
    tr, te = perm[:500], perm[500:]
    client = PaddleClient(LangIdModel(num_langs=2, hidden=16), (x[tr], y[tr]), (x[te], y[te]), epochs=2, lr=3e-3)
    start = client.get_parameters({})
    _, _, before = client.evaluate(start, {})
    weights, n, metrics = client.fit(start, {"proximal_mu": 0.01})
    _, _, after = client.evaluate(weights, {})
    assert n == 500 and set(weights) == set(start)
    assert after["accuracy"] > 0.85 and after["accuracy"] > before["accuracy"] + 0.2
