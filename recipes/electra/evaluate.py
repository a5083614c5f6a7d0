"""Downstream checks of a pretrained discriminator: cross-lingual transfer and sentence retrieval, per language.

* Transfer (the paper's XNLI protocol on catalog data): classify which software domain (catalog) a message comes
  from, trained on English messages of the training split only, tested on held-out messages (the evaluation splits,
  never seen in pretraining) in every language. Domains are those translated into every language, ranked by their
  smallest per-language count, so every language is tested on the same classes; English training and every
  language's test set are class-balanced (chance = 1 / domains). Protocols: a **linear probe** on the frozen
  mean-pooled encoder (what pretraining put into the representation), the same probe with each language's mean
  embedding removed (unlabelled test text; separates "which language" from "what it says"), and **full
  fine-tuning** of encoder + head.
  Every number is a mean and standard deviation over fine-tuning seeds (the seed draws the English training
  subsample, the head's initialisation and batch order, and a random encoder's initialisation).
* Retrieval: for every language, embed the held-out sentences and their English originals (mean of the last layer,
  no fine-tuning) and find each sentence's English translation among all of them by cosine similarity (accuracy at
  1, with its binomial standard error); `centred` subtracts each language's mean embedding first.

`python -m recipes.electra.evaluate --data CORPUS --base cross=DIR --base english=DIR --random` compares encoders
(ABNet base directories, as `recipes.electra.prepare export` writes) against randomly initialised ones.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["EvalSet", "load_split", "build_eval_set", "embed_texts", "linear_probe", "finetune_transfer",
           "retrieval", "Embedder", "main"]

Labelled = list[tuple[str, int]]


def load_split(data: Path, split: str) -> list[dict]:
    """Rows {lang, en, text, domain} of one split."""
    return [json.loads(x) for x in (Path(data) / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()]


def _order(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _balanced(items: Labelled, num_labels: int) -> Labelled:
    """The same number of items per label (the rarest label's count), picked in a fixed hash order."""
    by: dict[int, list[str]] = defaultdict(list)
    for t, y in sorted(items, key=lambda it: _order(it[0])):
        by[y].append(t)
    n = min(len(by[y]) for y in range(num_labels))
    return [(t, y) for y in range(num_labels) for t in by[y][:n]]


@dataclass(frozen=True)
class EvalSet:
    """Domains, balanced English training set, balanced test set per language, retrieval pairs per language."""

    labels: list[str]
    train_en: Labelled
    test: dict[str, Labelled]
    pairs: dict[str, list[tuple[str, str]]]


def build_eval_set(train: list[dict], held_out: list[dict], num_domains: int, max_pairs: int = 0) -> EvalSet:
    """Pick `num_domains` domains present in every language of `held_out` and in English training; balance.
    Retrieval keeps at most `max_pairs` pairs per language (0: all), picked in a fixed hash order."""
    langs = sorted({r["lang"] for r in held_out})
    count = Counter((r["domain"], r["lang"]) for r in held_out)
    en_train = {r["en"]: r["domain"] for r in train}
    en_count = Counter(en_train.values())
    ranked = sorted((d for d in en_count if all(count[(d, lang)] for lang in langs)),
                    key=lambda d: (-min(count[(d, lang)] for lang in langs), -en_count[d], d))
    if len(ranked) < num_domains:
        raise ValueError(f"only {len(ranked)} domains have English training messages and held-out messages in every "
                         f"language ({langs}); ask for fewer domains (--domains) or prepare more text")
    labels = ranked[:num_domains]
    train_en = _balanced([(en, labels.index(d)) for en, d in en_train.items() if d in labels], len(labels))
    test: dict[str, Labelled] = {}
    rows = [r for r in held_out if r["domain"] in labels]
    test["en"] = _balanced(list({r["en"]: (r["en"], labels.index(r["domain"])) for r in rows}.values()), len(labels))
    for lang in langs:
        test[lang] = _balanced([(r["text"], labels.index(r["domain"])) for r in rows if r["lang"] == lang],
                               len(labels))
    pairs = {lang: sorted(((r["text"], r["en"]) for r in held_out if r["lang"] == lang),
                          key=lambda p: _order(p[1]))[:max_pairs or None] for lang in langs}
    return EvalSet(labels, train_en, test, pairs)


def _embed(model, ids):
    """Mean of the last layer over real tokens: [B, H]."""
    from recipes.text.tokenizer import PAD_ID
    from recipes.electra.model import encode

    x = encode(model, ids)
    keep = (ids != PAD_ID).astype("float32").unsqueeze(-1)
    return (x * keep).sum(1) / keep.sum(1).clip(min=1.0)


def embed_texts(model, tok, texts: list[str], max_len: int = 32, batch: int = 256) -> np.ndarray:
    """Mean-pooled last-layer embeddings of `texts` (eval mode, no gradients): [N, H]."""
    import paddle

    model.eval()
    out = []
    with paddle.no_grad():
        for i in range(0, len(texts), batch):
            out.append(_embed(model, paddle.to_tensor(tok.batch(texts[i:i + batch], max_len))).numpy())
    return np.concatenate(out) if out else np.zeros((0, model.cfg.hidden), dtype=np.float32)


def _subsample(items: Labelled, seed: int, fraction: float) -> Labelled:
    rng = np.random.default_rng(seed)
    return [items[i] for i in sorted(rng.choice(len(items), max(1, int(len(items) * fraction)), replace=False))]


def linear_probe(x_train: np.ndarray, y_train: np.ndarray, x_test: dict[str, np.ndarray], num_labels: int, *,
                 seed: int = 0, steps: int = 500, lr: float = 0.1, l2: float = 1e-3) -> dict[str, np.ndarray]:
    """Softmax regression on frozen features (standardised by the training features' statistics), full-batch
    Adam; returns the predicted label per test item of every key."""
    mu, sd = x_train.mean(0), x_train.std(0) + 1e-6
    x = (x_train - mu) / sd
    rng = np.random.default_rng(seed)
    w = rng.normal(0, 0.01, (x.shape[1], num_labels))
    b = np.zeros(num_labels)
    onehot = np.eye(num_labels)[y_train]
    m = [np.zeros_like(w), np.zeros_like(b)]
    v = [np.zeros_like(w), np.zeros_like(b)]
    for t in range(1, steps + 1):
        z = x @ w + b
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        g = (p - onehot) / len(x)
        grads = [x.T @ g + l2 * w, g.sum(0)]
        for i, (param, grad) in enumerate(zip((w, b), grads)):
            m[i] = 0.9 * m[i] + 0.1 * grad
            v[i] = 0.999 * v[i] + 0.001 * grad ** 2
            param -= lr * (m[i] / (1 - 0.9 ** t)) / (np.sqrt(v[i] / (1 - 0.999 ** t)) + 1e-8)
    return {k: (((xt - mu) / sd) @ w + b).argmax(1) for k, xt in x_test.items()}


def finetune_transfer(model, tok, train_en: Labelled, test: dict[str, Labelled], num_labels: int, *,
                      steps: int = 300, batch: int = 32, lr: float = 5e-4, seed: int = 0,
                      max_len: int = 32) -> dict[str, float]:
    """Fine-tune encoder + linear head on English items, return accuracy per test key."""
    import paddle
    import paddle.nn.functional as F

    paddle.seed(seed)
    rng = np.random.default_rng(seed)
    x_en = [t for t, _ in train_en]
    y_en = np.array([y for _, y in train_en])
    head = paddle.nn.Linear(model.cfg.hidden, num_labels)
    opt = paddle.optimizer.Adam(learning_rate=lr, parameters=list(model.parameters()) + list(head.parameters()))
    model.train()
    for _ in range(steps):
        pick = rng.integers(0, len(x_en), batch)
        ids = paddle.to_tensor(tok.batch([x_en[i] for i in pick], max_len))
        loss = F.cross_entropy(head(_embed(model, ids)), paddle.to_tensor(y_en[pick]).unsqueeze(-1))
        loss.backward()
        opt.step()
        opt.clear_grad()
    out: dict[str, float] = {}
    with paddle.no_grad():
        for lang, items in test.items():
            emb = embed_texts(model, tok, [t for t, _ in items], max_len)
            pred = head(paddle.to_tensor(emb)).numpy().argmax(1)
            out[lang] = float(np.mean(pred == np.array([y for _, y in items])))
    return out


class Embedder:
    """Mean-pooled embeddings of one encoder, each distinct text computed once."""

    def __init__(self, model, tok, max_len: int = 32) -> None:
        self.model, self.tok, self.max_len = model, tok, max_len
        self.cache: dict[str, np.ndarray] = {}

    def __call__(self, texts: list[str]) -> np.ndarray:
        todo = sorted({t for t in texts if t not in self.cache})
        if todo:
            self.cache.update(zip(todo, embed_texts(self.model, self.tok, todo, self.max_len)))
        return np.stack([self.cache[t] for t in texts]) if texts else np.zeros((0, self.model.cfg.hidden))


def retrieval(embed: Embedder, pairs: dict[str, list[tuple[str, str]]]) -> dict[str, dict[str, float]]:
    """Accuracy at 1 of finding each sentence's English original among that language's originals by cosine:
    {"raw": {lang: acc}, "centred": {lang: acc}} (centred: each language's mean embedding removed first)."""
    out: dict[str, dict[str, float]] = {"raw": {}, "centred": {}}
    for lang, rows in pairs.items():
        a0, b0 = embed([x for x, _ in rows]), embed([en for _, en in rows])
        for kind in out:
            a, b = (a0 - a0.mean(0), b0 - b0.mean(0)) if kind == "centred" else (a0.copy(), b0.copy())
            a /= np.linalg.norm(a, axis=1, keepdims=True) + 1e-9
            b /= np.linalg.norm(b, axis=1, keepdims=True) + 1e-9
            out[kind][lang] = float(np.mean((a @ b.T).argmax(1) == np.arange(len(rows))))
    return out


def _encoder(spec: str, data: Path, preset_name: str, seed: int):
    import paddle

    from recipes.text.bert import BertModel
    from recipes.text.base import load_base
    from recipes.text.tokenizer import Tokenizer
    from recipes.electra.data import read_meta
    from recipes.electra.model import preset

    if spec == "random":
        meta = read_meta(data)
        paddle.seed(seed)
        cfg = preset(preset_name).discriminator.replace(vocab_size=int(meta["vocab_size"]),
                                                        max_positions=meta["max_len"])
        return BertModel(cfg), Tokenizer(Path(data) / "spm.model")
    return load_base(spec)


def evaluate_encoder(spec: str, ev: EvalSet, args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement of one encoder: per seed probe and fine-tune accuracies, retrieval raw and centred (once
    for a pretrained encoder, per seed for a random one, whose initialisation the seed draws)."""
    data, k = Path(args.data), len(ev.labels)
    out: dict[str, Any] = {"probe": [], "probe_centred": [], "finetune": [], "retrieval_raw": {},
                           "retrieval_centred": {}}
    embed = None
    for seed in range(args.seeds):
        if embed is None or spec == "random":
            model, tok = _encoder(spec, data, args.preset, seed)
            embed = Embedder(model, tok, max_len=model.cfg.max_positions)  # the corpus' sequence length
            for kind, vals in retrieval(embed, ev.pairs).items():
                for lang, v in vals.items():
                    out[f"retrieval_{kind}"].setdefault(lang, []).append(v)
        train = _subsample(ev.train_en, seed, args.train_fraction)
        x_tr, y_tr = embed([t for t, _ in train]), np.array([y for _, y in train])
        x_te = {lang: embed([t for t, _ in items]) for lang, items in ev.test.items()}
        for kind, (a, b) in (("probe", (x_tr, x_te)),  # centred: each language's mean (unlabelled) removed
                             ("probe_centred", (x_tr - x_tr.mean(0), {g: x - x.mean(0) for g, x in x_te.items()}))):
            pred = linear_probe(a, y_tr, b, k, seed=seed)
            out[kind].append({lang: float(np.mean(pred[lang] == np.array([y for _, y in ev.test[lang]])))
                              for lang in pred})
        if args.steps > 0:  # a fresh copy of the encoder: fine-tuning changes its weights
            model, tok = _encoder(spec, data, args.preset, seed)
            out["finetune"].append(finetune_transfer(model, tok, train, ev.test, k, steps=args.steps, seed=seed,
                                                     max_len=model.cfg.max_positions))
    return out


def _table(results: dict[str, dict], what: str, langs: list[str], n: dict[str, int]) -> list[str]:
    lines = [f"{'encoder':<14}" + "".join(f"{lang:>13}" for lang in langs) + f"{'mean non-en':>15}"]
    for name, r in results.items():
        runs = r[what]
        if isinstance(runs, list):  # per seed -> per language lists
            runs = {lang: [s[lang] for s in runs] for lang in (runs[0] if runs else {})}
        if not runs:
            continue
        cells, non_en = [], []
        for lang in langs:
            vals = runs.get(lang)
            if not vals:
                cells.append(f"{'-':>13}")
                continue
            m = float(np.mean(vals))
            # spread: sd over seeds, or the binomial standard error for one deterministic measurement
            s = float(np.std(vals, ddof=1)) if len(vals) > 1 else float(np.sqrt(m * (1 - m) / max(n[lang], 1)))
            cells.append(f"{m:>7.3f}±{s:.3f}")
            if lang != "en":
                non_en.append(vals)
        per_seed = np.mean(np.array([v[:min(map(len, non_en))] for v in non_en]), axis=0)
        sd = f"±{np.std(per_seed, ddof=1):.3f}" if len(per_seed) > 1 else ""
        lines.append(f"{name:<14}" + "".join(cells) + f"{np.mean(per_seed):>9.3f}{sd}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Evaluate every encoder given and print per-language tables (and JSON with --out)."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="corpus directory (train/dev/test.jsonl, spm.model, meta.json)")
    ap.add_argument("--base", action="append", default=[], help="NAME=DIR of an exported discriminator")
    ap.add_argument("--random", action="store_true", help="add randomly initialised encoders of --preset")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--domains", type=int, default=4)
    ap.add_argument("--held-out", default="test,dev", help="splits tested on (never seen in pretraining)")
    ap.add_argument("--steps", type=int, default=300, help="full fine-tuning steps (0: linear probe only)")
    ap.add_argument("--seeds", type=int, default=3, help="fine-tuning seeds (mean and standard deviation)")
    ap.add_argument("--train-fraction", type=float, default=0.8, help="English training share drawn per seed")
    ap.add_argument("--pool", type=int, default=500, help="retrieval pairs per language (0: all)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    data = Path(args.data)
    held = [r for s in args.held_out.split(",") for r in load_split(data, s.strip())]
    try:
        ev = build_eval_set(load_split(data, "train"), held, args.domains, args.pool)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    encoders = [tuple(b.split("=", 1)) for b in args.base] + ([("random", "random")] if args.random else [])
    results = {name: evaluate_encoder(spec, ev, args) for name, spec in encoders}
    langs = ["en"] + sorted(ev.pairs)
    n_test = {lang: len(items) for lang, items in ev.test.items()}
    n_pairs = {lang: len(p) for lang, p in ev.pairs.items()}
    print(f"domains: {ev.labels} (chance {1 / len(ev.labels):.2f}); English training {len(ev.train_en)} messages "
          f"(balanced; {args.train_fraction:.0%} drawn per seed), {args.seeds} seeds; held-out splits "
          f"{args.held_out}\ntest messages per language (balanced): {n_test}\nretrieval pool per language: {n_pairs}")
    for what, title, n in (("probe", "transfer: linear probe on the frozen encoder", n_test),
                           ("probe_centred", "transfer: linear probe, each language's mean embedding removed", n_test),
                           ("finetune", f"transfer: full fine-tuning, {args.steps} steps", n_test),
                           ("retrieval_raw", "retrieval accuracy at 1 (x -> en), cosine", n_pairs),
                           ("retrieval_centred", "retrieval accuracy at 1 (x -> en), cosine after centring", n_pairs)):
        if any(r.get(what) for r in results.values()):
            print(f"\n{title} (mean±sd)")
            print("\n".join(_table(results, what, langs if "retrieval" not in what else langs[1:], n)))
    if args.out:
        Path(args.out).write_text(json.dumps({"labels": ev.labels, "n_test": n_test, "n_pairs": n_pairs,
                                              "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
